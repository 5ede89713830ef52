"""The chaos smoke (issue 11): seeded process faults against short orders through the whole marketplace.

A few runs of `veritrain bench chaos` on one marketplace (hardhat node, market API, Celery worker on Redis,
three providers and a verifier as processes): each run's order must complete or be refunded with every
money check of apps.demo_report holding, no unit paid twice, nothing left in escrow or locked, nobody
slashed and at most one unit of work lost per fault. The runs are as many as fit CI's 4 min on a 2-core
machine; `veritrain bench chaos --runs N` runs more.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from needs import require

from apps.chaos import fault_schedule, run_chaos
from apps.demo import progress_printer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.node_backend,
    pytest.mark.torch,
    pytest.mark.redis,
    pytest.mark.timeout(420),
]

# The issue asks for 10 runs; 10 took 292 s here before crashes were added (2-core AMD EPYC), over CI's
# 4 min; these 7 took 190 s (marketplace start ~15 s, runs 9-61 s, one crash; docs/BENCHMARKS.md).
SMOKE_RUNS = 7
SMOKE_SEED = 1100


def test_seeded_faults_lose_no_order_and_pay_nobody_twice(tmp_path: Path) -> None:
    require(
        None if shutil.which("redis-server") else "no redis-server on the PATH",
        "the smoke runs its own Redis to kill it: apt install redis-server",
    )
    summary = run_chaos(SMOKE_RUNS, SMOKE_SEED, tmp_path, "redis", progress_printer())
    print(json.dumps({k: v for k, v in summary.items() if k != "records"}, sort_keys=True))

    records = summary["records"]
    assert summary["runs"] == len(records) == SMOKE_RUNS
    assert [r["seed"] for r in records] == list(range(SMOKE_SEED, SMOKE_SEED + SMOKE_RUNS))
    for record in records:
        assert record["schedule"] == [vars(f) for f in fault_schedule(record["seed"], redis=True)]
        assert record["outcome"] in ("completed", "refunded"), record
        assert record["failed_checks"] == [], record
    assert summary["faults_injected"] > 0  # the smoke did inject faults (not every order outlived them)
    assert summary["lost_orders"] == 0
    assert summary["double_payments"] == 0
    assert summary["stuck_escrow"] == 0
    assert summary["false_slashes"] == 0
    assert summary["max_lost_units_per_fault"] <= 1
