"""Several hosts on one Linux machine: one network namespace per host, joined by a bridge in a namespace of
its own, for tests of a deployment across hosts (and issue 11's chaos suite: caps and partitions).

Rules it keeps (docs/DEPLOY.md, shared TOOLCHAIN.md):
- every host, the market's too, lives in its own namespace with one interface `eth0` on the testbed's /24;
  the bridge lives in a switch namespace; the root namespace takes no part;
- no namespace has a default route, so a packet for anywhere else fails at once (ENETUNREACH) and nothing
  can leave the machine; a partitioned host (`partition`) fails the same way; and while the testbed exists
  the root namespace holds a blackhole route for its subnet, so a mistaken connection from outside the
  testbed fails too instead of following the machine's default route out;
- an upload cap is `tc tbf` on the host's `eth0` (the kernel here has no netem: latency and loss need a
  user-space proxy);
- everything is named `<prefix>-…` and removed by name in `close()` — also what a crashed earlier run left.

Needs root and iproute2. A process runs on a host through `ip netns exec` (`wrap`); code of this process
can act from a host in a thread of its own (`call_in`: network namespaces are per thread on Linux).
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from veritrain.errors import VeritrainError

CLONE_NEWNET = 0x40000000
NETNS_DIR = "/var/run/netns"
T = TypeVar("T")


class TestbedError(VeritrainError):
    """The testbed could not be built or used (not root, no iproute2, a command failed)."""

    __test__ = False  # not a pytest test class, whatever its name


@dataclass(frozen=True)
class Host:
    name: str
    namespace: str
    address: str
    index: int


def available() -> str | None:
    """Why a testbed cannot be built here (None: it can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "iproute2 (ip, tc) is not installed"
    return None


class Testbed:
    """Hosts on a private /24 behind one bridge. Use as a context manager (it always cleans up)."""

    __test__ = False  # not a pytest test class, whatever its name

    def __init__(self, prefix: str, hosts: Sequence[str], subnet: str = "10.77.0.0/24") -> None:
        if not prefix.isalnum() or len(prefix) > 8:
            raise TestbedError(f"prefix {prefix!r} must be 1-8 letters or digits (interface names are short)")
        network = ipaddress.ip_network(subnet)
        if not network.is_private or network.num_addresses < len(hosts) + 2:
            raise TestbedError(f"{subnet} must be a private network with room for {len(hosts)} hosts")
        reason = available()
        if reason:
            raise TestbedError(reason)
        self.prefix = prefix
        self.subnet = network
        self.switch = f"{prefix}-sw"
        addresses = list(network.hosts())
        self.hosts = {
            name: Host(name, f"{prefix}-{name}", str(addresses[i]), i) for i, name in enumerate(hosts)
        }

    # --- lifecycle -----------------------------------------------------------------------------------

    def __enter__(self) -> Testbed:
        self.close()  # what an interrupted earlier run with this prefix left behind
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _build(self) -> None:
        self._ip("route", "replace", "blackhole", str(self.subnet))
        self._ip("netns", "add", self.switch)
        self._ip("-n", self.switch, "link", "set", "lo", "up")
        self._ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        self._ip("-n", self.switch, "link", "set", "br0", "up")
        for host in self.hosts.values():
            outer, inner = f"{self.prefix}s{host.index}", f"{self.prefix}h{host.index}"
            self._ip("netns", "add", host.namespace)
            self._ip("-n", host.namespace, "link", "set", "lo", "up")
            self._ip("-n", self.switch, "link", "add", outer, "type", "veth", "peer", "name", inner)
            self._ip("-n", self.switch, "link", "set", inner, "netns", host.namespace)
            self._ip("-n", self.switch, "link", "set", outer, "master", "br0")
            self._ip("-n", self.switch, "link", "set", outer, "up")
            self._ip("-n", host.namespace, "link", "set", inner, "name", "eth0")
            prefix_len = self.subnet.prefixlen
            self._ip("-n", host.namespace, "addr", "add", f"{host.address}/{prefix_len}", "dev", "eth0")
            self._ip("-n", host.namespace, "link", "set", "eth0", "up")

    def close(self) -> None:
        """Delete every namespace of this prefix by name (their interfaces and caps go with them)."""
        existing = os.listdir(NETNS_DIR) if os.path.isdir(NETNS_DIR) else []
        for name in existing:
            if name == self.switch or name.startswith(f"{self.prefix}-"):
                subprocess.run(["ip", "netns", "delete", name], check=False, capture_output=True)
        blackhole = ["ip", "route", "delete", "blackhole", str(self.subnet)]
        subprocess.run(blackhole, check=False, capture_output=True)

    # --- shaping -------------------------------------------------------------------------------------

    def cap_upload(self, host: str, mbit: int) -> None:
        """Limit what `host` sends to `mbit` Mbit/s (a home uplink): tbf on its eth0."""
        burst_kbit = max(32, mbit * 8)  # enough for the rate at the kernel's timer resolution
        self._ip_tc(
            host,
            "qdisc",
            "replace",
            "dev",
            "eth0",
            "root",
            "tbf",
            "rate",
            f"{mbit}mbit",
            "burst",
            f"{burst_kbit}kbit",
            "latency",
            "400ms",
        )

    def partition(self, host: str) -> None:
        """Cut `host` off: its link goes down, so its connections fail fast (no route)."""
        self._ip("-n", self.hosts[host].namespace, "link", "set", "eth0", "down")

    def heal(self, host: str) -> None:
        self._ip("-n", self.hosts[host].namespace, "link", "set", "eth0", "up")

    # --- running things on a host --------------------------------------------------------------------

    def address(self, host: str) -> str:
        return self.hosts[host].address

    def wrap(self, host: str, argv: Sequence[str]) -> list[str]:
        """The command line that runs `argv` on `host` (ip execs it: the PID is the command's own)."""
        return ["ip", "netns", "exec", self.hosts[host].namespace, *argv]

    def call_in(self, host: str, function: Callable[[], T]) -> T:
        """Run `function` in a new thread inside `host`'s namespace; its result, or its exception."""
        outcome: dict[str, object] = {}

        def body() -> None:
            try:
                _enter_namespace(self.hosts[host].namespace)
                outcome["value"] = function()
            except BaseException as err:  # re-raised in the caller's thread below
                outcome["error"] = err

        thread = threading.Thread(target=body, name=f"testbed-{host}")
        thread.start()
        thread.join()
        if "error" in outcome:
            raise outcome["error"]  # type: ignore[misc]
        return outcome["value"]  # type: ignore[return-value]

    def _ip(self, *args: str) -> None:
        _run(["ip", *args])

    def _ip_tc(self, host: str, *args: str) -> None:
        _run(["ip", "netns", "exec", self.hosts[host].namespace, "tc", *args])


def _run(argv: list[str]) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise TestbedError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")


def _enter_namespace(namespace: str) -> None:
    """Move the calling thread (only it) into the named network namespace."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(os.path.join(NETNS_DIR, namespace), os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise TestbedError(f"setns({namespace}) failed: {os.strerror(errno)}")
    finally:
        os.close(fd)
