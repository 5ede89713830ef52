"""The soak (issue 11 item 3): the fuzzers CI runs short, at full effort, with a JSON and markdown summary.

Phases, each in its own processes, one after the other:
- decoder, codec: atheris via `python -m veritrain.p2p.fuzz soak` (RSS capped by libFuzzer);
- api: schemathesis over every market API operation, then call sequences along the inferred links
  (tests/market/test_openapi_fuzz.py at the efforts given here);
- invariants: the Hypothesis contract state machine (tests/chain/test_invariants.py), split into shards
  that run in parallel, each with its own seed and its share of the examples.

The exit status is 1 when any phase crashed, saw a 5xx or a schema violation, tripped an invariant or did
less than asked. Run through `scripts/soak`; `--only` picks phases, the rest of the flags set the efforts.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PYTHON = str(ROOT / ".venv" / "bin" / "python")
PHASES = ("decoder", "codec", "api", "invariants")


def _fuzz(target: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    report_file = out / f"{target}.json"
    command = [PYTHON, "-m", "veritrain.p2p.fuzz", "soak", "--target", target, "--runs", str(args.fuzz_runs)]
    command += ["--rss-limit-mb", str(args.rss_limit_mb), "--json", str(report_file)]
    started = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, check=False)
    report = json.loads(report_file.read_text()) if report_file.exists() else {}
    executions = int(report.get("executions", 0))
    return {
        "phase": target,
        "command": " ".join(command[1:-2]),
        "effort": f"{args.fuzz_runs} executions, RSS cap {args.rss_limit_mb} MiB",
        "executions": executions,
        "failures": int(report.get("crashes", 1)),
        "peak_rss_mib": report.get("peak_rss_mib"),
        "wall_s": round(time.monotonic() - started, 1),
        "ok": done.returncode == 0 and executions >= args.fuzz_runs,
    }


def _pytest(
    node: str, env: dict[str, str], junit: Path, log: Path
) -> tuple[subprocess.Popen[bytes], list[str]]:
    """Start one pytest run (no per-test timeout: a soak test runs for as long as its effort takes)."""
    command = [PYTHON, "-m", "pytest", node, "-q", "-s", "-p", "no:cacheprovider", "-o", "timeout=0"]
    command += ["--hypothesis-show-statistics", f"--junitxml={junit}"]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, **env}, stdout=sink, stderr=sink)
    return process, command


def _junit_counts(junit: Path) -> tuple[int, int]:
    """(tests run, tests failed or errored) from a junit file; a missing file counts as one failure."""
    if not junit.exists():
        return 0, 1
    suite = ET.parse(junit).getroot().iter("testsuite")
    tests = failed = 0
    for element in suite:
        tests += int(element.get("tests", 0))
        failed += int(element.get("failures", 0)) + int(element.get("errors", 0))
    return tests, failed


def _api(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    env = {
        "VERITRAIN_FUZZ_EXAMPLES": str(args.api_examples),
        "VERITRAIN_FUZZ_STATEFUL_EXAMPLES": str(args.stateful_examples),
        "VERITRAIN_FUZZ_STATEFUL_STEPS": str(args.stateful_steps),
    }
    started = time.monotonic()
    log = out / "api.log"
    process, command = _pytest("tests/market/test_openapi_fuzz.py", env, out / "api.xml", log)
    process.wait()
    tests, failed = _junit_counts(out / "api.xml")
    text = log.read_text(errors="replace")
    sys.stdout.write(text[-3000:])
    # Generated cases of the per-operation test (the linked sequences add theirs uncounted).
    cases = sum(int(a) + int(b) for a, b in re.findall(r"(\d+) passing, (\d+) failing", text))
    return {
        "phase": "api",
        "command": " ".join(f"{k}={v}" for k, v in env.items()) + " pytest " + command[3],
        "effort": (
            f"{args.api_examples} examples per operation; {args.stateful_examples} linked sequences of up "
            f"to {args.stateful_steps} calls"
        ),
        "executions": cases,
        "failures": failed,
        "wall_s": round(time.monotonic() - started, 1),
        "ok": process.returncode == 0 and failed == 0 and tests > 0,
    }


def _invariants(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    per_shard = math.ceil(args.invariant_examples / args.shards)
    started = time.monotonic()
    runs = []
    for shard in range(args.shards):
        env = {
            "VERITRAIN_INVARIANT_EXAMPLES": str(per_shard),
            "VERITRAIN_INVARIANT_STEPS": str(args.invariant_steps),
            "VERITRAIN_INVARIANT_SEED": str(args.seed + shard),
        }
        junit, log = out / f"invariants-{shard}.xml", out / f"invariants-{shard}.log"
        node = "tests/chain/test_invariants.py::test_market_invariants_hold"
        process, command = _pytest(node, env, junit, log)
        runs.append((process, junit, log))
    calls = failed = violations = 0
    for process, junit, log in runs:
        process.wait()
        text = log.read_text(errors="replace")
        found = re.search(r"(\d+) contract calls in", text)
        calls += int(found.group(1)) if found else 0
        violations += "InvariantViolation" in text  # the rest of a failure: an idle run, a harness error
        tests, shard_failed = _junit_counts(junit)
        failed += shard_failed + (1 if process.returncode or not tests else 0)
        sys.stdout.write(text[-2000:])
    return {
        "phase": "invariants",
        "command": (
            f"VERITRAIN_INVARIANT_EXAMPLES={per_shard} VERITRAIN_INVARIANT_STEPS={args.invariant_steps} "
            f"VERITRAIN_INVARIANT_SEED={args.seed}..{args.seed + args.shards - 1} pytest {command[3]}"
        ),
        "effort": (
            f"{per_shard * args.shards} examples x {args.invariant_steps} steps "
            f"({args.shards} parallel shards)"
        ),
        "executions": calls,
        "failures": failed,
        "shards_with_violations": violations,
        "wall_s": round(time.monotonic() - started, 1),
        "ok": failed == 0 and calls > 0,
    }


def markdown(results: list[dict[str, Any]]) -> str:
    """The summary as a markdown table (executions: fuzz inputs, API calls, contract calls)."""
    lines = [
        "| phase | effort | executions | failures | wall time | ok |",
        "|---|---|---:|---:|---:|---|",
    ]
    for r in results:
        row = f"| {r['phase']} | {r['effort']} | {r['executions']:,} | {r['failures']} | {r['wall_s']} s |"
        lines.append(f"{row} {'yes' if r['ok'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(prog="scripts/soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=PHASES, default=list(PHASES))
    parser.add_argument("--fuzz-runs", type=int, default=1_000_000)
    parser.add_argument("--rss-limit-mb", type=int, default=256)
    parser.add_argument("--api-examples", type=int, default=1000)
    parser.add_argument("--stateful-examples", type=int, default=200)
    parser.add_argument("--stateful-steps", type=int, default=20)
    parser.add_argument("--invariant-examples", type=int, default=256)
    parser.add_argument("--invariant-steps", type=int, default=500)
    parser.add_argument(
        "--shards", type=int, default=os.cpu_count() or 1, help="invariant shards run in parallel (CPU count)"
    )
    parser.add_argument("--seed", type=int, default=20261122, help="first invariant shard's seed")
    parser.add_argument("--json", type=Path, help="write the summary as JSON here")
    parser.add_argument("--markdown", type=Path, help="write the summary table here")
    args = parser.parse_args()
    phases = {
        "decoder": lambda out: _fuzz("decoder", args, out),
        "codec": lambda out: _fuzz("codec", args, out),
        "api": lambda out: _api(args, out),
        "invariants": lambda out: _invariants(args, out),
    }
    results = []
    with tempfile.TemporaryDirectory(prefix="veritrain-soak-") as tmp:
        for name in PHASES:
            if name in args.only:
                print(f"== soak: {name} ==", flush=True)
                results.append(phases[name](Path(tmp)))
    summary = {"ok": all(r["ok"] for r in results), "phases": results}
    table = markdown(results)
    print(table)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    if args.markdown:
        args.markdown.write_text(table)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
