"""Fixtures for the training tests: small units of both registry recipes and a subprocess runner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("unit_worker.py")
# Idle OpenMP threads sleep instead of spinning: same numbers, far less waste on a shared, busy box.
WORKER_ENV = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}


def worker_command(recipe: str, steps: int, every: int, *extra: str) -> list[str]:
    return [
        sys.executable,
        str(WORKER),
        "--recipe",
        recipe,
        "--steps",
        str(steps),
        "--every",
        str(every),
        *extra,
    ]


def run_worker_with_progress(
    recipe: str, steps: int, every: int, *extra: str
) -> tuple[dict[str, Any], list[int]]:
    """Run one unit in a fresh Python process: its printed digests and the steps it reported training."""
    completed = subprocess.run(
        worker_command(recipe, steps, every, *extra),
        cwd=REPO_ROOT,
        env=WORKER_ENV,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    lines = completed.stdout.strip().splitlines()
    trained = [int(line.split()[1]) for line in lines if line.startswith("step ")]
    result: dict[str, Any] = json.loads(lines[-1])
    return result, trained


def run_genesis_worker(env: dict[str, str]) -> str:
    """The worker's ``--genesis`` output in a fresh process whose environment adds `env`."""
    clean = {
        key: value for key, value in WORKER_ENV.items() if key not in ("ATEN_CPU_CAPABILITY", "MKL_CBWR")
    }
    completed = subprocess.run(
        [*worker_command("digits-mlp", 1, 1), "--genesis"],
        cwd=REPO_ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return completed.stdout.strip().splitlines()[-1]


def run_worker(recipe: str, steps: int, every: int, *extra: str) -> dict[str, Any]:
    """Run one unit in a fresh Python process and return its printed digests."""
    return run_worker_with_progress(recipe, steps, every, *extra)[0]


@pytest.fixture(scope="session")
def stdlib_dataset() -> Any:
    from veritrain.datasets import load_dataset

    return load_dataset("python-stdlib-3.11")


@pytest.fixture(scope="session")
def digits_dataset() -> Any:
    from veritrain.datasets import load_dataset

    return load_dataset("sklearn-digits")


@pytest.fixture(autouse=True)
def one_torch_thread() -> Any:
    """One intra-op thread: results do not depend on it (tested), and it suffers least on a shared box."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
