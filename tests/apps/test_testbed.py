"""The network-namespace testbed as a library: isolation, caps, partitions, cleanup by name."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from needs import require

from apps.testbed.netns import NETNS_DIR, Testbed, TestbedError, available

pytestmark = pytest.mark.netns


def connect(address: str, port: int) -> str:
    """'ok', or the errno name of a failed TCP connect."""
    with socket.socket() as sock:
        sock.settimeout(3)
        try:
            sock.connect((address, port))
            return "ok"
        except OSError as err:
            return "timeout" if isinstance(err, TimeoutError) else str(err.errno and os.strerror(err.errno))


def test_hosts_see_each_other_only_on_the_bridge_and_everything_is_removed() -> None:
    require(available(), "run as root with iproute2 (CI does)")
    with Testbed("vttb", ["a", "b"], subnet="10.78.0.0/24") as bed:
        server = subprocess.Popen(
            bed.wrap("b", [sys.executable, "-m", "http.server", "8080", "--bind", bed.address("b")]),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            routes = subprocess.run(bed.wrap("a", ["ip", "route"]), capture_output=True, text=True).stdout
            assert "default" not in routes and "10.78.0.0/24 dev eth0" in routes
            assert bed.call_in("a", lambda: _until_ok(bed.address("b")))
            # nothing outside the bridge is reachable, and fails at once instead of leaving the machine
            assert bed.call_in("a", lambda: connect("192.0.2.1", 80)) == os.strerror(101)  # ENETUNREACH
            # the root namespace cannot mistake a testbed address for one out on its default route
            assert connect(bed.address("b"), 8080) != "ok"
            bed.cap_upload("b", 20)
            qdisc = subprocess.run(
                bed.wrap("b", ["tc", "qdisc", "show", "dev", "eth0"]), capture_output=True, text=True
            )
            assert "tbf" in qdisc.stdout and "rate 20Mbit" in qdisc.stdout
            bed.partition("b")
            assert bed.call_in("a", lambda: connect(bed.address("b"), 8080)) != "ok"
            bed.heal("b")
            assert bed.call_in("a", lambda: _until_ok(bed.address("b")))
        finally:
            server.kill()
            server.wait()
    assert not [name for name in os.listdir(NETNS_DIR) if name.startswith("vttb")]
    assert "10.78.0.0" not in subprocess.run(["ip", "route"], capture_output=True, text=True).stdout


def _until_ok(address: str) -> bool:
    """The server may still be binding: a few attempts, each a real connect."""
    return any(connect(address, 8080) == "ok" or _pause() for _ in range(50))


def _pause() -> bool:
    import time

    time.sleep(0.1)
    return False


def test_bad_prefix_or_subnet_is_refused() -> None:
    with pytest.raises(TestbedError, match="prefix"):
        Testbed("no-dashes", ["a"])
    with pytest.raises(TestbedError, match="private"):
        Testbed("ok", ["a"], subnet="8.8.8.0/24")
