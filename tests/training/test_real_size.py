"""The real-size recipe (charlm-25m) on the whole standard-library tree, portable initial weights, and
devices: probing, refusal before a unit starts, deterministic settings (no GPU needed: pure logic)."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.torch

REAL = "charlm-25m"


@pytest.fixture(scope="module")
def tree_dataset() -> Any:
    from veritrain.datasets import load_dataset

    return load_dataset("python-stdlib-tree")


def test_real_recipe_size_flops_and_memory_follow_the_architecture() -> None:
    from veritrain.recipes import TransformerConfig, get_recipe

    recipe = get_recipe(REAL)
    config = recipe.model
    assert isinstance(config, TransformerConfig) and config.seq_len >= 256
    d, ff, vocab = config.d_model, config.d_ff, config.vocab_size
    per_block = 4 * d * d + 2 * d * ff + ff + 3 * d
    expected = 2 * vocab * d + config.seq_len * d + config.n_layers * per_block + d
    assert recipe.param_count() == expected == 25_588_224
    assert recipe.flops_per_step() == 6 * expected * recipe.batch_size * config.seq_len
    memory = recipe.memory_estimate()
    assert memory.weights == memory.gradients == 4 * expected and memory.optimizer == 8 * expected
    assert memory.state == 12 * expected
    assert 0 < memory.activations < memory.total == memory.state + memory.gradients + memory.activations


def test_stdlib_tree_corpus_is_a_deterministic_blob_fetchable_by_digest(tree_dataset: Any) -> None:
    from veritrain.datasets import STDLIB_TREE_CAP, dataset_blob, load_dataset
    from veritrain.errors import DatasetMismatch

    blob = dataset_blob("python-stdlib-tree")
    assert hashlib.sha256(blob).digest() == tree_dataset.digest
    assert 4 * 2**20 < len(blob) <= STDLIB_TREE_CAP
    assert b"# file: asyncio/" in blob
    assert b"# file: test/" not in blob and b"# file: site-packages/" not in blob
    assert tree_dataset.tensors["tokens"].dtype.itemsize == 1  # bytes, widened per batch only
    # Another Python's tree: a different digest that no local file gives, fetched from a peer instead.
    other_blob = b"# file: other.py\n" + blob[:100_000]
    other_digest = hashlib.sha256(other_blob).digest()
    with pytest.raises(DatasetMismatch):
        load_dataset("python-stdlib-tree", other_digest)
    with pytest.raises(DatasetMismatch):
        load_dataset("python-stdlib-tree", other_digest, fetch=lambda digest: other_blob + b"x")
    fetched = load_dataset("python-stdlib-tree", other_digest, fetch=lambda digest: other_blob)
    assert fetched.digest == other_digest and len(fetched) == len(other_blob)


def test_portable_init_has_the_intended_distribution_and_ignores_the_global_rng() -> None:
    import torch

    from veritrain.recipes import portable_normal

    before = torch.random.get_rng_state()
    values = portable_normal("any", 3, "w", 200_000, 0.02)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert values.dtype == torch.float32
    assert abs(float(values.mean())) < 2e-4 and math.isclose(float(values.std()), 0.02, rel_tol=0.01)
    assert torch.equal(values, portable_normal("any", 3, "w", 200_000, 0.02))
    assert not torch.equal(values, portable_normal("any", 3, "v", 200_000, 0.02))
    assert not torch.equal(values, portable_normal("any", 4, "w", 200_000, 0.02))


def test_real_recipe_trains_a_step_and_a_verifier_replays_it_bitwise(
    tmp_path: Path, tree_dataset: Any
) -> None:
    from node.unit import load_checkpoint, reexecutor, run_unit
    from veritrain import pol

    # One step (≈ 5 s on one CPU thread) trained by a provider and replayed by a verifier: CI time is dear.
    spec = pol.UnitSpec(recipe=REAL, order_seed=1, round_index=0, shard=0, steps=1, checkpoint_every=1)
    start = pol.initial_state(spec.recipe_config(), 0)
    result = run_unit(spec, start, tmp_path, dataset=tree_dataset)
    assert abs(result.transcript.losses[0] - math.log(256)) < 1.0  # a fresh byte model: ≈ uniform (6.02)
    replayed, losses = reexecutor(spec, tree_dataset)(load_checkpoint(result.checkpoint_paths[0]), 0, 1)
    assert pol.state_digest(replayed) == result.transcript.final_digest != pol.state_digest(start)
    assert tuple(losses) == result.transcript.losses


# ---------------------------------------------------------------- devices


def test_execution_refuses_unknown_devices_and_thread_counts() -> None:
    from veritrain.device import Execution
    from veritrain.errors import InvalidInput

    assert Execution("cuda:1").kind == "cuda"
    for device in ("gpu", "cuda:", "cuda:x", "tpu", ""):
        with pytest.raises(InvalidInput):
            Execution(device)
    with pytest.raises(InvalidInput):
        Execution("cpu", threads=0)


def test_hardware_class_keys_name_what_changes_the_bits() -> None:
    import torch

    from veritrain.device import Execution, HardwareClass, cpu_vendor, hardware_class_of

    cpu = hardware_class_of(Execution(threads=2))
    assert cpu.kind == "cpu" and cpu.threads == 2 and cpu.cpu_vendor == cpu_vendor()
    key = cpu.key()
    assert key.startswith(f"cpu/{cpu.cpu_vendor}/{cpu.vector_path}/t2/") and torch.__version__ in key
    gpu = HardwareClass(
        kind="cuda",
        torch_version="2.13.0",
        gpu_name="NVIDIA H100 80GB HBM3",
        compute_capability="90",
        sm_count=132,
        cuda_version="12.8",
        cublas_version="12.8.4.1",
    )
    assert gpu.key() == "cuda/NVIDIA H100 80GB HBM3/sm90/132sm/cuda12.8/cublas12.8.4.1/torch2.13.0/fp32"
    other_sm = HardwareClass(**{**gpu.as_dict(), "sm_count": 114})
    assert other_sm.key() != gpu.key() and len(gpu.key()) <= 128


def test_a_device_without_enough_memory_is_refused_before_the_unit_writes_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, digits_dataset: Any
) -> None:
    from node.unit import run_unit
    from veritrain import device as device_module
    from veritrain import pol
    from veritrain.errors import DeviceUnsuitable
    from veritrain.recipes import get_recipe

    probe = device_module.probe(device_module.Execution())
    needed = get_recipe(REAL).memory_estimate().total
    small = device_module.DeviceProbe(probe.execution, probe.hardware_class, needed - 1)
    with pytest.raises(DeviceUnsuitable, match=r"charlm-25m needs about \d+ MiB"):
        device_module.check_can_run(get_recipe(REAL), small)
    device_module.check_can_run(
        get_recipe(REAL), device_module.DeviceProbe(probe.execution, probe.hardware_class, needed)
    )

    monkeypatch.setattr(device_module, "available_memory_bytes", lambda device="cpu": 1024)
    spec = pol.UnitSpec(
        recipe="digits-mlp", order_seed=0, round_index=0, shard=0, steps=2, checkpoint_every=1
    )
    with pytest.raises(DeviceUnsuitable):
        run_unit(spec, pol.initial_state(spec.recipe_config(), 0), tmp_path / "work", dataset=digits_dataset)
    assert not (tmp_path / "work").exists()


def test_a_missing_gpu_is_a_clear_refusal_not_a_crash_mid_unit(tmp_path: Path, digits_dataset: Any) -> None:
    import torch

    from node.unit import reexecutor, run_unit
    from veritrain import pol
    from veritrain.device import Execution
    from veritrain.errors import DeviceUnavailable

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    spec = pol.UnitSpec(
        recipe="digits-mlp", order_seed=0, round_index=0, shard=0, steps=2, checkpoint_every=1
    )
    start = pol.initial_state(spec.recipe_config(), 0)
    with pytest.raises(DeviceUnavailable, match="no CUDA device"):
        run_unit(spec, start, tmp_path / "work", dataset=digits_dataset, execution=Execution("cuda:0"))
    with pytest.raises(DeviceUnavailable):
        reexecutor(spec, digits_dataset, Execution("cuda"))
    assert not (tmp_path / "work").exists()


def test_deterministic_settings_are_restored_after_the_block() -> None:
    import torch

    from veritrain.device import Execution, deterministic

    before = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled())
    with deterministic(Execution(threads=2)) as device:
        assert device == torch.device("cpu") and torch.get_num_threads() == 2
    assert (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()) == before
