"""Issue 8 finding 9: a verifier that cannot fetch a replica's PoL manifest because of somebody else (a
flood, its own network) abstains; only the provider's own answer, or a whole window of silence while
the verifier reached the unit's other providers, is a fault. Real libp2p hosts on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from eth_account import Account

from apps.procs import free_port
from verifier.agent import VerifierAgent
from verifier.fetching import Blame, VerificationDeferred
from veritrain.agentkit import BlobPlane, UnitManifest
from veritrain.blobstore import BlobStore
from veritrain.messages import ReplicaResult, StateSource, VerificationJobView
from veritrain.pol import Transcript, UnitSpec

SPEC = UnitSpec(recipe="digits-mlp", order_seed=1, round_index=0, shard=0, steps=4, checkpoint_every=2)


def plane(tmp_path: Path, name: str) -> BlobPlane:
    return BlobPlane(BlobStore(tmp_path / name / "blobs"), Account.create(), free_port(), tmp_path / name)


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A serving provider, a provider that is gone (its address refuses connections), a verifier."""
    serving, gone, verifier = plane(tmp_path, "serving"), plane(tmp_path, "gone"), plane(tmp_path, "verifier")
    addrs = {"serving": serving.start(), "gone": gone.start()}
    gone.stop()
    verifier.start()
    transcript = Transcript(
        spec=SPEC,
        checkpoint_steps=SPEC.checkpoint_steps(),
        checkpoint_digests=tuple(bytes([i]) * 32 for i in range(len(SPEC.checkpoint_steps()))),
        losses=(2.0, 1.9, 1.8, 1.7),
        data_order_commitment=b"\x07" * 32,
    )
    result = "0x" + "ab" * 32
    manifest = UnitManifest(transcript.to_json(), result, "0x" + "cd" * 32, "0x" + "ef" * 32)
    serving.publish_manifest(result, serving.store.put(manifest.to_bytes()))
    try:
        yield {"addrs": addrs, "verifier": verifier, "result": result}
    finally:
        verifier.stop()
        serving.stop()


def job_of(replicas: list[tuple[str, str]]) -> VerificationJobView:
    return VerificationJobView(
        unit_id=1,
        order_id=1,
        recipe="digits-mlp",
        dataset_digest="0x" + "ab" * 32,
        seed=1,
        round_index=0,
        shard=0,
        start_step=0,
        steps=4,
        checkpoint_every=2,
        num_shards=1,
        start_state=StateSource(state_digest=None),
        job_id=7,
        chain_unit_id=3,
        replicas=tuple(
            ReplicaResult(
                provider=Account.create().address,
                result_digest=digest,
                state_digest=None,
                transcript_root=None,
                p2p_addr=addr,
            )
            for addr, digest in replicas
        ),
        randomness="0x" + "11" * 32,
        reason="digests_differ",
    )


def submissions(verifier: BlobPlane, job: VerificationJobView, grace_s: float) -> list[Any]:
    """The verifier agent's own step, on a real data plane (the rest of the agent is not involved)."""
    agent = SimpleNamespace(blobs=verifier, blame=Blame(grace_s=grace_s))
    return VerifierAgent.submissions(agent, job, SPEC)  # type: ignore[arg-type]


def test_no_answer_from_a_provider_makes_the_verifier_abstain_not_fault_it(hosts: dict[str, Any]) -> None:
    addrs, result = hosts["addrs"], hosts["result"]
    job = job_of([(addrs["serving"], result), (addrs["gone"], "0x" + "12" * 32)])
    with pytest.raises(VerificationDeferred, match="abstaining"):
        submissions(hosts["verifier"], job, grace_s=600)


def test_silence_for_the_whole_window_is_a_fault_only_if_another_provider_answered(
    hosts: dict[str, Any],
) -> None:
    addrs, result = hosts["addrs"], hosts["result"]
    both = job_of([(addrs["serving"], result), (addrs["gone"], "0x" + "12" * 32)])
    served, silent = submissions(hosts["verifier"], both, grace_s=0)
    assert served.problem is None and served.transcript is not None
    assert silent.problem is not None and "served nothing" in silent.problem
    alone = job_of([(addrs["gone"], "0x" + "12" * 32)])  # reached nobody: probably our own network
    with pytest.raises(VerificationDeferred):
        submissions(hosts["verifier"], alone, grace_s=0)


def test_a_providers_own_answer_is_a_fault_at_once(hosts: dict[str, Any]) -> None:
    addrs = hosts["addrs"]
    job = job_of([(addrs["serving"], "0x" + "99" * 32)])  # it answers: no manifest for that result
    (submission,) = submissions(hosts["verifier"], job, grace_s=600)
    assert submission.problem is not None and "no manifest" in submission.problem
