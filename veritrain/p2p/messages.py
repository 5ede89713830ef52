"""Messages of the `/veritrain/blob/1.0.0` protocol and the EIP-712 signature on a blob request.

Exchange on one stream: the requester sends one `BlobRequest` frame; the server answers with one
`BlobResponse` frame and, if the status is "ok", `BlobChunk` frames carrying exactly `size` bytes.

A request is signed by the requester's eth-account key over (digest, requester peer id, timestamp,
nonce). The peer id ties the signature to the Noise-authenticated connection it arrives on, so a
captured request is useless from any other peer; the timestamp bounds its lifetime, and the nonce
lets the server refuse a second use within that lifetime.
"""

from __future__ import annotations

import secrets
import time
from typing import Annotated, Any, Literal

from eth_account import Account
from eth_account.messages import SignableMessage, encode_typed_data
from eth_account.signers.local import LocalAccount
from pydantic import Field

from veritrain.codec import WireModel

__all__ = [
    "BLOB_PROTOCOL_ID",
    "BlobChunk",
    "BlobRequest",
    "BlobResponse",
    "is_canonical_signature",
    "recover_request_signer",
    "sign_blob_request",
]

BLOB_PROTOCOL_ID = "/veritrain/blob/1.0.0"

Digest = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
EthAddress = Annotated[str, Field(pattern=r"^0x[0-9a-fA-F]{40}$")]
PeerIdText = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[1-9A-HJ-NP-Za-km-z]+$")]

_EIP712_TYPES = {
    "EIP712Domain": [{"name": "name", "type": "string"}, {"name": "version", "type": "string"}],
    "BlobRequest": [
        {"name": "digest", "type": "bytes32"},
        {"name": "requesterPeerId", "type": "string"},
        {"name": "timestamp", "type": "uint64"},
        {"name": "nonce", "type": "bytes16"},
    ],
}
_EIP712_DOMAIN = {"name": "Veritrain Blob", "version": "1"}


class BlobRequest(WireModel):
    """Ask a peer for one blob. `requester` is the eth address that signed it."""

    digest: Digest
    requester: EthAddress
    requester_peer_id: PeerIdText
    timestamp: Annotated[int, Field(ge=0, lt=1 << 64)]
    nonce: Annotated[bytes, Field(min_length=16, max_length=16)]
    signature: Annotated[bytes, Field(min_length=65, max_length=65)]


class BlobResponse(WireModel):
    """The server's answer; `size` is the blob length when status is "ok", else 0. "busy" means over
    capacity or over the requester's rate limit: try again later."""

    status: Literal["ok", "not_found", "denied", "bad_request", "busy"]
    size: Annotated[int, Field(ge=0, lt=1 << 63)]
    detail: Annotated[str, Field(max_length=500)] = ""


class BlobChunk(WireModel):
    """A slice of the blob, in order; never empty."""

    data: Annotated[bytes, Field(min_length=1)]


def _signable(digest: str, requester_peer_id: str, timestamp: int, nonce: bytes) -> SignableMessage:
    message: dict[str, Any] = {
        "digest": bytes.fromhex(digest),
        "requesterPeerId": requester_peer_id,
        "timestamp": timestamp,
        "nonce": nonce,
    }
    return encode_typed_data(
        full_message={
            "types": _EIP712_TYPES,
            "primaryType": "BlobRequest",
            "domain": _EIP712_DOMAIN,
            "message": message,
        }
    )


def sign_blob_request(
    account: LocalAccount, digest: str, requester_peer_id: str, timestamp: int | None = None
) -> BlobRequest:
    """A fresh signed request for `digest` from this peer (new random nonce, current time)."""
    when = int(time.time()) if timestamp is None else timestamp
    nonce = secrets.token_bytes(16)
    signed = account.sign_message(_signable(digest, requester_peer_id, when, nonce))
    return BlobRequest(
        digest=digest,
        requester=account.address,
        requester_peer_id=requester_peer_id,
        timestamp=when,
        nonce=nonce,
        signature=bytes(signed.signature),
    )


_SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


def is_canonical_signature(signature: bytes) -> bool:
    """65-byte r || s || v with v in {27, 28}, 0 < r < n and 0 < s <= n/2.

    eth-account also accepts v = 0/1 and EIP-155-style v values, and both s and n - s verify, so one
    signature has several byte forms; only this one is accepted, so a signature has one spelling."""
    if len(signature) != 65 or signature[64] not in (27, 28):
        return False
    r = int.from_bytes(signature[:32], "big")
    s = int.from_bytes(signature[32:64], "big")
    return 0 < r < _SECP256K1_N and 0 < s <= _SECP256K1_N // 2


def recover_request_signer(request: BlobRequest) -> str:
    """The checksummed address whose key signed `request` (ValueError-family errors if malformed)."""
    if not is_canonical_signature(request.signature):
        raise ValueError("signature is not in canonical (low-s, v in {27, 28}) form")
    return str(
        Account.recover_message(
            _signable(request.digest, request.requester_peer_id, request.timestamp, request.nonce),
            signature=request.signature,
        )
    )
