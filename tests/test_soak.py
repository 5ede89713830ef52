"""scripts/soak (issue 11 item 3): its summary counts what ran, and any failed phase makes it exit 1."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SOAK = Path(__file__).resolve().parent.parent / "scripts" / "soak.py"


def _soak(tmp_path: Path, *args: str) -> tuple[int, dict]:
    summary = tmp_path / "soak.json"
    done = subprocess.run(
        [sys.executable, str(SOAK), *args, "--json", str(summary)], check=False, timeout=300
    )
    return done.returncode, json.loads(summary.read_text())


def test_a_clean_fuzz_phase_is_reported_and_passes(tmp_path: Path) -> None:
    code, summary = _soak(tmp_path, "--only", "codec", "--fuzz-runs", "2000")
    assert code == 0 and summary["ok"], summary
    (phase,) = summary["phases"]
    assert phase["phase"] == "codec" and phase["executions"] == 2000 and phase["failures"] == 0, phase


def test_a_fuzzer_killed_by_its_memory_cap_fails_the_soak(tmp_path: Path) -> None:
    """The fuzzing process needs about 130 MiB before its first input, so a 64 MiB cap stops it within
    libFuzzer's once-a-second RSS check (hence enough runs to outlast one check)."""
    code, summary = _soak(tmp_path, "--only", "decoder", "--fuzz-runs", "100000", "--rss-limit-mb", "64")
    assert code == 1 and not summary["ok"], summary
    assert summary["phases"][0]["failures"] >= 1, summary
