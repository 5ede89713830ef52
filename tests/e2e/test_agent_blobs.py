"""A state blob's content address is its canonical digest, and hostile blobs are refused."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import torch

from veritrain import pol, recipes
from veritrain.agentkit import UnitManifest, decode_state, encode_state, unit_spec_of
from veritrain.errors import InvalidInput
from veritrain.messages import Assignment, AssignmentPhase, StateSource, VerificationJobView

pytestmark = pytest.mark.torch


def test_blob_sha256_is_the_canonical_state_digest_and_round_trips() -> None:
    state = pol.initial_state(recipes.get_recipe("charlm-tiny"), seed=3)
    blob = encode_state(state)
    assert hashlib.sha256(blob).digest() == pol.state_digest(state)
    decoded = decode_state(blob)
    assert sorted(decoded) == sorted(state)
    for name, tensor in state.items():
        assert decoded[name].dtype == tensor.dtype
        assert torch.equal(decoded[name], tensor)
    assert pol.state_digest(decoded) == pol.state_digest(state)


def test_truncated_or_padded_or_foreign_blobs_are_refused() -> None:
    blob = encode_state({"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.tensor(7)})
    with pytest.raises(InvalidInput, match="truncated"):
        decode_state(blob[:-1])
    with pytest.raises(InvalidInput, match="trailing"):
        decode_state(blob + b"\x00")
    with pytest.raises(InvalidInput, match="domain"):
        decode_state(b"x" * len(blob))


def test_a_blob_lying_about_a_tensor_size_is_refused() -> None:
    blob = bytearray(encode_state({"a": torch.zeros(4, dtype=torch.float32)}))
    # The 8-byte raw length sits right before the 16 raw bytes at the end.
    blob[-24:-16] = (1 << 40).to_bytes(8, "big")
    with pytest.raises(InvalidInput, match="bytes for shape"):
        decode_state(bytes(blob))


def test_manifest_round_trip() -> None:
    manifest = UnitManifest(
        transcript={"losses": [1.0]},
        result_digest="0x" + "1" * 64,
        state_digest="0x" + "2" * 64,
        transcript_root="0x" + "3" * 64,
    )
    assert UnitManifest.from_bytes(manifest.to_bytes()) == manifest
    with pytest.raises(InvalidInput):
        UnitManifest.from_bytes(b"{}")


def test_providers_and_verifiers_run_the_unit_the_market_specified() -> None:
    """Shard and checkpoint interval come from the market's view, not from an agent-side rule."""
    common: dict[str, Any] = {
        "unit_id": 4,
        "order_id": 1,
        "recipe": "digits-mlp",
        "dataset_digest": "0x" + "ab" * 32,
        "seed": 9,
        "round_index": 2,
        "shard": 3,
        "start_step": 40,
        "steps": 20,
        "checkpoint_every": 7,
        "num_shards": 4,
        "start_state": StateSource(state_digest=None),
    }
    assignment = Assignment(
        **common,
        replica_index=0,
        phase=AssignmentPhase.RUN,
        chain_order_id=1,
        unit_key="0x" + "cd" * 32,
        accept_deadline=0,
    )
    job = VerificationJobView(
        **common, job_id=1, chain_unit_id=5, replicas=(), randomness="0x" + "ef" * 32, reason="spot_check"
    )
    expected = pol.UnitSpec(
        recipe="digits-mlp", order_seed=9, round_index=2, shard=3, steps=20, checkpoint_every=7, num_shards=4
    )
    assert unit_spec_of(assignment) == expected == unit_spec_of(job)


def test_manifest_index_and_blob_fetch_between_two_agents(tmp_path: Path) -> None:
    from eth_account import Account

    from apps.procs import free_port
    from veritrain.agentkit import BlobPlane
    from veritrain.blobstore import BlobStore
    from veritrain.errors import AgentError

    provider_store = BlobStore(tmp_path / "provider" / "blobs")
    provider = BlobPlane(provider_store, Account.create(), free_port(), tmp_path / "provider")
    verifier = BlobPlane(
        BlobStore(tmp_path / "verifier" / "blobs"), Account.create(), free_port(), tmp_path / "verifier"
    )
    provider_addr = provider.start()
    verifier.start()
    try:
        manifest = UnitManifest(
            transcript={"losses": [2.0]},
            result_digest="0x" + "ab" * 32,
            state_digest="0x" + "cd" * 32,
            transcript_root="0x" + "ef" * 32,
        )
        manifest_digest = provider_store.put(manifest.to_bytes())
        provider.publish_manifest(manifest.result_digest, manifest_digest)
        found = verifier.lookup_manifest(provider_addr, manifest.result_digest)
        assert found == manifest_digest
        assert UnitManifest.from_bytes(verifier.fetch(provider_addr, found)) == manifest
        with pytest.raises(AgentError, match="no manifest"):
            verifier.lookup_manifest(provider_addr, "0x" + "00" * 32)
    finally:
        verifier.stop()
        provider.stop()
