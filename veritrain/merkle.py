"""SHA-256 Merkle tree with RFC 6962 / RFC 9162 structure and domain separation.

Why this shape: leaves are hashed as sha256(0x00 || data) and inner nodes as sha256(0x01 || left || right),
so a leaf can never pass for a node (second-preimage attacks), and the tree splits at the largest power of
two below n instead of duplicating odd nodes (the duplication that let Bitcoin's CVE-2012-2459 forge trees).
A proof binds the leaf's index and the leaf count.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

LEAF_PREFIX = b"\x00"
NODE_PREFIX = b"\x01"
HASH_SIZE = 32


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(LEAF_PREFIX + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(NODE_PREFIX + left + right).digest()


def _split(count: int) -> int:
    """Largest power of two strictly below count (count >= 2)."""
    return 1 << ((count - 1).bit_length() - 1)


def merkle_root(leaves: Sequence[bytes]) -> bytes:
    """Root over leaf data (each hashed with leaf_hash); the empty tree is sha256(b'') as in RFC 6962."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    return _root_of_hashes([leaf_hash(leaf) for leaf in leaves])


def _root_of_hashes(hashes: Sequence[bytes]) -> bytes:
    if len(hashes) == 1:
        return hashes[0]
    split = _split(len(hashes))
    return node_hash(_root_of_hashes(hashes[:split]), _root_of_hashes(hashes[split:]))


def merkle_proof(leaves: Sequence[bytes], index: int) -> tuple[bytes, ...]:
    """Audit path for leaf `index` (siblings from the bottom up), RFC 6962 §2.1.1."""
    if not 0 <= index < len(leaves):
        raise IndexError(f"leaf index {index} outside 0..{len(leaves) - 1}")
    return tuple(_path(index, [leaf_hash(leaf) for leaf in leaves]))


def _path(index: int, hashes: Sequence[bytes]) -> list[bytes]:
    if len(hashes) == 1:
        return []
    split = _split(len(hashes))
    if index < split:
        return [*_path(index, hashes[:split]), _root_of_hashes(hashes[split:])]
    return [*_path(index - split, hashes[split:]), _root_of_hashes(hashes[:split])]


def verify_proof(root: bytes, leaf: bytes, index: int, leaf_count: int, proof: Sequence[bytes]) -> bool:
    """True iff `leaf` (data, not its hash) sits at `index` of a `leaf_count`-leaf tree with this root.

    RFC 9162 §2.1.3.2; any malformed input (bad index, wrong proof length or hash size) gives False.
    """
    if not 0 <= index < leaf_count or any(len(sibling) != HASH_SIZE for sibling in proof):
        return False
    position, last = index, leaf_count - 1
    current = leaf_hash(leaf)
    for sibling in proof:
        if last == 0:
            return False
        if position % 2 == 1 or position == last:
            current = node_hash(sibling, current)
            while position % 2 == 0 and position != 0:
                position >>= 1
                last >>= 1
        else:
            current = node_hash(current, sibling)
        position >>= 1
        last >>= 1
    return last == 0 and current == root
