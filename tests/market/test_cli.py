"""The CLI edges: `veritrain market serve` answers over HTTP; `veritrain bench market` writes its JSON."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_market_serve_answers_and_refuses_bad_input(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "VERITRAIN_DATA_DIR": str(tmp_path)}
    env.pop("VERITRAIN_DATABASE_URL", None)
    log = open(tmp_path / "serve.log", "w")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [sys.executable, "-m", "apps", "market", "serve", "--port", str(port), "--log-level", "warning"],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:  # readiness poll with a deadline
            assert process.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "market serve did not become ready"
            time.sleep(0.2)
        schema = httpx.get(f"{base}/openapi.json").json()
        assert "/agents/heartbeat" in schema["paths"] and "/orders" in schema["paths"]
        refused = httpx.post(f"{base}/agents/heartbeat", json={"message": {}, "signature": "0x"})
        assert refused.status_code == 422
        assert (tmp_path / "market.sqlite3").exists()  # the embedded default database
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=20)
        log.close()


def test_bench_market_writes_the_promised_fields(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "apps",
            "bench",
            "market",
            "--json",
            str(out),
            "--providers",
            "400",
            "--orders",
            "40",
            "--skip-overhead",
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=300,
    )
    result = json.loads(out.read_text())
    assert result["matches_per_s"] > 0 and result["match_p99_ms"] > 0
    assert (
        result["orchestration_overhead_ratio"] is None
        and "--skip-overhead" in result["orchestration_overhead_note"]
    )
    assert result["matched_units"] == 40 and result["unmatched_units"] == 0
