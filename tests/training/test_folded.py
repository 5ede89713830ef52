"""The folded outer step (``OrderSpec.outer_step = "folded"``): a shard unit of round r >= 1 runs round r-1's
outer step itself, as the agents derive it from their work (``agentkit``), on real digits-mlp training
(M = 2 shards, 2 rounds of H = 4 steps); and the verifier's judgement of such a unit (``verifier.core``)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from veritrain.messages import OuterFields, StateSource, UnitKind, UnitWork

pytestmark = pytest.mark.torch

RECIPE, SEED, M, H = "digits-mlp", 7, 2, 4
OUTER = OuterFields(aggregation="mean", trim=0, lr=0.7, momentum=0.9)


class _Blobs:
    """Content-addressed state blobs in memory: what agentkit's helpers fetch from."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}

    def source(self, state: Any) -> StateSource:
        from veritrain.agentkit import encode_state

        data = encode_state(state)
        digest = hashlib.sha256(data).hexdigest()
        self.blobs[digest] = data
        return StateSource(state_digest="0x" + digest, holders=("peer",))

    def fetch_any(self, holders: list[str], digest: str) -> bytes:
        return self.blobs[digest]


def _work(round_index: int, shard: int, start: StateSource, **fields: Any) -> UnitWork:
    return UnitWork(
        unit_id=round_index * (M + 1) + shard + 1,
        order_id=1,
        recipe=RECIPE,
        dataset_digest="0x" + "00" * 32,
        seed=SEED,
        round_index=round_index,
        shard=shard,
        start_step=round_index * H,
        steps=0 if fields.get("kind") == UnitKind.AGGREGATE else H,
        checkpoint_every=H // 2 if fields.get("kind") != UnitKind.AGGREGATE else 1,
        num_shards=M,
        start_state=start,
        **fields,
    )


def _train(work: UnitWork, start: Any) -> Any:
    from veritrain import pol
    from veritrain.agentkit import unit_spec_of
    from veritrain.datasets import load_dataset
    from veritrain.recipes import get_recipe

    return pol.execute_unit(load_dataset(get_recipe(RECIPE).dataset), unit_spec_of(work), start)


def _round0(blobs: _Blobs) -> list[Any]:
    """Round 0's shard units, the same in both modes: each trains from the genesis."""
    from veritrain.agentkit import unit_start_of

    genesis = StateSource(state_digest=None)
    return [_train(_work(0, m, genesis), unit_start_of(_work(0, m, genesis), blobs)) for m in range(M)]


def _folded_round1(blobs: _Blobs, round0: list[Any], shard: int) -> UnitWork:
    """Shard unit (1, m) of a folded order: round 0's state (the genesis), results and outer config."""
    return _work(
        1,
        shard,
        StateSource(state_digest=None),
        shard_results=tuple(blobs.source(execution.final_state) for execution in round0),
        outer=OUTER,
        previous=blobs.source(round0[shard].final_state),
    )


def test_a_folded_unit_starts_from_the_aggregate_then_unit_start_state_bitwise() -> None:
    import torch

    from veritrain import diloco, pol
    from veritrain.agentkit import folded_start_of, unit_start_of

    blobs = _Blobs()
    round0 = _round0(blobs)
    work = _folded_round1(blobs, round0, shard=1)
    assert work.folds
    folded = folded_start_of(work, blobs)
    genesis = diloco.order_genesis(pol.get_recipe(RECIPE), SEED, M)
    inputs = diloco.AggregateInputs(0, genesis, tuple(e.final_state for e in round0), OUTER.config())
    aggregate = diloco.aggregate(inputs)  # what round 0's aggregate unit computes for a "unit" order
    expected = diloco.unit_start_state(aggregate.output_state, round0[1].final_state)
    assert sorted(folded.start_state) == sorted(expected)
    assert all(torch.equal(folded.start_state[name], expected[name]) for name in expected)
    assert pol.state_digest(unit_start_of(work, blobs)) == pol.state_digest(expected)
    assert folded.fold == diloco.Fold(aggregate.output_digest, aggregate.inputs_commitment)
    assert folded.fold.digest() == aggregate.result_digest  # the digest the replaced aggregate reveals
    # the result binds the fold: another outer step, or none, opens another result digest
    trained = _train(work, folded.start_state).result_digest
    bound = diloco.folded_result_digest(trained, folded.fold)
    assert bound not in (trained, diloco.folded_result_digest(trained, diloco.Fold(bytes(32), bytes(32))))


def test_a_folded_order_reaches_the_unit_orders_final_state() -> None:
    """Same seed, M = 2, 2 rounds: by construction (the fold is ``aggregate`` over the same inputs) every
    round-1 unit starts from the same bytes, so results and the last aggregate's output are equal."""
    from veritrain import diloco, pol
    from veritrain.agentkit import aggregate_inputs_of, folded_start_of, unit_start_of

    blobs = _Blobs()
    round0 = _round0(blobs)
    results0 = tuple(blobs.source(execution.final_state) for execution in round0)
    # "unit": round 0's aggregate unit, then round 1 from its output
    aggregate0 = diloco.aggregate(
        aggregate_inputs_of(
            _work(
                0,
                M,
                StateSource(state_digest=None),
                kind=UnitKind.AGGREGATE,
                shard_results=results0,
                outer=OUTER,
            ),
            blobs,
        )
    )
    state1 = blobs.source(aggregate0.output_state)
    unit_round1 = [
        _train(work, unit_start_of(work, blobs))
        for work in (_work(1, m, state1, previous=results0[m]) for m in range(M))
    ]
    # "folded": round 1's units run round 0's outer step themselves
    folded_starts = [folded_start_of(_folded_round1(blobs, round0, m), blobs) for m in range(M)]
    folded_round1 = [_train(_work(1, m, state1), start.start_state) for m, start in enumerate(folded_starts)]
    assert {pol.state_digest(start.round_state) for start in folded_starts} == {aggregate0.output_digest}
    assert [e.result_digest for e in folded_round1] == [e.result_digest for e in unit_round1]

    def last_aggregate(round_state: Any, executions: list[Any]) -> bytes:
        results = tuple(blobs.source(execution.final_state) for execution in executions)
        work = _work(
            1, M, blobs.source(round_state), kind=UnitKind.AGGREGATE, shard_results=results, outer=OUTER
        )
        return diloco.aggregate(aggregate_inputs_of(work, blobs)).output_digest

    unit_final = last_aggregate(aggregate0.output_state, unit_round1)
    assert last_aggregate(folded_starts[0].round_state, folded_round1) == unit_final
    assert unit_final != aggregate0.output_digest


def test_the_verifier_accepts_an_honest_folded_unit_and_convicts_a_skipped_or_forged_outer_step() -> None:
    from verifier.calibrate import load_tolerances
    from verifier.core import Submission, UnitRequest, Verdict, VerifierPolicy, verify_unit
    from veritrain import diloco, pol
    from veritrain.agentkit import folded_start_of, unit_spec_of
    from veritrain.datasets import load_dataset
    from veritrain.recipes import get_recipe

    blobs = _Blobs()
    round0 = _round0(blobs)
    work = _folded_round1(blobs, round0, shard=0)
    folded = folded_start_of(work, blobs)  # the verifier's own recomputation
    spec, recipe = unit_spec_of(work), get_recipe(RECIPE)
    dataset = load_dataset(recipe.dataset)

    class Evidence:
        def __init__(self, execution: Any) -> None:
            self.execution = execution

        def checkpoint(self, step: int) -> Any:
            return self.execution.checkpoints[step]

    def submission(provider: str, start: Any, claimed: diloco.Fold) -> Submission:
        execution = pol.execute_unit(dataset, spec, start)
        return Submission(
            provider=provider,
            result_digest=diloco.folded_result_digest(execution.result_digest, claimed),
            transcript=execution.transcript,
            evidence=Evidence(execution),
            fold=claimed,
        )

    genesis = diloco.order_genesis(recipe, SEED, M)
    skipped_start = diloco.unit_start_state(genesis, round0[0].final_state)  # θ_0: no outer step at all
    other_inputs = diloco.aggregate(
        diloco.AggregateInputs(0, genesis, (round0[0].final_state, None), diloco.OuterConfig("mean"))
    )
    submissions = [
        submission("0x" + "a" * 40, folded.start_state, folded.fold),
        # trained from θ_0 and claims the honest outer step
        submission("0x" + "b" * 40, skipped_start, folded.fold),
        # trained from θ_0 and claims it as its outer step's output
        submission(
            "0x" + "c" * 40,
            skipped_start,
            diloco.Fold(pol.state_digest(genesis), folded.fold.inputs_commitment),
        ),
        # ran the outer step over round 0 without shard 1's result
        submission(
            "0x" + "d" * 40,
            diloco.unit_start_state(other_inputs.output_state, round0[0].final_state),
            diloco.Fold(other_inputs.output_digest, other_inputs.inputs_commitment),
        ),
    ]
    request = UnitRequest(
        spec=spec,
        start_state=folded.start_state,
        data_order_commitment=pol.data_order_commitment(recipe, dataset, spec),
        randomness=b"\x11" * 32,
        spot_checked=True,
        fold=folded.fold,
    )

    def reexecute(state: Any, start: int, end: int) -> Any:
        return pol.train_steps(recipe, dataset, dict(state), spec, start, end)

    decision = verify_unit(request, submissions, reexecute, load_tolerances(RECIPE), VerifierPolicy())
    assert decision.verdicts() == (Verdict.ACCEPT, Verdict.FRAUD, Verdict.FRAUD, Verdict.FRAUD)
    reasons = [replica.reason for replica in decision.replicas]
    assert "skipped" in reasons[1] and "forged" in reasons[2] and "other inputs" in reasons[3]
    assert decision.accepted_result == submissions[0].result_digest and decision.reexecuted_steps > 0
    # a manifest that names no outer step cannot open a folded unit's result: unverifiable, a fault
    bare = Submission(**{**submissions[0].__dict__, "fold": None})
    assert verify_unit(request, [bare], reexecute, load_tolerances(RECIPE)).verdicts() == (Verdict.FAULT,)
