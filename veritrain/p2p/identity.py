"""Deterministic libp2p identities, so an agent keeps its peer id (and its address book entries)
across restarts.

A peer identity is an Ed25519 key pair derived from a 32-byte seed. The seed comes from a key file
(created once, mode 0600) or is derived from the agent's eth-account key, so an agent that already
guards one secret needs no second one.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.keys import KeyPair
from libp2p.peer.id import ID

from veritrain.errors import InvalidInput

__all__ = ["load_or_create_peer_key", "peer_id_of", "peer_key_from_eth_key", "peer_key_from_seed"]

SEED_BYTES = 32
_ETH_DERIVATION_LABEL = b"veritrain/libp2p-identity/v1"


def peer_key_from_seed(seed: bytes) -> KeyPair:
    """The Ed25519 peer key pair of a 32-byte seed (same seed, same peer id)."""
    if not isinstance(seed, bytes) or len(seed) != SEED_BYTES:
        raise InvalidInput(f"peer identity seed must be {SEED_BYTES} bytes")
    return create_new_key_pair(seed)


def peer_key_from_eth_key(eth_private_key: bytes) -> KeyPair:
    """A peer key derived one-way from an eth-account private key (the eth key cannot be recovered)."""
    if not isinstance(eth_private_key, bytes) or len(eth_private_key) != 32:
        raise InvalidInput("eth private key must be 32 bytes")
    return peer_key_from_seed(hashlib.sha256(_ETH_DERIVATION_LABEL + eth_private_key).digest())


def load_or_create_peer_key(path: str | os.PathLike[str]) -> KeyPair:
    """Load the seed (hex) from `path`, or create it there atomically with mode 0600."""
    key_path = Path(path)
    if key_path.exists():
        text = key_path.read_text().strip()
        try:
            seed = bytes.fromhex(text)
        except ValueError:
            raise InvalidInput(f"peer key file {key_path} is not hex") from None
        return peer_key_from_seed(seed)
    key_path.parent.mkdir(parents=True, exist_ok=True)
    seed = secrets.token_bytes(SEED_BYTES)
    tmp_path = key_path.with_name(f".{key_path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(seed.hex() + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    try:
        # link() fails if another process created the file first; then its seed wins.
        os.link(tmp_path, key_path)
    except FileExistsError:
        return load_or_create_peer_key(key_path)
    finally:
        tmp_path.unlink(missing_ok=True)
    return peer_key_from_seed(seed)


def peer_id_of(key_pair: KeyPair) -> str:
    """The base58 peer id (12D3KooW...) of a key pair."""
    return ID.from_pubkey(key_pair.public_key).to_base58()
