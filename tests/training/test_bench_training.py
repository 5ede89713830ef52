"""`veritrain bench training`: its formulas, and every figure written by a tiny run (the real figures come
from the full command, docs/BENCHMARKS.md)."""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.torch


def test_ring_allreduce_moves_twice_the_gradient_less_one_share_per_worker_and_step() -> None:
    from apps.bench_training import ring_allreduce_bytes

    # 4 workers, 10 fp32 parameters: each sends 2·(3/4)·40 = 60 bytes per step.
    assert ring_allreduce_bytes(10, 4, 1) == 4 * 60
    assert ring_allreduce_bytes(10, 4, 500) == 500 * 4 * 60
    assert ring_allreduce_bytes(10, 1, 7) == 0


def test_poison_scales_and_flips_the_pseudo_gradient_only() -> None:
    import torch

    from apps.bench_training import POISON_SCALE, poison_scaled_sign_flip

    round_state = {"model.w": torch.tensor([1.0, 2.0]), "outer.momentum.w": torch.zeros(2)}
    result = {"model.w": torch.tensor([0.5, 2.5]), "optim.exp_avg.w": torch.ones(2)}
    poisoned = poison_scaled_sign_flip(round_state, result)
    assert poisoned["model.w"].tolist() == [1.0 + 0.5 * POISON_SCALE, 2.0 - 0.5 * POISON_SCALE]
    assert poisoned["optim.exp_avg.w"] is result["optim.exp_avg.w"]


@pytest.mark.slow
def test_a_tiny_bench_run_writes_every_figure_and_takes_the_market_hook() -> None:
    from apps.bench_training import BenchSize, Progress, measure

    size = BenchSize(
        shards=2,
        inner_steps=2,
        rounds=1,
        robust_shards=4,
        robust_inner_steps=1,
        robust_rounds=1,
        warmup_steps=1,
        eval_batches=1,
        real_recipe="digits-mlp",
        real_shards=2,
        provider_steps=1,
    )
    figures = measure(size, Progress(), {"speedup_m2": lambda: 1.75})
    for key in (
        "loss_gap_vs_ddp",
        "bytes_ratio_vs_ddp",
        "bytes_ratio_vs_ddp_kagg2",
        "robust_loss_gap",
        "robust_loss_gap_mean",
        "outer_step_seconds",
        "aggregate_bytes_per_s",
        "peak_rss_mb",
    ):
        assert math.isfinite(figures[key]), key
    assert figures["speedup_m2"] == 1.75
    # DDP is tuned over its lr scales and the best one counts (never a handicapped baseline)
    assert set(figures["loss_ddp_by_lr_scale"]) == {"1.0", "2.0"}
    assert figures["loss_ddp"] == min(figures["loss_ddp_by_lr_scale"].values())
    # One round through libp2p: 2 results (weights + 2 moments) and 2 fetches of the new round state.
    parameters = figures["loss_model"]["parameters"]
    assert 2 * 12 * parameters + 2 * 8 * parameters < figures["diloco_round_bytes"] < 41 * parameters
    assert figures["bytes_ratio_vs_ddp_kagg2"] < figures["bytes_ratio_vs_ddp"]
    assert 0 < figures["peak_rss_mb"] < figures["peak_rss_target_mb"]


@pytest.mark.slow
def test_loss_only_stops_after_the_loss_and_bytes_figures() -> None:
    from apps.bench_training import QUICK, Progress, measure

    figures = measure(QUICK, Progress(), loss_only=True)
    assert math.isfinite(figures["loss_gap_vs_ddp"]) and figures["bytes_ratio_vs_ddp"] > 0
    assert "robust_loss_gap" not in figures and "peak_rss_mb" not in figures
    assert figures["sizes"]["outer_lr"] == QUICK.outer_lr
