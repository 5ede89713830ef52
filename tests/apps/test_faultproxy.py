"""The chaos bench's fault proxy against a real echo server on loopback: bytes pass unchanged, a slow link
adds its delay each way, loss resets connections, a partition resets open and new connections, and the
link heals when set back to pass."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from apps.faultproxy import PASS, FaultProxy, FaultProxyError, LinkMode


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    """A threaded TCP echo server (one thread per connection) on a free loopback port."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def pump(conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(65536):
                    conn.sendall(data)
            except OSError:
                pass

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=pump, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield ("127.0.0.1", server.getsockname()[1])
    stop.set()
    thread.join(5)
    server.close()


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    with FaultProxy(seed=7) as running:
        yield running


def round_trip(port: int, payload: bytes, timeout: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
        received = b""
        while data := conn.recv(65536):
            received += data
        return received


def test_bytes_pass_unchanged_through_every_listener_of_a_link(
    proxy: FaultProxy, echo: tuple[str, int]
) -> None:
    ports = proxy.open("agent", [echo, echo])
    payload = os.urandom(3 * 2**20)  # several chunks, both directions at once
    assert len(set(ports)) == 2
    assert all(round_trip(port, payload) == payload for port in ports)
    assert proxy.mode("agent") == PASS


def test_a_slow_link_adds_its_delay_in_each_direction(proxy: FaultProxy, echo: tuple[str, int]) -> None:
    (port,) = proxy.open("agent", [echo])

    def ping(conn: socket.socket) -> float:
        began = time.monotonic()
        conn.sendall(b"ping")
        assert conn.recv(16) == b"ping"
        return time.monotonic() - began

    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        fast_s = min(ping(conn) for _ in range(5))  # the best of a few: robust on a loaded machine
        proxy.set_mode("agent", LinkMode("slow", delay_s=0.15))
        slow_s = min(ping(conn) for _ in range(3))
    assert fast_s < 0.1
    assert 0.3 <= slow_s < 1.0  # 0.15 s out, 0.15 s back


def test_loss_resets_connections_and_a_partition_resets_open_and_new_ones(
    proxy: FaultProxy, echo: tuple[str, int]
) -> None:
    (port,) = proxy.open("agent", [echo])
    proxy.set_mode("agent", LinkMode("slow", loss=1.0))
    with pytest.raises(OSError):
        round_trip(port, b"lost")

    proxy.set_mode("agent", PASS)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(b"before")
        assert conn.recv(16) == b"before"
        proxy.set_mode("agent", LinkMode("partition"))
        with pytest.raises(OSError):  # the open connection is reset
            conn.sendall(b"during")
            if not conn.recv(16):
                raise ConnectionResetError("closed")
    with pytest.raises(OSError):  # and a new one is reset at once
        round_trip(port, b"new")

    proxy.set_mode("agent", PASS)  # healed
    assert round_trip(port, b"after") == b"after"


def test_a_dead_upstream_resets_the_client_and_bad_use_is_refused(proxy: FaultProxy) -> None:
    with socket.create_server(("127.0.0.1", 0)) as gone:
        dead = ("127.0.0.1", gone.getsockname()[1])
    (port,) = proxy.open("agent", [dead])
    with pytest.raises(OSError):
        round_trip(port, b"x")
    with pytest.raises(FaultProxyError):
        proxy.open("agent", [dead])
    with pytest.raises(FaultProxyError):
        proxy.set_mode("nobody", PASS)
    with pytest.raises(FaultProxyError):
        LinkMode("flaky")
    with pytest.raises(FaultProxyError):
        LinkMode("slow", loss=1.5)
