"""How the verifier agent re-executes a job by its reason: a drawn or appealed unit is audited, a wrong canary
in full."""

from __future__ import annotations

from eth_account import Account

from verifier.agent import audit_of
from verifier.core import VerifierPolicy
from verifier.segments import select_segments
from veritrain.messages import CANARY_REASON, ReplicaResult, StateSource, VerificationJobView
from veritrain.pol import UnitSpec

SPEC = UnitSpec(recipe="digits-mlp", order_seed=1, round_index=0, shard=0, steps=16, checkpoint_every=4)


def job(reason: str) -> VerificationJobView:
    return VerificationJobView(
        unit_id=1,
        order_id=1,
        recipe="digits-mlp",
        dataset_digest="0x" + "ab" * 32,
        seed=1,
        round_index=0,
        shard=0,
        start_step=0,
        steps=SPEC.steps,
        checkpoint_every=SPEC.checkpoint_every,
        num_shards=1,
        start_state=StateSource(state_digest=None),
        job_id=7,
        chain_unit_id=3,
        replicas=(
            ReplicaResult(
                provider=Account.create().address,
                result_digest="0x" + "cd" * 32,
                state_digest=None,
                transcript_root=None,
                p2p_addr="",
            ),
        ),
        randomness="0x" + "11" * 32,
        reason=reason,
    )


def test_a_wrong_canary_is_audited_on_every_segment() -> None:
    audited, policy = audit_of(job(CANARY_REASON))
    assert audited and policy is not None
    steps = SPEC.checkpoint_steps()
    chosen = select_segments(
        steps, b"\x11" * 32, policy.random_segments, [1.0] * (len(steps) - 1), policy.top_q
    )
    assert len(chosen) == len(steps) - 1  # all four segments of the unit, whatever the seed


def test_a_drawn_or_appealed_unit_is_audited_by_the_default_policy_and_a_dispute_is_not_an_audit() -> None:
    assert audit_of(job("spot_check")) == (True, None)
    assert audit_of(job("appeal")) == (True, None)
    assert audit_of(job("digests_differ")) == (False, None)
    assert VerifierPolicy().random_segments == 1  # what None means: the core's 1 + 1 segments
