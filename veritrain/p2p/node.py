"""P2PNode: a libp2p host on its own thread and trio loop, behind a small synchronous interface.

py-libp2p runs on trio, while its callers are synchronous (torch, Celery) or asyncio (FastAPI, web3).
So the host lives in one dedicated thread; `fetch` and `run_on_host` hand work to that loop and block
the calling thread until it is done. Any number of caller threads may fetch at once.

Inbound streams of every protocol go through one StreamGuard (veritrain.p2p.guard): per-peer rate,
pending and serving limits; the node's other protocols (small lookups) get a whole-stream deadline.
`counters` holds the blob bytes served and every inbound stream's outcome.

Security: only Noise is offered (py-libp2p's default list also offers plaintext, secio and TLS), and
only Yamux (Mplex is ~10x slower). One connection per peer is kept and reused: each dial costs a
fixed ~250 ms in py-libp2p 0.8.1.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

import multiaddr
import trio
from eth_account.signers.local import LocalAccount
from libp2p import new_host
from libp2p.abc import IHost, INetConn, INetStream, INetwork, INotifee
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport

from veritrain.blobstore import BlobStore, check_digest
from veritrain.errors import FetchIncomplete, InvalidInput, P2PError, PeerBusy, VeritrainError
from veritrain.p2p.blob_protocol import PROTOCOL, Authorizer, BlobServer, _reset_quietly, fetch_blob
from veritrain.p2p.guard import DEFAULT_SERVER_LIMITS, ServerCounters, ServerLimits, StreamGuard
from veritrain.p2p.identity import peer_id_of

__all__ = ["P2PNode", "StreamHandler"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
StreamHandler = Callable[[INetStream], Awaitable[None]]

DEFAULT_MAX_BLOB_BYTES = 1 << 30
BUSY_RETRY_FIRST_S = 0.1
BUSY_RETRY_MAX_S = 2.0
"""A busy peer is asked again after 0.1 s, doubling to 2 s (jittered), until the fetch's timeout."""


class _ConnectionCounter(INotifee):
    """Counts connections established (inbound and outbound): what connection reuse keeps at one per peer."""

    def __init__(self) -> None:
        self.opened = 0

    async def connected(self, network: INetwork, conn: INetConn) -> None:
        self.opened += 1

    async def disconnected(self, network: INetwork, conn: INetConn) -> None:
        return None

    async def opened_stream(self, network: INetwork, stream: INetStream) -> None:
        return None

    async def closed_stream(self, network: INetwork, stream: INetStream) -> None:
        return None

    async def listen(self, network: INetwork, multiaddr: multiaddr.Multiaddr) -> None:
        return None

    async def listen_close(self, network: INetwork, multiaddr: multiaddr.Multiaddr) -> None:
        return None


def _leaf_errors(error: BaseException) -> list[BaseException]:
    """The actual failures inside trio's nested exception groups (for a readable message)."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaf_errors(inner)]
    return [error]


def parse_peer_addr(peer_addr: str) -> PeerInfo:
    """A full peer multiaddr (/ip4/.../tcp/.../p2p/<peer id>) as PeerInfo; InvalidInput otherwise."""
    try:
        return info_from_p2p_addr(multiaddr.Multiaddr(peer_addr))
    except Exception as exc:  # multiaddr and libp2p raise several unrelated types
        raise InvalidInput(f"not a peer multiaddr with /p2p/<id>: {peer_addr!r:.200} ({exc})") from None


class P2PNode:
    """One agent's libp2p presence: serves its BlobStore (if given) and fetches blobs from peers.

    `account` signs blob requests; `peer_key` fixes the peer id (see veritrain.p2p.identity), a fresh
    one is generated when omitted. `authorize` is the server's allow-list, called with each request
    whose signature checked out (veritrain.p2p.access.PartyAccess is the agents'; None serves any signed
    request). `limits` bounds what inbound peers may take. Use as a context manager or start()/stop().
    """

    def __init__(
        self,
        account: LocalAccount,
        *,
        peer_key: KeyPair | None = None,
        store: BlobStore | None = None,
        authorize: Authorizer | None = None,
        listen_addr: str = "/ip4/127.0.0.1/tcp/0",
        max_blob_bytes: int = DEFAULT_MAX_BLOB_BYTES,
        extra_protocols: Mapping[str, StreamHandler] | None = None,
        limits: ServerLimits = DEFAULT_SERVER_LIMITS,
    ) -> None:
        self.account = account
        self._peer_key = peer_key if peer_key is not None else create_new_key_pair()
        self.peer_id = peer_id_of(self._peer_key)
        self.store = store
        self._authorize = authorize
        try:
            self._listen_addr = multiaddr.Multiaddr(listen_addr)
        except Exception as exc:  # multiaddr raises its own unrelated error types
            raise InvalidInput(f"not a multiaddr: {listen_addr!r:.200} ({exc})") from None
        self._max_blob_bytes = max_blob_bytes
        self._extra_protocols = dict(extra_protocols or {})
        self._limits = limits
        self.counters = ServerCounters()
        """Blob bytes served and inbound stream outcomes (read from any thread with snapshot())."""
        self._counter = _ConnectionCounter()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._host: IHost | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop_event: trio.Event | None = None
        self._dial_locks: dict[ID, trio.Lock] = {}
        self._address = ""

    # --- lifecycle ---------------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> str:
        """Start the host thread and listen; return this node's full multiaddr (with /p2p/<peer id>)."""
        if self._thread is not None:
            raise P2PError("P2PNode already started")
        self._thread = threading.Thread(
            target=self._thread_main, name=f"p2p-{self.peer_id[-8:]}", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(timeout):
            raise P2PError(f"libp2p host did not start within {timeout} s")
        if self._startup_error is not None:
            self._thread.join()
            reason = "; ".join(repr(leaf) for leaf in _leaf_errors(self._startup_error))
            raise P2PError(f"libp2p host failed to start: {reason}") from self._startup_error
        return self._address

    def stop(self, timeout: float = 10.0) -> None:
        """Close all connections and end the host thread; safe to call twice."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        if self._token is not None and self._stop_event is not None:
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._stop_event.set, trio_token=self._token)
        thread.join(timeout)
        if thread.is_alive():
            raise P2PError(f"libp2p host thread did not stop within {timeout} s")

    def __enter__(self) -> P2PNode:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def address(self) -> str:
        """Full multiaddr peers dial (empty before start)."""
        return self._address

    @property
    def connections_opened(self) -> int:
        """Connections established so far, both directions (reuse keeps this at one per peer)."""
        return self._counter.opened

    def _thread_main(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:
            if not self._ready.is_set():
                self._startup_error = exc
            else:
                logger.exception("libp2p host thread ended with an error")
        finally:
            self._token = None
            self._ready.set()

    async def _main(self) -> None:
        noise = NoiseTransport(self._peer_key, noise_privkey=create_x25519_key_pair().private_key)
        host = new_host(
            key_pair=self._peer_key,
            sec_opt={NOISE_PROTOCOL_ID: noise},
            muxer_preference="YAMUX",
            listen_addrs=[self._listen_addr],
        )
        host.get_network().register_notifee(self._counter)
        guard = StreamGuard(self._limits, self.counters)
        if self.store is not None:
            server = BlobServer(self.store, guard, authorize=self._authorize)
            host.set_stream_handler(PROTOCOL, server.handle_stream)
        for protocol_id, handler in self._extra_protocols.items():
            host.set_stream_handler(TProtocol(protocol_id), _guarded(protocol_id, handler, guard))
        self._stop_event = trio.Event()
        async with host.run(listen_addrs=[self._listen_addr]):
            # py-libp2p's auto-connector redials every peer in the peerstore (aiming at ~150
            # connections). Agents talk to the few peers the market names, when it names them.
            auto_connector = getattr(host.get_network(), "auto_connector", None)
            if auto_connector is not None:
                await auto_connector.stop()
            addrs = host.get_addrs()
            if not addrs:
                raise P2PError(f"host is not listening on {self._listen_addr}")
            self._address = str(addrs[0])
            self._host = host
            self._token = trio.lowlevel.current_trio_token()
            self._ready.set()
            await self._stop_event.wait()
        await host.close()
        self._host = None

    # --- work on the host's loop -------------------------------------------------------------------

    def run_on_host(self, fn: Callable[[IHost], Awaitable[T]], timeout: float = 60.0) -> T:
        """Run `fn(host)` on the node's trio loop and return its result (for protocols beyond blobs)."""
        return self._call(fn, timeout)

    def fetch(self, peer_addr: str, digest: str, timeout: float = 60.0) -> bytes:
        """Fetch blob `digest` from the peer at `peer_addr` (a full /p2p/ multiaddr).

        Returns the bytes only if they hash to `digest`. The peer's own answers raise BlobNotFound,
        RequestDenied, DigestMismatch (the peer lied) or DecodeError (the peer broke the framing or size
        caps); no answer raises FetchIncomplete (unreachable, timed out, connection lost) or its subclass
        PeerBusy (the peer stayed at capacity: busy answers are retried with backoff until `timeout`).
        See docs/ARCHITECTURE.md for how a verifier weighs them."""
        check_digest(digest)
        peer = parse_peer_addr(peer_addr)

        async def fetch_on_host(host: IHost) -> bytes:
            give_up_at = trio.current_time() + timeout
            delay = BUSY_RETRY_FIRST_S
            while True:
                await self._ensure_connected(host, peer)
                try:
                    return await fetch_blob(
                        host, peer.peer_id, digest, self.account, max_blob_bytes=self._max_blob_bytes
                    )
                except PeerBusy:
                    if trio.current_time() + delay >= give_up_at:
                        raise
                await trio.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(BUSY_RETRY_MAX_S, 2 * delay)

        return self._call(fetch_on_host, timeout)

    async def _ensure_connected(self, host: IHost, peer: PeerInfo) -> None:
        """Reuse the open connection to `peer`, or dial exactly the address the caller gave.

        A restarted agent keeps its peer id but gets a new port; py-libp2p would otherwise also dial
        the stale addresses in its peerstore and refuse the peer for 60 s after one failed dial."""
        lock = self._dial_locks.setdefault(peer.peer_id, trio.Lock())  # one dial per peer at a time
        async with lock:
            network = host.get_network()
            if network.connections.get(peer.peer_id):
                return
            host.get_peerstore().clear_addrs(peer.peer_id)
            unblock_peer = getattr(network, "unblock_peer", None)
            if unblock_peer is not None:
                unblock_peer(peer.peer_id)
            await host.connect(peer)

    def _call(self, fn: Callable[[IHost], Awaitable[T]], timeout: float) -> T:
        token, host = self._token, self._host
        if token is None or host is None:
            raise P2PError("P2PNode is not running (call start() first)")

        async def bounded() -> T:
            with trio.fail_after(timeout):
                return await fn(host)

        try:
            return trio.from_thread.run(bounded, trio_token=token)
        except VeritrainError:
            raise
        except trio.TooSlowError:
            raise FetchIncomplete(f"p2p operation timed out after {timeout} s") from None
        except trio.RunFinishedError:
            raise P2PError("P2PNode stopped during the operation") from None
        except Exception as exc:  # libp2p raises many unrelated types (dial, stream, muxer errors)
            raise FetchIncomplete(f"p2p operation failed: {type(exc).__name__}: {exc}") from exc


def _guarded(protocol_id: str, handler: StreamHandler, guard: StreamGuard) -> StreamHandler:
    """`handler` behind the guard's rate and pending limits, cut off after small_protocol_timeout_s."""

    async def run(stream: INetStream) -> None:
        peer = stream.muxed_conn.peer_id
        if guard.arrival_refused(peer):
            guard.counters.count(protocol_id, "rate_limited")
            await _reset_quietly(stream)
            return
        with guard.pending(peer, guard.limits.small_protocol_timeout_s) as ticket:
            if isinstance(ticket, str):
                guard.counters.count(protocol_id, ticket)
                await _reset_quietly(stream)
                return
            with ticket.scope:
                try:
                    await handler(stream)
                except Exception as exc:  # a broken peer must never take the host down
                    logger.info("%s stream from %s aborted: %r", protocol_id, peer, exc)
                    guard.counters.count(protocol_id, "aborted")
                    await _reset_quietly(stream)
                    return
        if ticket.scope.cancelled_caught:
            guard.counters.count(protocol_id, "evicted" if ticket.evicted else "header_timeout")
            await _reset_quietly(stream)
            return
        guard.counters.count(protocol_id, "ok")

    return run
