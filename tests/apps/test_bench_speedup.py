"""`veritrain bench speedup`: the JSON it writes, the orders it times and how it splits their time. The
orders themselves are stubbed here (the real run starts two marketplaces; docs/BENCHMARKS.md has it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from apps import bench_speedup
from apps.cli import main
from apps.demo import DemoConfig
from veritrain.errors import InvalidInput


def test_cli_writes_the_ratio_of_the_two_orders_each_with_a_fair_share_of_the_cores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    timed: list[DemoConfig] = []

    def fake_order(config: DemoConfig, emit: Any) -> dict[str, Any]:
        timed.append(config)
        return {"wall_s": {1: 90.0, 2: 60.0}[config.shards], "phases_s": {}}

    monkeypatch.setattr(bench_speedup, "time_order", fake_order)
    out = tmp_path / "speedup.json"
    assert main(["bench", "speedup", "--json", str(out), "--total-steps", "120", "--unit-steps", "30"]) == 0

    figures = json.loads(out.read_text())
    assert figures["speedup_m2"] == pytest.approx(1.5)
    assert figures["speedup_m2_target"] == 1.6
    assert set(figures["runs"]) == {"m1", "m2"} and figures["machine"]
    assert all(len(run["load_average_1min"]) == 2 for run in figures["runs"].values())
    m1, m2 = timed
    # Same total steps in units of the same size; both cores busy in each run, never oversubscribed.
    assert (m1.shards, m1.rounds, m2.shards, m2.rounds) == (1, 4, 2, 2)
    assert m1.unit_steps == m2.unit_steps == 30 and m1.replicas == m2.replicas == 1
    for config in timed:
        threads = [int(env["OMP_NUM_THREADS"]) for env in config.provider_env]
        assert len(threads) == config.providers == config.shards and sum(threads) == bench_speedup.CORES
        assert config.dishonest == 0


@pytest.mark.parametrize(("total", "unit"), [(100, 30), (40, 40), (0, 10), (10, 0)])
def test_sizes_that_cannot_split_evenly_are_refused_before_anything_starts(
    total: int, unit: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench_speedup, "time_order", lambda *_: pytest.fail("an order was started"))
    with pytest.raises(InvalidInput):
        bench_speedup.measure_speedup(tmp_path, total_steps=total, unit_steps=unit)


def _status(*units: tuple[str, str]) -> dict[str, Any]:
    return {"units": [{"unit_id": i, "kind": kind, "state": state} for i, (kind, state) in enumerate(units)]}


def test_every_interval_is_charged_to_the_phase_the_order_was_in(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([3.0, 13.0, 14.0, 20.0, 21.5])
    monkeypatch.setattr(bench_speedup.time, "monotonic", lambda: next(clock))
    timeline = bench_speedup.Timeline(began=0.0)
    timeline.tick(_status(("train", "committing"), ("train", "pending")))  # t=3: posting, matching
    timeline.tick(_status(("train", "committing"), ("train", "revealing")))  # t=13: still training
    timeline.tick(_status(("train", "accepted"), ("train", "verifying"), ("aggregate", "committing")))
    timeline.tick(_status(("train", "accepted"), ("train", "accepted"), ("aggregate", "revealing")))
    timeline.tick(_status(("train", "accepted"), ("train", "accepted"), ("aggregate", "accepted")))
    assert timeline.phases_s == {"market_and_chain": 3.0 + 1.5, "training": 10.0 + 1.0, "aggregate": 6.0}
    assert sum(timeline.phases_s.values()) == 21.5
    assert timeline.spot_checked == {1}


def test_training_seconds_come_from_each_units_last_step_line() -> None:
    log = (
        "unit 4: step 10/40 loss 3.1000 (2.5s)\n"
        "unit 4: step 40/40 loss 2.9000 (9.75s)\n"
        "unit 6: step 20/40 loss 3.0000 (5.0s)\n"  # killed before its last step: not counted
    )
    assert bench_speedup.unit_train_seconds([log, "unit 9: step 8/8 loss 1.0 (1.0s)"]) == {4: 9.75, 9: 1.0}


@pytest.mark.parametrize("flag", [[], ["--speedup"]])
def test_bench_training_measures_speedup_m2_only_when_asked(
    flag: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from apps import bench_training

    def fake_measure(size: Any, progress: Any, extra: Any = None, **options: Any) -> dict[str, Any]:
        figures: dict[str, Any] = dict.fromkeys(
            ("loss_gap_vs_ddp", "bytes_ratio_vs_ddp", "robust_loss_gap", "peak_rss_mb"), 0.5
        )
        figures["speedup_m2"] = None
        figures.update({name: figure() for name, figure in (extra or {}).items()})
        return figures

    monkeypatch.setattr(bench_training, "measure", fake_measure)
    monkeypatch.setattr(bench_speedup, "speedup_m2", lambda: 1.25)
    out = tmp_path / "training.json"
    assert main(["bench", "training", "--quick", "--json", str(out), *flag]) == 0
    assert json.loads(out.read_text())["speedup_m2"] == (1.25 if flag else None)
