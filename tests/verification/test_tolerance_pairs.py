"""Tolerance tables keyed by recipe and pair of hardware classes; the CPU table is the stated fallback."""

from __future__ import annotations

from pathlib import Path

import pytest

from verifier.calibrate import ANY_CPU, class_pair_key, load_tolerances, write_tolerances
from verifier.core import Distance, SegmentTolerance, ToleranceTable
from veritrain.errors import ToleranceUnavailable

CPU_A = "cpu/amd/avx512/t1/torch2.13.0+cpu/fp32"
CPU_B = "cpu/intel/avx2/t8/torch2.13.0+cpu/fp32"
H100 = "cuda/NVIDIA H100 80GB HBM3/sm90/132sm/cuda12.8/cublas12.8.4.1/torch2.13.0/fp32"
A100 = "cuda/NVIDIA A100-SXM4-40GB/sm80/108sm/cuda12.8/cublas12.8.4.1/torch2.13.0/fp32"


def table(scale: float) -> ToleranceTable:
    tolerance = SegmentTolerance(groups={"model": Distance(scale, scale, scale)}, loss_abs=scale)
    return ToleranceTable(recipe="digits-mlp", margin=30.0, by_steps={1: tolerance})


def test_cpu_pairs_use_the_fallback_and_gpu_pairs_need_their_own_calibration(tmp_path: Path) -> None:
    path = tmp_path / "tolerances.json"
    write_tolerances(path, {"digits-mlp": table(1e-6)}, 30.0, "test machine")
    for classes in (None, (CPU_A, CPU_B), (CPU_B, CPU_B)):
        assert load_tolerances("digits-mlp", path, classes) == table(1e-6)
    with pytest.raises(ToleranceUnavailable, match="--device"):
        load_tolerances("digits-mlp", path, (H100, CPU_A))

    write_tolerances(
        path, {}, 30.0, "gpu machine", {"digits-mlp": {class_pair_key(H100, ANY_CPU): table(1e-4)}}
    )
    assert load_tolerances("digits-mlp", path, (CPU_A, CPU_B)) == table(1e-6)  # kept by the merge
    assert load_tolerances("digits-mlp", path, (H100, CPU_A)) == table(1e-4)
    assert load_tolerances("digits-mlp", path, (CPU_B, H100)) == table(1e-4)
    assert load_tolerances("digits-mlp", path, (H100, H100)) == table(1e-4)
    with pytest.raises(ToleranceUnavailable):
        load_tolerances("digits-mlp", path, (H100, A100))  # never calibrated against each other

    write_tolerances(path, {}, 30.0, "gpu machine", {"digits-mlp": {class_pair_key(A100, H100): table(3e-4)}})
    assert load_tolerances("digits-mlp", path, (H100, A100)) == table(3e-4)
    assert load_tolerances("digits-mlp", path, (H100, CPU_A)) == table(1e-4)


def test_the_committed_file_has_a_cpu_table_for_every_calibrated_recipe() -> None:
    for recipe in ("charlm-tiny", "digits-mlp"):
        assert load_tolerances(recipe, classes=(CPU_A, CPU_B)).for_steps(8).groups["model"].rel_l2 > 0
