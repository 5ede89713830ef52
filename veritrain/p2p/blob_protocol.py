"""Both ends of `/veritrain/blob/1.0.0` as trio code on a libp2p host (P2PNode wraps them for sync callers).

Server: read one capped request frame (with a deadline, so a silent peer cannot hold a stream),
check the request against the Noise-authenticated remote peer, the clock, the signature, the replay
cache and the caller's allow-list, then stream the blob in chunk frames.
Client: send a signed request, read the response under the frame cap and a blob-size cap, and accept
the bytes only if they hash to the digest asked for.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import trio
from eth_account.signers.local import LocalAccount
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.network.stream.exceptions import StreamEOF
from libp2p.peer.id import ID

from veritrain.blobstore import BlobStore
from veritrain.codec import MAX_FRAME_BYTES, CodecLimits, FrameReader, decode, encode, write_frame
from veritrain.errors import BlobNotFound, DecodeError, DigestMismatch, P2PError, RequestDenied
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

    async def read(self, n: int) -> bytes:
        try:
            return await self._stream.read(n)
        except StreamEOF:
            return b""


@dataclass
class _ReplayCache:
    """(signer, nonce) pairs seen within the accepted clock window; bounded, so it cannot grow forever."""

    window_s: float
    max_entries: int = 100_000
    _expiry: dict[tuple[str, bytes], float] = field(default_factory=dict)

    def first_use(self, signer: str, nonce: bytes, now: float) -> bool:
        if len(self._expiry) >= self.max_entries:
            self._expiry = {key: expiry for key, expiry in self._expiry.items() if expiry > now}
            if len(self._expiry) >= self.max_entries:
                return False
        key = (signer, nonce)
        if self._expiry.get(key, 0.0) > now:
            return False
        self._expiry[key] = now + 2 * self.window_s
        return True


class BlobServer:
    """Serves the blobs of one BlobStore to peers whose signed requests pass the checks."""

    def __init__(
        self,
        store: BlobStore,
        *,
        authorize: Authorizer | None = None,
        max_clock_skew_s: float = 60.0,
        request_timeout_s: float = 10.0,
        send_timeout_s: float = 600.0,
        max_concurrent_streams: int = 32,
    ) -> None:
        self.store = store
        self._authorize = authorize
        self._max_clock_skew_s = max_clock_skew_s
        self._request_timeout_s = request_timeout_s
        self._send_timeout_s = send_timeout_s
        self._replays = _ReplayCache(window_s=max_clock_skew_s)
        self._slots = trio.Semaphore(max_concurrent_streams)

    async def handle_stream(self, stream: INetStream) -> None:
        """libp2p stream handler for PROTOCOL."""
        async with self._slots:
            try:
                await self._serve(stream)
            except Exception as exc:  # a broken peer must never take the host down
                logger.info("blob stream from %s aborted: %r", stream.muxed_conn.peer_id, exc)
                await _reset_quietly(stream)

    async def _serve(self, stream: INetStream) -> None:
        remote_peer = stream.muxed_conn.peer_id
        payload: bytes | None = None
        with trio.move_on_after(self._request_timeout_s):
            try:
                payload = await FrameReader(StreamSource(stream), REQUEST_LIMITS.max_frame_bytes).read_frame()
            except DecodeError as exc:
                # Broken framing (e.g. an oversized declared length): nothing more on this stream is trusted.
                logger.info("bad blob request frame from %s: %s", remote_peer, exc)
                await _reset_quietly(stream)
                return
        if payload is None:
            logger.info("blob request from %s timed out", remote_peer)
            await _reset_quietly(stream)
            return
        try:
            request = decode(payload, BlobRequest, REQUEST_LIMITS)
        except DecodeError as exc:
            # A well-framed but invalid message: say why, so an honest but outdated client can tell.
            logger.info("bad blob request from %s: %s", remote_peer, exc)
            await _respond(stream, BlobResponse(status="bad_request", size=0, detail=str(exc)[:500]))
            await stream.close()
            return

        refusal = await self._refusal(request, remote_peer)
        if refusal is not None:
            logger.info("blob request from %s denied: %s", remote_peer, refusal)
            await _respond(stream, BlobResponse(status="denied", size=0, detail=refusal))
            await stream.close()
            return
        if not self.store.has(request.digest):
            await _respond(stream, BlobResponse(status="not_found", size=0))
            await stream.close()
            return
        with self.store.open(request.digest) as blob, trio.fail_after(self._send_timeout_s):
            size = self.store.size(request.digest)
            await _respond(stream, BlobResponse(status="ok", size=size))
            while chunk := blob.read(CHUNK_BYTES):
                await write_frame(stream.write, encode(BlobChunk(data=chunk)))
        await stream.close()

    async def _refusal(self, request: BlobRequest, remote_peer: ID) -> str | None:
        """Why `request` must be refused, or None if it may be served."""
        if request.requester_peer_id != remote_peer.to_base58():
            return "request was signed for another peer id than the connection's"
        now = time.time()
        if abs(now - request.timestamp) > self._max_clock_skew_s:
            return "request timestamp outside the accepted clock window"
        try:
            signer = recover_request_signer(request)
        except Exception:  # eth-account raises several types for malformed signatures
            return "signature does not recover"
        if signer.lower() != request.requester.lower():
            return "signature is not the requester's"
        if not self._replays.first_use(signer, request.nonce, now):
            return "request nonce already used"
        if self._authorize is not None:
            try:
                allowed = await trio.to_thread.run_sync(self._authorize, request)
            except Exception as exc:
                logger.warning("blob authorizer failed: %r", exc)
                return "authorization check failed"
            if not allowed:
                return "requester not allowed to fetch this blob"
        return None


async def _respond(stream: INetStream, response: BlobResponse) -> None:
    await write_frame(stream.write, encode(response))


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
    """Fetch one blob from a connected peer; the bytes are returned only if they hash to `digest`."""
    request = sign_blob_request(account, digest, host.get_id().to_base58())
    stream = await host.new_stream(peer_id, [PROTOCOL])
    try:
        await write_frame(stream.write, encode(request))
        reader = FrameReader(StreamSource(stream), MAX_FRAME_BYTES)
        response = await reader.read_message(BlobResponse)
        if response.status == "not_found":
            raise BlobNotFound(f"peer {peer_id} has no blob {digest}")
        if response.status == "denied":
            raise RequestDenied(f"peer {peer_id} denied blob {digest}: {response.detail}")
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
    except BaseException:
        await _reset_quietly(stream)
        raise
