"""Both ends of `/veritrain/blob/1.0.0` as trio code on a libp2p host (P2PNode wraps them for sync callers).

Server: admit the stream under the peer's rate and pending limits (veritrain.p2p.guard), read one capped
request frame within a short deadline, check it against the Noise-authenticated remote peer, the clock,
the signature, the authorizer and the replay cache, and only then take a serving slot and stream the
blob in chunk frames, each of which the reader must take in time.
Client: send a signed request, read the response under the frame cap and a blob-size cap, and accept
the bytes only if they hash to the digest asked for. Errors say who is to blame: an answer from the peer
(BlobNotFound, RequestDenied, DigestMismatch, DecodeError) or no answer (FetchIncomplete, PeerBusy).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable

import trio
from eth_account.signers.local import LocalAccount
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.network.stream.exceptions import StreamEOF
from libp2p.peer.id import ID

from veritrain.blobstore import BlobStore
from veritrain.codec import MAX_FRAME_BYTES, CodecLimits, FrameReader, decode, encode, write_frame
from veritrain.errors import (
    BlobNotFound,
    DecodeError,
    DigestMismatch,
    FetchIncomplete,
    P2PError,
    PeerBusy,
    RequestDenied,
)
from veritrain.p2p.guard import Outcome, ReplayCache, StreamGuard
from veritrain.p2p.messages import (
    BLOB_PROTOCOL_ID,
    BlobChunk,
    BlobRequest,
    BlobResponse,
    recover_request_signer,
    sign_blob_request,
)

__all__ = ["CHUNK_BYTES", "Authorizer", "BlobServer", "StreamSource", "fetch_blob"]

logger = logging.getLogger(__name__)

PROTOCOL = TProtocol(BLOB_PROTOCOL_ID)
COUNTER_LABEL = "blob"
"""The protocol label of this server's outcomes in `ServerCounters`."""
CHUNK_BYTES = MAX_FRAME_BYTES - 1024
"""Blob bytes per chunk frame: the frame cap minus room for the msgpack envelope."""
REQUEST_LIMITS = CodecLimits(max_frame_bytes=4096, max_depth=2)
"""A request is a few hundred bytes; anything bigger is hostile."""

Authorizer = Callable[[BlobRequest], bool]
"""Called (in a worker thread, so it may block) with a request whose signature is already verified."""


class StreamSource:
    """A libp2p stream as a `codec.ByteSource` (end of stream as b"", as the codec expects)."""

    def __init__(self, stream: INetStream) -> None:
        self._stream = stream
        self.ended = False
        """True once the stream reported its end: a frame cut short there is a lost stream, not a bad one."""

    async def read(self, n: int) -> bytes:
        try:
            return await self._stream.read(n)
        except StreamEOF:
            self.ended = True
            return b""


class BlobServer:
    """Serves the blobs of one BlobStore to peers whose signed requests pass the checks."""

    def __init__(self, store: BlobStore, guard: StreamGuard, *, authorize: Authorizer | None = None) -> None:
        self.store = store
        self._guard = guard
        self._limits = guard.limits
        self._authorize = authorize
        self._replays = ReplayCache(self._limits.max_nonces_per_signer, self._limits.max_replay_entries)

    def _count(self, outcome: Outcome) -> None:
        self._guard.counters.count(COUNTER_LABEL, outcome)

    async def handle_stream(self, stream: INetStream) -> None:
        """libp2p stream handler for PROTOCOL."""
        try:
            self._count(await self._serve(stream))
        except Exception as exc:  # a broken peer must never take the host down
            logger.info("blob stream from %s aborted: %r", stream.muxed_conn.peer_id, exc)
            self._count("aborted")
            await _reset_quietly(stream)

    async def _serve(self, stream: INetStream) -> Outcome:
        remote_peer = stream.muxed_conn.peer_id
        if self._guard.arrival_refused(remote_peer):
            return await self._answer(stream, "rate_limited", _busy("rate limit"))
        payload: bytes | None = None
        with self._guard.pending(remote_peer, self._limits.header_timeout_s) as ticket:
            if isinstance(ticket, str):
                detail = "too many open streams" if ticket == "peer_busy" else "server busy"
                return await self._answer(stream, ticket, _busy(detail))
            with ticket.scope:
                try:
                    reader = FrameReader(StreamSource(stream), REQUEST_LIMITS.max_frame_bytes)
                    payload = await reader.read_frame()
                except DecodeError as exc:
                    # Broken framing (e.g. an oversized declared length): nothing more on it is trusted.
                    logger.info("bad blob request frame from %s: %s", remote_peer, exc)
                    await _reset_quietly(stream)
                    return "bad_frame"
        if payload is None:
            logger.info("blob request from %s %s", remote_peer, "evicted" if ticket.evicted else "timed out")
            await _reset_quietly(stream)
            return "evicted" if ticket.evicted else "header_timeout"
        try:
            request = decode(payload, BlobRequest, REQUEST_LIMITS)
        except DecodeError as exc:
            # A well-framed but invalid message: say why, so an honest but outdated client can tell.
            logger.info("bad blob request from %s: %s", remote_peer, exc)
            response = BlobResponse(status="bad_request", size=0, detail=str(exc)[:500])
            return await self._answer(stream, "bad_request", response)

        refusal = await self._refusal(request, remote_peer)
        if refusal is not None:
            logger.info("blob request from %s denied: %s", remote_peer, refusal)
            return await self._answer(stream, "denied", BlobResponse(status="denied", size=0, detail=refusal))
        if not self.store.has(request.digest):
            return await self._answer(stream, "not_found", BlobResponse(status="not_found", size=0))
        busy = await self._guard.acquire_serving(remote_peer)
        if busy is not None:
            detail = "too many transfers to this peer" if busy == "peer_busy" else "server busy"
            return await self._answer(stream, busy, _busy(detail))
        try:
            return await self._send(stream, request.digest)
        finally:
            self._guard.release_serving(remote_peer)

    async def _send(self, stream: INetStream, digest: str) -> Outcome:
        """Stream the blob; each frame must be taken within chunk_timeout_s (a slow reader loses its slot)."""
        with self.store.open(digest) as blob:
            header = BlobResponse(status="ok", size=self.store.size(digest))
            if not await self._write_in_time(stream, encode(header)):
                return "aborted"
            while chunk := blob.read(CHUNK_BYTES):
                if not await self._write_in_time(stream, encode(BlobChunk(data=chunk))):
                    return "aborted"
                self._guard.counters.add_bytes(len(chunk))
        await stream.close()
        return "ok"

    async def _answer(self, stream: INetStream, outcome: Outcome, response: BlobResponse) -> Outcome:
        """Send `response` as the only frame, close, and return `outcome` (for the counters)."""
        if await self._write_in_time(stream, encode(response)):
            await stream.close()
        return outcome

    async def _write_in_time(self, stream: INetStream, payload: bytes) -> bool:
        with trio.move_on_after(self._limits.chunk_timeout_s):
            await write_frame(stream.write, payload)
            return True
        logger.info("blob peer %s too slow to read, stream cut", stream.muxed_conn.peer_id)
        await _reset_quietly(stream)
        return False

    async def _refusal(self, request: BlobRequest, remote_peer: ID) -> str | None:
        """Why `request` must be refused, or None if it may be served.

        The authorizer runs before the replay cache, so requesters it refuses never take cache room."""
        if request.requester_peer_id != remote_peer.to_base58():
            return "request was signed for another peer id than the connection's"
        if abs(time.time() - request.timestamp) > self._limits.max_clock_skew_s:
            return "request timestamp outside the accepted clock window"
        try:
            signer = recover_request_signer(request)
        except Exception:  # eth-account raises several types for malformed signatures
            return "signature does not recover"
        if signer.lower() != request.requester.lower():
            return "signature is not the requester's"
        if self._authorize is not None:
            try:
                allowed = await trio.to_thread.run_sync(self._authorize, request)
            except Exception as exc:
                logger.warning("blob authorizer failed: %r", exc)
                return "authorization check failed"
            if not allowed:
                return "requester not allowed to fetch this blob"
        # The clock check refuses this request from timestamp + skew on, so the nonce is useless after.
        expires_at = request.timestamp + self._limits.max_clock_skew_s + 1
        return self._replays.first_use(signer.lower(), request.nonce, expires_at, time.time())


def _busy(detail: str) -> BlobResponse:
    return BlobResponse(status="busy", size=0, detail=detail)


async def _reset_quietly(stream: INetStream) -> None:
    """Reset a stream even from a cancelled task (shielded, briefly), ignoring a stream already gone."""
    with trio.move_on_after(1.0) as scope:
        scope.shield = True
        try:
            await stream.reset()
        except Exception as exc:
            logger.debug("stream reset failed: %r", exc)


async def fetch_blob(
    host: IHost, peer_id: ID, digest: str, account: LocalAccount, *, max_blob_bytes: int
) -> bytes:
    """Fetch one blob from a connected peer; the bytes are returned only if they hash to `digest`.

    An answer from the peer raises BlobNotFound, RequestDenied, DigestMismatch or DecodeError (Noise
    authenticates every byte, so these are the peer's own doing); "busy" raises PeerBusy, and a stream
    that ends inside a frame raises FetchIncomplete (a lost connection looks the same)."""
    request = sign_blob_request(account, digest, host.get_id().to_base58())
    stream = await host.new_stream(peer_id, [PROTOCOL])
    source = StreamSource(stream)
    try:
        await write_frame(stream.write, encode(request))
        reader = FrameReader(source, MAX_FRAME_BYTES)
        response = await reader.read_message(BlobResponse)
        if response.status == "not_found":
            raise BlobNotFound(f"peer {peer_id} has no blob {digest}")
        if response.status == "denied":
            raise RequestDenied(f"peer {peer_id} denied blob {digest}: {response.detail}")
        if response.status == "busy":
            raise PeerBusy(f"peer {peer_id} is busy: {response.detail}")
        if response.status != "ok":
            raise P2PError(f"peer {peer_id} rejected the request as malformed: {response.detail}")
        if response.size > max_blob_bytes:
            raise DecodeError(f"peer declares a {response.size}-byte blob, over the cap {max_blob_bytes}")
        hasher = hashlib.sha256()
        parts: list[bytes] = []
        received = 0
        while received < response.size:
            chunk = (await reader.read_message(BlobChunk)).data
            received += len(chunk)
            if received > response.size:
                raise DecodeError(f"peer sent more than the {response.size} bytes it declared")
            hasher.update(chunk)
            parts.append(chunk)
        if hasher.hexdigest() != digest:
            raise DigestMismatch(f"peer {peer_id} served bytes hashing to {hasher.hexdigest()} for {digest}")
        await stream.close()
        return b"".join(parts)
    except DecodeError as exc:
        await _reset_quietly(stream)
        if source.ended:
            raise FetchIncomplete(f"stream from peer {peer_id} ended early: {exc}") from exc
        raise
    except BaseException:
        await _reset_quietly(stream)
        raise
