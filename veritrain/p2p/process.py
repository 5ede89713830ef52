"""Run a blob server (`python -m veritrain.p2p serve`) as a child process: for the benchmark, tests and
demos that want agents in separate processes, as in production."""

from __future__ import annotations

import os
import subprocess
import sys

from veritrain.errors import P2PError

READY_PREFIX = "P2P_ADDRESS "
"""The serve command prints this, then its multiaddr, once it listens."""


def start_server_process(
    store_dir: str | os.PathLike[str], peer_key_file: str | None = None
) -> tuple[subprocess.Popen[str], str]:
    """Start `serve` in a child process; return it and its address once it listens."""
    command = [sys.executable, "-m", "veritrain.p2p", "serve", "--store", str(store_dir)]
    if peer_key_file:
        command += ["--peer-key-file", peer_key_file]
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline() if process.stdout is not None else ""
    if not line.startswith(READY_PREFIX):
        process.kill()
        process.wait()
        raise P2PError(f"blob server process did not start (said {line!r})")
    return process, line[len(READY_PREFIX) :].strip()


def stop_server_process(process: subprocess.Popen[str], timeout: float = 10.0) -> int:
    """Close the child's stdin (its stop signal) and wait for it; return its exit code."""
    if process.stdin is not None:
        process.stdin.close()
    return process.wait(timeout)
