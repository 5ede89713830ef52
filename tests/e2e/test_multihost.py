"""An order across hosts: market, three providers and a verifier each in its own network namespace.

Each host reaches the others only by its address on the testbed's bridge (no default route anywhere); the
buyer acts from a host of its own; one provider's uplink is capped at 20 Mbit/s and must have carried
traffic through the cap. The market host runs the chain node, the API and a worker on embedded storage.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
from needs import require

from apps.demo import Buyer, DemoConfig, Placement, marketplace, progress_printer, start_stack
from apps.testbed.netns import Testbed, available

pytestmark = [pytest.mark.slow, pytest.mark.netns, pytest.mark.torch, pytest.mark.timeout(420)]

HOSTS = ("buyer", "market", "provider0", "provider1", "provider2", "verifier0")
CAPPED = "provider0"


def test_an_order_completes_across_namespaced_hosts(tmp_path: Path) -> None:
    require(available(), "run as root with iproute2 (CI does)")
    config = DemoConfig(
        out_dir=tmp_path, providers=3, dishonest=0, verifiers=1, replicas=2, rounds=2, unit_steps=8
    )
    with Testbed("vtmh", HOSTS) as bed:
        bed.cap_upload(CAPPED, 20)
        where = {"chain": "market", "market": "market", "verifier-0": "verifier0"}
        where |= {f"provider-{i}": f"provider{i}" for i in range(3)}
        placement = Placement(
            addresses={name: bed.address(host) for name, host in where.items()},
            launch=lambda name, argv: bed.wrap(where[name], argv),
        )

        def buy() -> tuple[dict[str, object], dict[str, str]]:
            with marketplace(config, progress_printer(), placement) as market:
                start_stack(market)
                buyer = Buyer(market)
                buyer.post_order()
                buyer.wait_completed(time.monotonic() + 240)
                logs = {proc.name: proc.log_path.read_text(errors="replace") for proc in market.procs}
                return buyer.status(), logs

        status, logs = bed.call_in("buyer", buy)
        shaped = subprocess.run(
            bed.wrap(CAPPED, ["tc", "-s", "qdisc", "show", "dev", "eth0"]), capture_output=True, text=True
        ).stdout

    assert status["state"] == "completed" and status["rounds_accepted"] == 2
    # every provider served its blobs on its own host's address, not on loopback
    for i in range(3):
        assert f"serving blobs at /ip4/{bed.address(f'provider{i}')}/tcp/" in logs[f"provider-{i}"]
    sent = int(re.search(r"tbf .*?Sent (\d+) bytes", shaped, re.DOTALL).group(1))  # type: ignore[union-attr]
    assert sent > 0, shaped
