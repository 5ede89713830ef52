"""The data plane: content-addressed blobs served between agents over libp2p (`/veritrain/blob/1.0.0`).

Typical use (synchronous)::

    node = P2PNode(account, peer_key=load_or_create_peer_key(path), store=BlobStore(dir))
    my_addr = node.start()                  # advertise this to the market
    data = node.fetch(other_addr, digest)   # bytes that hash to digest, or a typed error
    node.counters.snapshot()                # blob bytes served, inbound stream outcomes
    node.stop()
"""

from __future__ import annotations

from veritrain.p2p.access import PartyAccess
from veritrain.p2p.blob_protocol import CHUNK_BYTES, Authorizer, BlobServer, fetch_blob
from veritrain.p2p.guard import DEFAULT_SERVER_LIMITS, CounterSnapshot, ServerCounters, ServerLimits
from veritrain.p2p.identity import (
    load_or_create_peer_key,
    peer_id_of,
    peer_key_from_eth_key,
    peer_key_from_seed,
)
from veritrain.p2p.messages import BLOB_PROTOCOL_ID, BlobChunk, BlobRequest, BlobResponse, sign_blob_request
from veritrain.p2p.node import P2PNode, StreamHandler, parse_peer_addr

__all__ = [
    "BLOB_PROTOCOL_ID",
    "CHUNK_BYTES",
    "DEFAULT_SERVER_LIMITS",
    "Authorizer",
    "BlobChunk",
    "BlobRequest",
    "BlobResponse",
    "BlobServer",
    "CounterSnapshot",
    "P2PNode",
    "PartyAccess",
    "ServerCounters",
    "ServerLimits",
    "StreamHandler",
    "fetch_blob",
    "load_or_create_peer_key",
    "parse_peer_addr",
    "peer_id_of",
    "peer_key_from_eth_key",
    "peer_key_from_seed",
    "sign_blob_request",
]
