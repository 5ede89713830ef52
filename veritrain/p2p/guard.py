"""What keeps a provider's blob server serving honest peers while others flood it.

Inbound streams pass three stages, each bounded per remote peer (the Noise-authenticated peer id) and
in total, so no single peer and no small group of peers can take what an honest peer needs:

1. **arrival** — a per-peer token bucket (`requests_per_s`, `request_burst`) refuses a peer that opens
   streams faster than any honest client does;
2. **pending** — the stream waits for its request frame at most `header_timeout_s`; a peer may have
   `max_pending_per_peer` such streams, all peers together `max_pending_total`. When the total is full, a
   newcomer displaces the oldest pending stream of the peer holding the most ("fair share"), so an honest
   peer with one stream is turned away only when `max_pending_total` distinct peers each hold one;
3. **serving** — a slot is taken only after a request has been read, its signature checked and the
   authorizer asked: `max_serving_per_peer` per peer, `max_serving_total` in all, a bounded wait for a
   slot, and every chunk must be taken by the reader within `chunk_timeout_s` (a minimum rate).

The replay cache forgets a nonce once its request's timestamp leaves the clock window (the clock check
refuses it from then on), holds at most `max_nonces_per_signer` per signer, and when full evicts the entry
that expires first instead of refusing anyone: a request is bound to the Noise peer id it was signed for,
so an evicted nonce can only be replayed by the very peer that signed it, which gains nothing.

Everything here runs on the host's trio thread except `ServerCounters`, which other threads read.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Literal

import trio
from libp2p.peer.id import ID

from veritrain.ratelimit import TokenBuckets

__all__ = [
    "DEFAULT_SERVER_LIMITS",
    "CounterSnapshot",
    "Outcome",
    "ReplayCache",
    "ServerCounters",
    "ServerLimits",
    "StreamGuard",
    "TokenBuckets",
]


@dataclass(frozen=True)
class ServerLimits:
    """The knobs of the guard (module docstring); the defaults suit agents on home links."""

    header_timeout_s: float = 5.0
    max_pending_per_peer: int = 8
    max_pending_total: int = 256
    max_serving_per_peer: int = 4
    max_serving_total: int = 32
    slot_wait_s: float = 5.0
    requests_per_s: float = 16.0
    request_burst: int = 64
    chunk_timeout_s: float = 30.0
    max_clock_skew_s: float = 60.0
    max_nonces_per_signer: int = 4096
    max_replay_entries: int = 100_000
    small_protocol_timeout_s: float = 10.0
    """Whole-stream deadline for the node's other protocols (small lookups such as the manifest index)."""

    def __post_init__(self) -> None:
        for item in fields(self):
            if getattr(self, item.name) <= 0:
                raise ValueError(f"ServerLimits.{item.name} must be > 0")


DEFAULT_SERVER_LIMITS = ServerLimits()

Outcome = Literal[
    "ok",  # blob sent in full / small protocol handler finished
    "not_found",
    "denied",  # bad signature, wrong peer id, clock, replay, per-signer cap, authorizer
    "bad_request",  # a well-framed request that is not a valid BlobRequest
    "bad_frame",  # broken framing (oversized or malformed length prefix, early end): stream reset
    "header_timeout",  # no complete request within header_timeout_s / small protocol over its deadline
    "rate_limited",  # the peer's token bucket was empty
    "peer_busy",  # the peer already holds its share of pending or serving streams
    "busy",  # no serving slot freed within slot_wait_s, or pending total full of fair shares
    "evicted",  # a pending stream displaced by another peer's under fair share
    "aborted",  # the transfer failed: reader too slow for chunk_timeout_s, stream reset, error
]


@dataclass(frozen=True)
class CounterSnapshot:
    """Blob bytes served so far and the number of inbound streams per (protocol, outcome)."""

    bytes_served: int
    requests: dict[tuple[str, str], int]


class ServerCounters:
    """Blob bytes served and request outcomes, counted in one place (a metrics exporter reads `snapshot`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes_served = 0
        self._requests: Counter[tuple[str, str]] = Counter()

    def count(self, protocol: str, outcome: Outcome) -> None:
        with self._lock:
            self._requests[(protocol, outcome)] += 1

    def add_bytes(self, n: int) -> None:
        with self._lock:
            self._bytes_served += n

    def snapshot(self) -> CounterSnapshot:
        with self._lock:
            return CounterSnapshot(self._bytes_served, dict(self._requests))


class ReplayCache:
    """(signer, nonce) pairs whose request is still inside the clock window (module docstring)."""

    def __init__(self, max_per_signer: int, max_entries: int) -> None:
        self._max_per_signer = max_per_signer
        self._max_entries = max_entries
        self._expiry: dict[tuple[str, bytes], float] = {}
        self._heap: list[tuple[float, str, bytes]] = []
        self._per_signer: Counter[str] = Counter()

    def first_use(self, signer: str, nonce: bytes, expires_at: float, now: float) -> str | None:
        """Record the nonce until `expires_at`; the reason to refuse the request, or None on its first use."""
        while self._heap and self._heap[0][0] <= now:
            self._pop()
        key = (signer, nonce)
        if key in self._expiry:
            return "request nonce already used"
        if self._per_signer[signer] >= self._max_per_signer:
            return "too many requests from this signer within the clock window"
        if len(self._expiry) >= self._max_entries:
            self._pop()
        self._expiry[key] = expires_at
        heapq.heappush(self._heap, (expires_at, signer, nonce))
        self._per_signer[signer] += 1
        return None

    def _pop(self) -> None:
        expires_at, signer, nonce = heapq.heappop(self._heap)
        if self._expiry.get((signer, nonce)) == expires_at:
            del self._expiry[(signer, nonce)]
            self._per_signer[signer] -= 1
            if not self._per_signer[signer]:
                del self._per_signer[signer]

    def __len__(self) -> int:
        return len(self._expiry)


class _Ticket:
    """One pending stream: its deadline scope, and whether fair share displaced it."""

    def __init__(self, timeout_s: float) -> None:
        self.scope = trio.CancelScope(deadline=trio.current_time() + timeout_s)
        self.evicted = False


class StreamGuard:
    """Admission of inbound streams: rate, pending and serving limits of one `ServerLimits`."""

    def __init__(self, limits: ServerLimits, counters: ServerCounters) -> None:
        self.limits = limits
        self.counters = counters
        self._buckets = TokenBuckets(limits.requests_per_s, limits.request_burst)
        self._pending: dict[ID, list[_Ticket]] = {}
        self._pending_total = 0
        self._serving: Counter[ID] = Counter()  # streams of a peer holding or awaiting a serving slot
        self._peer_slots: dict[ID, trio.Semaphore] = {}
        self._serving_slots = trio.Semaphore(limits.max_serving_total)

    def arrival_refused(self, peer: ID) -> bool:
        """Spend a token of `peer`'s bucket; True when it is empty (the caller refuses the stream)."""
        return not self._buckets.take(peer, time.monotonic())

    @contextmanager
    def pending(self, peer: ID, timeout_s: float) -> Iterator[_Ticket | Outcome]:
        """A pending-stage ticket for a stream of `peer` (enter `ticket.scope` around the read), or why
        not: the peer holds its share already, or the total is full of fair shares."""
        ticket = self._admit(peer, timeout_s)
        try:
            yield ticket
        finally:
            if isinstance(ticket, _Ticket) and not ticket.evicted:
                mine = self._pending[peer]
                mine.remove(ticket)
                self._pending_total -= 1
                if not mine:
                    del self._pending[peer]

    def _admit(self, peer: ID, timeout_s: float) -> _Ticket | Outcome:
        held = len(self._pending.get(peer, ()))
        if held >= self.limits.max_pending_per_peer:
            return "peer_busy"
        if self._pending_total >= self.limits.max_pending_total:
            heaviest = max(self._pending, key=lambda other: len(self._pending[other]))
            if len(self._pending[heaviest]) < held + 2:
                return "busy"  # everyone holds about as much as this peer: nothing to take back
            victim = self._pending[heaviest].pop(0)
            victim.evicted = True
            victim.scope.cancel()
            self._pending_total -= 1
        ticket = _Ticket(timeout_s)
        self._pending.setdefault(peer, []).append(ticket)
        self._pending_total += 1
        return ticket

    async def acquire_serving(self, peer: ID) -> Outcome | None:
        """Take a serving slot for `peer`, waiting at most slot_wait_s: None when taken (pair with
        `release_serving`), else why not. A peer may have max_pending_per_peer streams waiting."""
        limits = self.limits
        self._serving[peer] += 1
        if self._serving[peer] > limits.max_serving_per_peer + limits.max_pending_per_peer:
            self._leave(peer)
            return "peer_busy"
        mine = self._peer_slots.setdefault(peer, trio.Semaphore(limits.max_serving_per_peer))
        got_mine = got_slot = False
        with trio.move_on_after(limits.slot_wait_s):
            await mine.acquire()
            got_mine = True
            await self._serving_slots.acquire()
            got_slot = True
        if got_slot:
            return None
        if got_mine:
            mine.release()
        self._leave(peer)
        return "busy" if got_mine else "peer_busy"

    def release_serving(self, peer: ID) -> None:
        self._serving_slots.release()
        self._peer_slots[peer].release()
        self._leave(peer)

    def _leave(self, peer: ID) -> None:
        self._serving[peer] -= 1
        if not self._serving[peer]:
            del self._serving[peer], self._peer_slots[peer]
