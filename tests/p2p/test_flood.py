"""A real flood on loopback: attackers' streams must not stop an honest peer's fetch (issue 8, finding 9).

The attackers are libp2p hosts (Noise + Yamux) on their own trio thread. Each keeps dozens of silent
streams open, drips request bytes, sends garbage and oversized frames, replays one request, and sends
validly signed requests from throwaway keys without reading the answer (slow readers, and replay-cache
filler). The honest client must still get its blob; the assertions are on outcomes, never on times
(the fetch timeout only bounds a test that would otherwise hang: before the fix, a server holding its
32 slots for silent streams queued the honest request behind them and the fetch timed out).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
from eth_account import Account
from libp2p import new_host
from libp2p.abc import IHost, INetStream
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport

from veritrain.blobstore import BlobStore
from veritrain.codec import encode_frame, encode_message_frame
from veritrain.p2p import (
    BLOB_PROTOCOL_ID,
    CHUNK_BYTES,
    P2PNode,
    PartyAccess,
    ServerLimits,
    parse_peer_addr,
    sign_blob_request,
)

PROTOCOL = TProtocol(BLOB_PROTOCOL_ID)


class Flood:
    """Attack hosts on their own thread, flooding `server_addr` until the `with` block ends."""

    def __init__(self, server_addr: str, big_digest: str, hosts: int = 3, silent_per_host: int = 40) -> None:
        self._server = parse_peer_addr(server_addr)
        self._big_digest = big_digest
        self._hosts = hosts
        self._silent_per_host = silent_per_host
        self.attempts: Counter[str] = Counter()
        self.established = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="flood", daemon=True)

    def __enter__(self) -> Flood:
        self._thread.start()
        assert self.established.wait(120), f"flood did not get going: {self._error!r} {self.attempts}"
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._token is not None and self._stop is not None:
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(60)
        assert not self._thread.is_alive(), "flood thread did not stop"

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # reported by __enter__ / the test
            self._error = exc
            self.established.set()

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with trio.open_nursery() as nursery:
            for index in range(self._hosts):
                nursery.start_soon(self._attacker, index)
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    async def _attacker(self, index: int) -> None:
        key_pair = create_new_key_pair()
        noise = NoiseTransport(key_pair, noise_privkey=create_x25519_key_pair().private_key)
        host = new_host(key_pair=key_pair, sec_opt={NOISE_PROTOCOL_ID: noise}, muxer_preference="YAMUX")
        me = ID.from_pubkey(key_pair.public_key).to_base58()
        throwaway = [
            encode_message_frame(sign_blob_request(Account.create(), self._big_digest, me)) for _ in range(12)
        ]
        async with host.run(listen_addrs=[]), trio.open_nursery() as nursery:
            await host.connect(self._server)
            for _ in range(self._silent_per_host):
                nursery.start_soon(self._forever, host, "silent", lambda s: s.read(1))
            nursery.start_soon(self._forever, host, "drip", _drip)
            nursery.start_soon(self._forever, host, "garbage", lambda s: _send_and_read(s, os.urandom(64)))
            nursery.start_soon(
                self._forever, host, "oversized", lambda s: _send_and_read(s, b"\xff" * 9 + b"\x01")
            )
            nursery.start_soon(self._forever, host, "replay", lambda s: _send_and_read(s, throwaway[0]))
            for frame in throwaway:
                nursery.start_soon(
                    self._forever, host, "slow_reader", lambda s, f=frame: _send_and_hold(s, f)
                )

    async def _forever(self, host: IHost, kind: str, attack) -> None:  # type: ignore[no-untyped-def]
        """Repeat one attack on fresh streams, a second apart (2 cores run every party), until cancelled."""
        while True:
            try:
                stream = await host.new_stream(self._server.peer_id, [PROTOCOL])
            except Exception:
                await trio.sleep(1.0)
                continue
            self.attempts[kind] += 1
            if all(self.attempts[k] >= 1 for k in ("silent", "garbage", "slow_reader", "replay")):
                self.established.set()
            try:
                await attack(stream)
            except Exception:
                self.attempts[kind + "_reset"] += 1
            with contextlib.suppress(Exception):
                await stream.reset()
            await trio.sleep(1.0)


async def _drip(stream: INetStream) -> None:
    await stream.write(b"\x80\x1f")  # a request frame of 3968 bytes, sent one byte at a time
    while True:
        await trio.sleep(0.5)
        await stream.write(b"\x00")


async def _send_and_read(stream: INetStream, payload: bytes) -> None:
    await stream.write(payload)
    while await stream.read(4096):
        pass


async def _send_and_hold(stream: INetStream, frame: bytes) -> None:
    """A valid request whose answer is never read: holds a serving slot if the server grants one."""
    await stream.write(frame)
    await trio.sleep(30)


@pytest.fixture
def big_blob(tmp_path: Path) -> tuple[BlobStore, str, bytes]:
    store = BlobStore(tmp_path / "provider")
    data = os.urandom(3 * CHUNK_BYTES + 777)
    return store, store.put(data), data


def test_flood_with_default_limits_and_an_authorizer(big_blob: tuple[BlobStore, str, bytes]) -> None:
    """The production setup: default limits, blobs served only to staked parties (here: the honest peer)."""
    store, digest, data = big_blob
    honest = Account.create()
    access = PartyAccess(lambda address: address == honest.address.lower())
    with P2PNode(Account.create(), store=store, authorize=access) as provider, P2PNode(honest) as client:
        with Flood(provider.address, digest, hosts=4) as flood:
            for _ in range(3):
                assert client.fetch(provider.address, digest, timeout=20) == data
        # The server counts a stream once its handler returns, which may be just after the client is done.
        wait_for(lambda: provider.counters.snapshot().bytes_served == 3 * len(data))
        stats = provider.counters.snapshot()
    assert flood._error is None
    outcomes = {outcome for (protocol, outcome), n in stats.requests.items() if protocol == "blob" and n}
    assert {"ok", "denied", "peer_busy"} <= outcomes, (stats, flood.attempts)
    assert stats.requests[("blob", "ok")] == 3, "only the honest fetches were served"
    assert stats.bytes_served == 3 * len(data)


def test_flood_on_an_open_server_with_tight_limits(big_blob: tuple[BlobStore, str, bytes]) -> None:
    """No authorizer: throwaway keys get serving slots (4 in all, 2 per peer, 3 attackers) and overflow a
    16-entry replay cache; slow readers are cut after 1 s, and the honest peer gets a freed slot."""
    store, digest, data = big_blob
    limits = ServerLimits(
        header_timeout_s=2.0,
        max_serving_per_peer=2,
        max_serving_total=4,
        slot_wait_s=3.0,
        chunk_timeout_s=1.0,
        max_replay_entries=16,
    )
    with (
        P2PNode(Account.create(), store=store, limits=limits) as provider,
        P2PNode(Account.create()) as client,
    ):
        with Flood(provider.address, digest, silent_per_host=20) as flood:
            wait_for(lambda: provider.counters.snapshot().requests.get(("blob", "aborted"), 0) >= 4)
            for _ in range(3):
                assert client.fetch(provider.address, digest, timeout=60) == data
        stats = provider.counters.snapshot()
    assert flood._error is None
    outcomes = {outcome for (protocol, outcome), n in stats.requests.items() if protocol == "blob" and n}
    assert {"ok", "aborted", "peer_busy"} <= outcomes, (stats, flood.attempts)


def wait_for(condition: Callable[[], bool], timeout: float = 120.0) -> None:
    """Wait until the flood has reached the state a test needs (a precondition, not the outcome)."""
    give_up_at = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < give_up_at, "the flood never reached the state the test needs"
        time.sleep(0.05)


def test_small_protocols_are_cut_off_at_their_deadline(client: P2PNode) -> None:
    """The node's other protocols (e.g. the manifest index) get the same guard and a whole-stream deadline."""
    handled: list[str] = []

    async def slow_lookup(stream: INetStream) -> None:
        handled.append("start")
        await stream.read(1)  # the client never sends: the handler would wait forever
        handled.append("never")

    limits = ServerLimits(small_protocol_timeout_s=0.5)
    with P2PNode(Account.create(), extra_protocols={"/t/1": slow_lookup}, limits=limits) as provider:
        peer = parse_peer_addr(provider.address)

        async def ask(host: IHost) -> str:
            await host.connect(peer)
            stream = await host.new_stream(peer.peer_id, [TProtocol("/t/1")])
            try:
                return repr(await stream.read(1))
            except Exception as exc:  # the server's reset
                return type(exc).__name__

        assert client.run_on_host(ask, timeout=30) in {"b''", "StreamEOF", "StreamReset"}
        stats = provider.counters.snapshot()
    assert handled == ["start"]
    assert stats.requests == {("/t/1", "header_timeout"): 1}


def test_a_failing_small_protocol_handler_is_contained(client: P2PNode) -> None:
    async def broken(stream: INetStream) -> None:
        raise RuntimeError("handler bug")

    with P2PNode(Account.create(), extra_protocols={"/t/2": broken}) as provider:
        peer = parse_peer_addr(provider.address)

        async def ask(host: IHost) -> None:
            await host.connect(peer)
            with contextlib.suppress(Exception):  # the reset may come before the protocol is agreed
                stream = await host.new_stream(peer.peer_id, [TProtocol("/t/2")])
                await stream.read(1)

        client.run_on_host(ask, timeout=30)
        wait_for(lambda: provider.counters.snapshot().requests == {("/t/2", "aborted"): 1})
        client.run_on_host(ask, timeout=30)  # the host still answers
        wait_for(lambda: provider.counters.snapshot().requests == {("/t/2", "aborted"): 2})


def test_counters_see_every_outcome_of_a_plain_exchange(server: P2PNode, client: P2PNode) -> None:
    assert server.store is not None
    digest = server.store.put(b"counted")
    assert client.fetch(server.address, digest) == b"counted"
    peer = parse_peer_addr(server.address)

    async def garbage(host: IHost) -> None:
        stream = await host.new_stream(peer.peer_id, [PROTOCOL])
        await stream.write(encode_frame(b"\xc1"))
        await stream.read(4096)

    client.run_on_host(garbage)
    wait_for(lambda: sum(server.counters.snapshot().requests.values()) == 2)
    stats = server.counters.snapshot()
    assert stats.bytes_served == len(b"counted")
    assert stats.requests == {("blob", "ok"): 1, ("blob", "bad_request"): 1}
