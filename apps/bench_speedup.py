"""`veritrain bench speedup --json FILE`: ``speedup_m2``, the wall time of a k = 1 order through the
market with M = 1 over the same order with M = 2 shards and the same total steps (issue 7 item 9).

Each run is the demo's machinery (:mod:`apps.demo`): a hardhat node, the market API and worker, M provider
agents and one verifier agent as processes; only the order is timed, from posting until the market reports
it completed (the stack's start-up is not). Both runs train the same number of steps in units of the same
size H: M = 1 runs R·2 rounds of one unit, M = 2 runs R rounds of two shard units and an aggregate unit.
The machine's cores are shared fairly: each of the M providers gets ``cores // M`` torch threads (M = 1:
one provider with 2 threads; M = 2: two providers with 1 thread each); the verifier, market and chain
get 1 thread and mostly idle.

Where the time went (``phases_s``, summing to the wall time, from the order's status polled every 0.5 s):
``training`` while a training unit is assigned and not yet committed (start-state fetch, training,
commit), ``aggregate`` while only an aggregate unit is, ``market_and_chain`` otherwise (matching, accept
signatures, the assign transaction, reveal, finalize or spot-check verdict). ``train_compute_s`` is the
training the providers' logs report, per round the slowest shard (the round's critical path).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from apps.demo import Buyer, DemoConfig, Marketplace, marketplace, progress_printer, start_stack
from veritrain.errors import InvalidInput

CORES = 2  # the machine the figure is for (issue 7: "on this 2-core machine")
UNIT_STEPS = 400  # H, as in `bench training`: training, not settlement, should dominate a round
TOTAL_STEPS = 1600  # 4 rounds at M = 1, as the demo; 2 rounds of 2 shards at M = 2
STEP_LINE = re.compile(r"unit (\d+): step (\d+)/(\d+) loss \S+ \(([\d.]+)s\)")


def speedup_config(
    out_dir: Path, shards: int, total_steps: int, unit_steps: int, timeout_s: float
) -> DemoConfig:
    """The order of one run: M honest providers with cores // M threads each, one verifier, k = 1."""
    threads = str(max(1, CORES // shards))
    return DemoConfig(
        out_dir=out_dir / f"m{shards}",
        providers=shards,
        dishonest=0,
        verifiers=1,
        replicas=1,
        shards=shards,
        # an aggregate unit per round, as measured in docs/BENCHMARKS.md (`phase_of` times its "aggregate")
        outer_step="unit",
        rounds=total_steps // (shards * unit_steps),
        unit_steps=unit_steps,
        provider_env=({"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads},) * shards,
        commit_window_s=int(timeout_s),
        verdict_window_s=int(timeout_s),
        timeout_s=timeout_s,
    )


def phase_of(status: dict[str, Any]) -> str:
    """What the order is waiting on: training beats aggregation beats the market and the chain."""
    committing = {unit["kind"] for unit in status["units"] if unit["state"] == "committing"}
    if "train" in committing:
        return "training"
    return "aggregate" if "aggregate" in committing else "market_and_chain"


class Timeline:
    """Seconds per phase of the order, each interval between two polls charged to the earlier poll's phase."""

    def __init__(self, began: float) -> None:
        self.last = began
        self.phase = "market_and_chain"  # posting on chain and registering with the market
        self.phases_s = {"training": 0.0, "aggregate": 0.0, "market_and_chain": 0.0}
        self.spot_checked: set[int] = set()

    def tick(self, status: dict[str, Any]) -> None:
        now = time.monotonic()
        self.phases_s[self.phase] += now - self.last
        self.last, self.phase = now, phase_of(status)
        self.spot_checked |= {unit["unit_id"] for unit in status["units"] if unit["state"] == "verifying"}


def unit_train_seconds(logs: list[str]) -> dict[int, float]:
    """Training seconds of each unit a provider finished, from its log's last step line."""
    seconds = {}
    for log in logs:
        for unit, step, total, elapsed in STEP_LINE.findall(log):
            if step == total:
                seconds[int(unit)] = float(elapsed)
    return seconds


def time_order(config: DemoConfig, emit: Callable[[str], None]) -> dict[str, Any]:
    """Start the stack (untimed), then time one order from posting until the market reports it completed."""
    with marketplace(config, emit) as market:
        start_stack(market)
        buyer = Buyer(market)
        began = time.monotonic()
        timeline = Timeline(began)
        buyer.post_order()
        buyer.wait_completed(began + config.timeout_s, on_tick=timeline.tick)
        wall_s = time.monotonic() - began
        status = buyer.status()
        return summarise(market, config, status, timeline, wall_s)


def summarise(
    market: Marketplace, config: DemoConfig, status: dict[str, Any], timeline: Timeline, wall_s: float
) -> dict[str, Any]:
    """One run's figures: wall time, its phases, the training critical path and who trained what."""
    names = {party.address: party.name for party in market.providers()}
    trained = unit_train_seconds([market.procs[name].log_path.read_text() for name in names.values()])
    train_units = [u for u in status["units"] if u["kind"] == "train" and u["state"] == "accepted"]
    critical = [
        max(trained.get(u["unit_id"], 0.0) for u in train_units if u["round_index"] == r)
        for r in range(config.rounds)
    ]
    return {
        "shards": config.shards,
        "rounds": config.rounds,
        "unit_steps": config.unit_steps,
        "total_steps": config.rounds * config.shards * config.unit_steps,
        "threads_per_provider": int(config.provider_env[0]["OMP_NUM_THREADS"]),
        "wall_s": round(wall_s, 2),
        "phases_s": {name: round(seconds, 2) for name, seconds in timeline.phases_s.items()},
        "train_compute_s": round(sum(critical), 2),
        "units": len(status["units"]),
        "spot_checked_units": len(timeline.spot_checked),
        "trained_by": {str(u["unit_id"]): [names.get(p, p) for p in u["providers"]] for u in train_units},
    }


def measure_speedup(
    work_dir: Path,
    total_steps: int = TOTAL_STEPS,
    unit_steps: int = UNIT_STEPS,
    timeout_s: float = 1200.0,
    emit: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """``speedup_m2`` = wall(M = 1) / wall(M = 2), with both runs' breakdowns and the machine's state."""
    say = emit or progress_printer()
    if unit_steps < 1 or total_steps < 2 * unit_steps or total_steps % (2 * unit_steps):
        raise InvalidInput(f"total steps {total_steps} must be a multiple of 2 x unit steps {unit_steps}")
    runs = {}
    for shards in (1, 2):
        load_before = os.getloadavg()[0]
        run = time_order(speedup_config(work_dir, shards, total_steps, unit_steps, timeout_s), say)
        run["load_average_1min"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
        say(f"speedup: M = {shards}: {run['wall_s']:.1f} s, phases {run['phases_s']}")
        runs[f"m{shards}"] = run
    return {
        "speedup_m2": runs["m1"]["wall_s"] / runs["m2"]["wall_s"],
        "speedup_m2_target": 1.6,
        "runs": runs,
        "machine": machine(),
    }


def machine() -> str:
    """The lscpu model name and core count the figure was measured on."""
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    model = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if "Model name" in line), "?")
    return f"{model}, {os.cpu_count()} cores"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, required=True, help="write the figures here")
    parser.add_argument("--total-steps", type=int, default=TOTAL_STEPS, help="steps of each order")
    parser.add_argument("--unit-steps", type=int, default=UNIT_STEPS, help="H: steps of one unit")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds one order may take")


def measure_in_temp_dir(**sizes: Any) -> dict[str, Any]:
    """:func:`measure_speedup` with every run's folder (logs, blobs, chain) deleted afterwards."""
    with tempfile.TemporaryDirectory(prefix="veritrain-bench-speedup-") as tmp:
        return measure_speedup(Path(tmp), **sizes)


def speedup_m2() -> float:
    """The figure alone, for `veritrain bench training --speedup` (breakdown: `veritrain bench speedup`)."""
    return float(measure_in_temp_dir()["speedup_m2"])


def run(args: argparse.Namespace) -> int:
    figures = measure_in_temp_dir(
        total_steps=args.total_steps, unit_steps=args.unit_steps, timeout_s=args.timeout
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    print(json.dumps({"speedup_m2": figures["speedup_m2"]}))
    return 0
