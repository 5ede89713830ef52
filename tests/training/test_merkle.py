"""Merkle tree: every proof of every tree size verifies, and any tampering is rejected."""

from __future__ import annotations

import hashlib

import pytest

from veritrain.merkle import leaf_hash, merkle_proof, merkle_root, node_hash, verify_proof


def naive_root(leaves: list[bytes]) -> bytes:
    """RFC 6962 MTH written straight from its definition."""
    if len(leaves) == 1:
        return hashlib.sha256(b"\x00" + leaves[0]).digest()
    split = 1
    while split * 2 < len(leaves):
        split *= 2
    return hashlib.sha256(b"\x01" + naive_root(leaves[:split]) + naive_root(leaves[split:])).digest()


@pytest.mark.parametrize("count", range(1, 12))
def test_every_proof_verifies_and_root_matches_the_definition(count: int) -> None:
    leaves = [f"leaf-{index}".encode() for index in range(count)]
    root = merkle_root(leaves)
    assert root == naive_root(leaves)
    for index, leaf in enumerate(leaves):
        assert verify_proof(root, leaf, index, count, merkle_proof(leaves, index))


def test_tampering_is_rejected() -> None:
    leaves = [bytes([value]) * 5 for value in range(7)]
    root = merkle_root(leaves)
    proof = merkle_proof(leaves, 3)
    assert verify_proof(root, leaves[3], 3, 7, proof)
    assert not verify_proof(root, b"forged", 3, 7, proof)
    assert not verify_proof(root, leaves[3], 2, 7, proof)
    assert not verify_proof(root, leaves[3], 3, 3, proof)
    assert not verify_proof(root, leaves[3], 3, 7, proof[:-1])
    assert not verify_proof(root, leaves[3], 3, 7, (*proof, proof[0]))
    assert not verify_proof(root, leaves[3], 7, 7, proof)
    flipped = bytes([proof[0][0] ^ 1]) + proof[0][1:]
    assert not verify_proof(root, leaves[3], 3, 7, (flipped, *proof[1:]))
    assert not verify_proof(root, leaves[3], 3, 7, (proof[0][:31], *proof[1:]))
    with pytest.raises(IndexError):
        merkle_proof(leaves, 7)


def test_leaves_and_nodes_are_domain_separated() -> None:
    left, right = b"a", b"b"
    root = merkle_root([left, right])
    assert root == node_hash(leaf_hash(left), leaf_hash(right))
    # An inner node presented as a leaf must not reproduce the root (second-preimage attack).
    assert merkle_root([leaf_hash(left) + leaf_hash(right)]) != root
    assert merkle_root([]) == hashlib.sha256(b"").digest()
