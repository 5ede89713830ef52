"""The four guides are runnable: every ```bash block of docs/OPERATORS.md, PROVIDERS.md, VERIFIERS.md and
BUYERS.md runs, as written, in one bash per guide (a person's terminal), with only the `<placeholders>`
filled in from what this test sets up: free ports, a fresh PostgreSQL database, Redis, a home folder per
role. Acceptance of the user-facing path: against the market OPERATORS.md starts, with the provider and
verifier their guides start, BUYERS.md posts an order with the CLI, watches it finish, fetches verified
weights and closes it; the dashboard's data then shows the order completed.

What the guides start in the background (chain node, market, worker, agents) belongs to the process group
of that guide's bash, which this test started; it stops each group by its id at the end.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
GUIDES = ("OPERATORS", "PROVIDERS", "VERIFIERS", "BUYERS")
PLACEHOLDER = re.compile(r"<[a-z][a-z-]*>")
GUIDE_TIMEOUT_S = {"OPERATORS": 240, "PROVIDERS": 120, "VERIFIERS": 120, "BUYERS": 360}
PASSPHRASE = "guide-test-passphrase"


def runnable_blocks(markdown: str) -> list[str]:
    """The bodies of the ```bash fenced blocks, in order (other fences are illustrations)."""
    blocks: list[str] = []
    current: list[str] | None = None
    for line in markdown.splitlines():
        if current is None and line.strip() == "```bash":
            current = []
        elif current is not None and line.strip() == "```":
            blocks.append("\n".join(current))
            current = None
        elif current is not None:
            current.append(line)
    assert current is None, "an unterminated ```bash block"
    return blocks


def guide_script(name: str, values: dict[str, str]) -> str:
    """One guide's commands as a bash script; every placeholder must be one this test knows."""
    text = "\n".join(runnable_blocks((REPO / "docs" / f"{name}.md").read_text()))
    unknown = sorted(set(PLACEHOLDER.findall(text)) - set(values))
    assert not unknown, f"{name}.md uses placeholders the test does not fill: {unknown}"
    for placeholder, value in values.items():
        text = text.replace(placeholder, value)
    return "set -eo pipefail\n" + text + "\n"


def test_every_guide_has_runnable_blocks_and_known_placeholders() -> None:
    for name in GUIDES:
        blocks = runnable_blocks((REPO / "docs" / f"{name}.md").read_text())
        assert len(blocks) >= 3 and all(block.strip() for block in blocks), name
    text = "```bash\necho <a-b>\n```\n```toml\nx = 1\n```\n"
    assert runnable_blocks(text) == ["echo <a-b>"]
    with pytest.raises(AssertionError, match="placeholders the test does not fill"):
        guide_script("BUYERS", {})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Terminals:
    """One bash per guide, each in its own process group (its background services stay in it)."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root = root
        self.env = env
        self.groups: list[int] = []

    def run(self, name: str, script: str) -> str:
        home = self.root / name.lower()
        home.mkdir()
        log_path = self.root / f"{name}.log"
        with open(log_path, "w") as log:
            process = subprocess.Popen(
                ["bash", "-c", script],
                cwd=home,
                env={**self.env, "HOME": str(home)},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            self.groups.append(process.pid)
            try:
                code = process.wait(timeout=GUIDE_TIMEOUT_S[name])
            except subprocess.TimeoutExpired:
                code = None
        output = log_path.read_text()
        assert code == 0, f"{name}.md failed (exit {code}):\n{output[-6000:]}\n{self.service_logs()}"
        return output

    def service_logs(self) -> str:
        tails = []
        for path in sorted(self.root.glob("*/veritrain-*/*.log")):
            tails.append(f"--- {path.relative_to(self.root)}\n{path.read_text()[-2500:]}")
        return "\n".join(tails)

    def stop(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGKILL):
            for group in self.groups:
                try:
                    os.killpg(group, signum)
                except ProcessLookupError:
                    continue
            deadline = time.monotonic() + 20
            while (
                signum == signal.SIGTERM
                and time.monotonic() < deadline
                and any(_group_alive(g) for g in self.groups)
            ):
                time.sleep(0.2)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.fixture
def terminals(tmp_path: Path, private_queue: str) -> Iterator[Terminals]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("VERITRAIN_")}
    env |= {
        "VERITRAIN_CELERY_QUEUE": private_queue,  # the test's Redis may be shared with other tests
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "HARDHAT_DISABLE_TELEMETRY_PROMPT": "true",
        "PYTHONUNBUFFERED": "1",
    }
    started = Terminals(tmp_path, env)
    try:
        yield started
    finally:
        started.stop()


@pytest.mark.slow
@pytest.mark.node_backend
@pytest.mark.torch
@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.timeout(900)
def test_a_buyer_follows_the_guides_to_verified_weights(
    terminals: Terminals, fresh_postgres_url: str, redis_url: str
) -> None:
    rpc_port, market_port = free_port(), free_port()
    root = terminals.root
    market_url = f"http://127.0.0.1:{market_port}"
    values = {
        "<checkout>": str(REPO),
        "<passphrase>": PASSPHRASE,
        "<postgresql-url>": fresh_postgres_url,
        "<redis-url>": redis_url,
        "<listen-address>": "127.0.0.1",
        "<rpc-port>": str(rpc_port),
        "<market-port>": str(market_port),
        "<market-url>": market_url,
        "<rpc-url>": f"http://127.0.0.1:{rpc_port}",
        "<deployments-file>": str(root / "operators" / "veritrain-operator" / "deployments.json"),
        "<this-host>": "127.0.0.1",
    }
    terminals.run("OPERATORS", guide_script("OPERATORS", values))
    terminals.run("PROVIDERS", guide_script("PROVIDERS", values))
    terminals.run("VERIFIERS", guide_script("VERIFIERS", values))
    output = terminals.run("BUYERS", guide_script("BUYERS", values))

    data = httpx.get(f"{market_url}/dashboard/data", timeout=10).json()
    assert [order["state"] for order in data["orders"]] == ["completed"], output
    buyer = root / "buyers" / "veritrain-buyer"
    order = tomllib.loads((buyer / "order.toml").read_text())
    result = buyer / "result"
    report = json.loads((result / "report.json").read_text())
    assert report["order_id"] == data["orders"][0]["id"]
    # one verified loss per step of the order (from the PoL transcripts), and training made progress
    assert len(report["losses"]) == order["total_steps"] and report["losses"][-1] < report["losses"][0]
    from safetensors import safe_open

    with safe_open(str(result / "final-weights.safetensors"), "pt") as weights:
        assert weights.metadata()["state_digest"] == report["final_state_digest"]
        assert len(list(weights.keys())) > 0
    assert (result / "loss-curve.png").stat().st_size > 0
    assert "closed chain order" in output and "refund" in output
