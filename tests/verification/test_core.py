"""Pure verdict logic on small hand-made states: a fake 'trainer' stands in for torch training."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pytest
import torch

from verifier.core import (
    Distance,
    SegmentTolerance,
    Submission,
    ToleranceTable,
    UnitRequest,
    Verdict,
    state_distance,
    verify_unit,
)
from veritrain import pol
from veritrain.chain.eip712 import commitment
from veritrain.errors import VeritrainError

SPEC = pol.UnitSpec(recipe="digits-mlp", order_seed=7, round_index=0, shard=0, steps=8, checkpoint_every=2)
ORDER = bytes(32)
KAPPA = 1e-6  # tolerance per step in the hand-made table
PROVIDERS = [f"0x{index:040x}" for index in range(1, 6)]

State = dict[str, torch.Tensor]


def start_state() -> State:
    weights = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    return {
        "model.w": weights,
        "optim.exp_avg.w": torch.zeros(4, dtype=torch.float64),
        "optim.exp_avg_sq.w": torch.zeros(4, dtype=torch.float64),
        "optim.step": torch.tensor(0, dtype=torch.int64),
    }


def direction(step: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 + step)
    return torch.randn(4, generator=generator, dtype=torch.float64)


def fake_step(state: Mapping[str, torch.Tensor], step: int, drift: float = 0.0, skip: bool = False) -> State:
    """One deterministic 'optimizer step'; `drift` imitates another machine, `skip` a lazy provider."""
    new = dict(state)
    if skip:
        return new
    update = 0.01 * direction(step)
    new["model.w"] = state["model.w"] + update + drift * torch.ones(4, dtype=torch.float64)
    new["optim.exp_avg.w"] = 0.9 * state["optim.exp_avg.w"] + 0.1 * update
    new["optim.exp_avg_sq.w"] = 0.99 * state["optim.exp_avg_sq.w"] + 0.01 * update * update
    new["optim.step"] = state["optim.step"] + 1
    return new


class Counter:
    """The verifier's re-executor: the exact fake trainer, counting steps."""

    def __init__(self) -> None:
        self.steps = 0

    def __call__(self, state: Mapping[str, torch.Tensor], start: int, end: int) -> tuple[State, list[float]]:
        current: State = dict(state)
        losses = []
        for step in range(start, end):
            current = fake_step(current, step)
            losses.append(float(step))
            self.steps += 1
        return current, losses


class MemoryEvidence:
    def __init__(self, checkpoints: Mapping[int, State]) -> None:
        self.checkpoints = checkpoints

    def checkpoint(self, step: int) -> State:
        return self.checkpoints[step]


def run(drift: float = 0.0, skip_steps: frozenset[int] = frozenset()) -> dict[int, State]:
    state = start_state()
    checkpoints = {0: state}
    for step in range(SPEC.steps):
        state = fake_step(state, step, drift, step in skip_steps)
        if (step + 1) in SPEC.checkpoint_steps():
            checkpoints[step + 1] = state
    return checkpoints


def submit(provider: str, checkpoints: Mapping[int, State], *, salt: bytes = b"\x01" * 32) -> Submission:
    steps = SPEC.checkpoint_steps()
    transcript = pol.Transcript(
        spec=SPEC,
        checkpoint_steps=steps,
        checkpoint_digests=tuple(pol.state_digest(checkpoints[step]) for step in steps),
        losses=tuple(float(step) for step in range(SPEC.steps)),
        data_order_commitment=ORDER,
    )
    digest = pol.result_digest(transcript.final_digest, transcript.merkle_root())
    return Submission(
        provider=provider,
        result_digest=digest,
        transcript=transcript,
        evidence=MemoryEvidence(checkpoints),
        commitment=commitment(digest, salt, provider, 42),
        salt=salt,
    )


def table() -> ToleranceTable:
    def tol(steps: int) -> SegmentTolerance:
        limit = Distance(rel_l2=KAPPA * steps, linf=KAPPA * steps, angle=1e-2 * steps)
        return SegmentTolerance(groups={"model": limit, "exp_avg": limit, "exp_avg_sq": limit}, loss_abs=1e-3)

    return ToleranceTable(recipe=SPEC.recipe, margin=10.0, by_steps={2: tol(2), 4: tol(3), 8: tol(4)})


def request(spot_checked: bool = False) -> UnitRequest:
    return UnitRequest(
        spec=SPEC,
        start_state=start_state(),
        data_order_commitment=ORDER,
        randomness=b"r" * 32,
        spot_checked=spot_checked,
        chain_unit_id=42,
    )


def test_equal_digests_take_the_fast_path_without_reexecution() -> None:
    reexecute = Counter()
    honest = run()
    verdict = verify_unit(request(), [submit(p, honest) for p in PROVIDERS[:3]], reexecute, table())
    assert verdict.path == "fast"
    assert verdict.verdicts() == (Verdict.ACCEPT,) * 3
    assert reexecute.steps == 0 and verdict.reexecuted_steps == 0


def test_heterogeneous_honest_drift_within_tolerance_is_accepted_by_clustering() -> None:
    reexecute = Counter()
    runs = [run(), run(drift=KAPPA * 1e-3), run(drift=-KAPPA * 1e-3)]
    verdict = verify_unit(
        request(), [submit(p, r) for p, r in zip(PROVIDERS, runs, strict=False)], reexecute, table()
    )
    assert verdict.path == "verifier"
    assert verdict.verdicts() == (Verdict.ACCEPT,) * 3
    assert reexecute.steps == 0


def test_lazy_replica_is_fraud_only_through_reexecution_of_one_segment() -> None:
    reexecute = Counter()
    lazy = run(skip_steps=frozenset({5}))
    subs = [submit(PROVIDERS[0], run()), submit(PROVIDERS[1], lazy), submit(PROVIDERS[2], run(drift=1e-10))]
    verdict = verify_unit(request(), subs, reexecute, table())
    assert verdict.verdicts() == (Verdict.ACCEPT, Verdict.FRAUD, Verdict.ACCEPT)
    assert "re-execution of steps [4, 6)" in verdict.replicas[1].reason
    assert 0 < verdict.reexecuted_steps == reexecute.steps <= 2 * SPEC.checkpoint_every


def test_colluding_majority_with_one_forged_result_loses_to_reexecution() -> None:
    reexecute = Counter()
    forged = run(skip_steps=frozenset({0, 1, 2, 3}))
    subs = [submit(PROVIDERS[0], forged), submit(PROVIDERS[1], forged), submit(PROVIDERS[2], run())]
    verdict = verify_unit(request(), subs, reexecute, table())
    assert verdict.verdicts() == (Verdict.FRAUD, Verdict.FRAUD, Verdict.ACCEPT)
    assert verdict.accepted_result == subs[2].result_digest


def test_drift_that_no_single_segment_refutes_needs_a_full_reexecution_before_fraud() -> None:
    """Per-step drift of relative L2 ≈ 0.75 κ passes every 2-step replay (tolerance 2κ) but ends ≈ 6κ away
    after 8 steps (tolerance 4κ). (|w| ≈ 3.77 and the drift vector is 1.4 κ · ones(4), norm 2.8 κ.)"""
    reexecute = Counter()
    subs = [submit(PROVIDERS[0], run()), submit(PROVIDERS[1], run(drift=1.4 * KAPPA))]
    verdict = verify_unit(request(), subs, reexecute, table())
    assert verdict.verdicts() == (Verdict.ACCEPT, Verdict.FRAUD)
    assert "full re-execution" in verdict.replicas[1].reason
    assert verdict.reexecuted_steps >= SPEC.steps


def test_fraud_is_never_given_without_reexecution() -> None:
    """Distances far outside tolerance, but the verifier cannot re-execute: faults at most, never fraud."""

    def unavailable(state: Mapping[str, torch.Tensor], start: int, end: int) -> tuple[State, list[float]]:
        raise pytest.fail("re-execution must not be needed to give a fault")

    class Broken:
        def checkpoint(self, step: int) -> State:
            raise VeritrainError("peer unreachable")

    lazy = submit(PROVIDERS[1], run(skip_steps=frozenset({1})))
    broken = Submission(
        provider=lazy.provider,
        result_digest=lazy.result_digest,
        transcript=lazy.transcript,
        evidence=Broken(),
    )
    verdict = verify_unit(request(), [submit(PROVIDERS[0], run()), broken], unavailable, table())
    assert verdict.verdicts() == (Verdict.ACCEPT, Verdict.FAULT)
    assert "unavailable" in verdict.replicas[1].reason
    assert Verdict.FRAUD not in verdict.verdicts()


def test_missing_late_unparseable_and_copied_commitments_are_faults() -> None:
    honest = submit(PROVIDERS[0], run())
    missing = Submission(provider=PROVIDERS[1], problem="no reveal before the deadline")
    copier = Submission(
        provider=PROVIDERS[2],
        result_digest=honest.result_digest,
        transcript=honest.transcript,
        evidence=honest.evidence,
        commitment=honest.commitment,  # copied from the chain; it binds PROVIDERS[0], not the copier
        salt=honest.salt,
    )
    wrong_order = submit(PROVIDERS[3], run())
    assert wrong_order.transcript is not None
    forged_transcript = pol.Transcript(
        spec=SPEC,
        checkpoint_steps=wrong_order.transcript.checkpoint_steps,
        checkpoint_digests=wrong_order.transcript.checkpoint_digests,
        losses=wrong_order.transcript.losses,
        data_order_commitment=b"\x09" * 32,
    )
    digest = pol.result_digest(forged_transcript.final_digest, forged_transcript.merkle_root())
    wrong_order = Submission(
        provider=PROVIDERS[3],
        result_digest=digest,
        transcript=forged_transcript,
        evidence=wrong_order.evidence,
    )
    verdict = verify_unit(request(), [honest, missing, copier, wrong_order], Counter(), table())
    assert verdict.verdicts() == (Verdict.ACCEPT, Verdict.FAULT, Verdict.FAULT, Verdict.FAULT)
    assert "deadline" in verdict.replicas[1].reason
    assert "commitment" in verdict.replicas[2].reason
    assert "data-order" in verdict.replicas[3].reason
    assert verdict.path == "fast"  # one valid digest left


def test_served_checkpoint_that_does_not_match_its_digest_is_a_fault() -> None:
    honest, lazy = submit(PROVIDERS[0], run()), submit(PROVIDERS[1], run(skip_steps=frozenset({3})))
    assert isinstance(lazy.evidence, MemoryEvidence)
    tampered = dict(lazy.evidence.checkpoints)
    tampered[2] = run()[2] | {"model.w": run()[2]["model.w"] + 1.0}
    lazy = Submission(
        provider=lazy.provider,
        result_digest=lazy.result_digest,
        transcript=lazy.transcript,
        evidence=MemoryEvidence(tampered),
    )
    verdict = verify_unit(request(), [honest, lazy], Counter(), table())
    assert verdict.verdicts() == (Verdict.ACCEPT, Verdict.FAULT)
    assert "does not match its committed digest" in verdict.replicas[1].reason


def test_spot_check_catches_unanimous_forgery_and_passes_honest_units() -> None:
    interpolated = {
        step: start_state() | {"model.w": start_state()["model.w"] + 0.001 * step}
        for step in SPEC.checkpoint_steps()
    }
    interpolated[0] = start_state()
    forged = [submit(p, interpolated) for p in PROVIDERS[:3]]
    assert verify_unit(request(), forged, Counter(), table()).verdicts() == (Verdict.ACCEPT,) * 3
    caught = verify_unit(request(spot_checked=True), forged, Counter(), table())
    assert caught.verdicts() == (Verdict.FRAUD,) * 3 and "spot check" in caught.replicas[0].reason
    honest = verify_unit(
        request(spot_checked=True), [submit(p, run()) for p in PROVIDERS[:3]], Counter(), table()
    )
    assert honest.verdicts() == (Verdict.ACCEPT,) * 3
    assert 0 < honest.reexecuted_steps <= 2 * SPEC.checkpoint_every


def test_state_distance_metrics_and_exact_step_counter() -> None:
    a = start_state()
    b = a | {"model.w": a["model.w"] * (1 + 1e-3)}
    distance = state_distance(a, b, origin=a)
    # relative to the larger norm
    assert distance.groups["model"].rel_l2 == pytest.approx(1e-3 / (1 + 1e-3), rel=1e-9)
    assert distance.groups["model"].linf == pytest.approx(3e-3, rel=1e-6)
    assert distance.groups["model"].angle == pytest.approx(math.pi / 2)  # a made no update, b did
    moved = state_distance(fake_step(a, 0), fake_step(a, 0), origin=a)
    assert moved.groups["model"] == Distance(0.0, 0.0, 0.0)
    assert state_distance(a, a | {"optim.step": torch.tensor(3)}, a).exact_mismatches == ("optim.step",)


def test_tolerance_table_round_trips_and_extrapolates_linearly() -> None:
    original = table()
    restored = ToleranceTable.from_json(original.to_json())
    assert restored == original
    assert restored.for_steps(3) == original.by_steps[4]
    assert restored.for_steps(16).groups["model"].rel_l2 == pytest.approx(
        2 * original.by_steps[8].groups["model"].rel_l2
    )


def test_an_aggregate_unit_is_judged_by_bitwise_recomputation() -> None:
    import hashlib

    from verifier.core import judge_aggregate
    from veritrain import diloco

    start = {"model.w": torch.tensor([1.0, 2.0]), "outer.momentum.w": torch.tensor([0.1, 0.0])}
    result = {"model.w": torch.tensor([0.5, 1.75])}
    inputs = diloco.AggregateInputs(2, start, (result, None, result), diloco.OuterConfig())
    honest = diloco.aggregate(inputs).result_digest
    forged = diloco.aggregate_result_digest(hashlib.sha256(b"other").digest(), inputs.commitment())
    expected, verdicts = judge_aggregate(inputs, [("a", honest), ("b", forged), ("c", None), ("d", honest)])
    assert expected == honest
    assert [(v.provider, v.verdict) for v in verdicts] == [
        ("a", Verdict.ACCEPT),
        ("b", Verdict.FRAUD),
        ("c", Verdict.FAULT),
        ("d", Verdict.ACCEPT),
    ]
