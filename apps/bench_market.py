"""`veritrain bench market --json FILE`: matching throughput and latency at marketplace scale, and the
orchestration overhead of the whole stack.

The matching figures come from :mod:`market.bench` (``matches_per_s``, ``match_p99_ms`` and the rest,
defined there). ``orchestration_overhead_ratio``: wall time of a verified k = 1 order through the market
divided by the same training run directly (:func:`measure_orchestration_overhead`; ``--skip-overhead``
leaves it null for quick runs). Why here and not in `market/`: the overhead run starts every role.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from market.bench import run_benchmark


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, required=True, help="write the results here")
    parser.add_argument("--providers", type=int, default=10_000)
    parser.add_argument("--orders", type=int, default=1_000)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--database-url", help="database to use (default: a fresh SQLite file in a temp dir)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--skip-overhead",
        action="store_true",
        help="skip the orchestration overhead run (it starts the whole stack and takes about 3.5 minutes)",
    )


def measure_orchestration_overhead(target_direct_s: float = 60.0) -> dict[str, float]:
    """Wall time of a verified k = 1 order through the market ÷ the same training run done directly.

    Runs :func:`apps.demo.measure_orchestration_overhead` (chain, market, worker, one provider and
    one verifier as processes; about 3.5 minutes) in a temporary folder; returns its figures.
    """
    from apps.demo import measure_orchestration_overhead as measure

    with tempfile.TemporaryDirectory(prefix="veritrain-bench-overhead-") as tmp:
        return measure(Path(tmp), target_direct_s=target_direct_s)


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="veritrain-bench-market-") as tmp:
        url = args.database_url or f"sqlite:///{Path(tmp) / 'bench.sqlite3'}"
        results = run_benchmark(url, args.providers, args.orders, args.replicas, args.seed)
    overhead = None if args.skip_overhead else measure_orchestration_overhead()
    output = {
        "matches_per_s": results.pop("matches_per_s"),
        "match_p99_ms": results.pop("match_p99_ms"),
        "orchestration_overhead_ratio": overhead["orchestration_overhead_ratio"] if overhead else None,
        "orchestration_overhead_note": (
            "not measured (--skip-overhead)"
            if overhead is None
            else f"verified k = 1 order through the market ({overhead['market_s']:.1f} s) / the same "
            f"{overhead['steps']:.0f}-step training run directly ({overhead['direct_s']:.1f} s, mean of "
            f"{overhead['direct_before_s']:.1f} s before and {overhead['direct_after_s']:.1f} s after)"
        ),
        "providers": args.providers,
        "open_orders": args.orders,
        "replicas": args.replicas,
        "database": (args.database_url or "sqlite (temporary file)").split("://")[0],
        **results,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(output, indent=2) + "\n")
    print(json.dumps(output, indent=2))
    return 0
