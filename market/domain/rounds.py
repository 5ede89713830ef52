"""Rounds: which units a round runs, when it may close, and what its next start state is. Pure, no IO.

M = 1 (sequential training): one training unit per round; its accepted state is the next round's start.
M > 1 (DiLoCo, DESIGN.md §3): M training units, one per shard, then one **aggregate unit** over the
accepted shard results; the aggregate's accepted output is the next round's start. A shard whose unit
failed is re-assigned (a new attempt under a new unit key); with a shard quorum q < M the round goes on
without it once q shards are accepted. A round never closes on a unit that is not accepted.

M > 1 with ``outer_step="folded"``: no aggregate unit between rounds. A round closes once its shards are
accepted; each shard unit of round r >= 1 runs round r-1's outer step itself (over round r-1's state and
accepted results) and reports the output, round r's state. Only the last round is followed by an aggregate
unit, whose output is the buyer's final state as for "unit" orders; except on the round path, where the
order ends with its last round and the buyer runs that outer step itself over the results the chain
accepted (apps/buyer.py `final_outer_step`: deterministic, every input checked against its digest on chain).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from market.domain.states import UnitState
from veritrain.errors import MarketError
from veritrain.messages import OrderSpec, UnitKind


@dataclass(frozen=True, slots=True)
class UnitPlan:
    """One unit of a round: run ``steps`` optimizer steps from ``start_step`` on data shard ``shard``; an
    aggregate unit runs no optimizer steps (``steps`` 0) and takes the shard number M."""

    round_index: int
    shard: int
    start_step: int
    steps: int
    kind: UnitKind = UnitKind.TRAIN


@dataclass(frozen=True, slots=True)
class AcceptedReplica:
    """A replica of a unit that settlement accepted, with the state it produced."""

    unit_id: int
    provider: str
    state_digest: str
    round_state_digest: str | None = None  # a folded shard unit's outer step output (its round's state)


@dataclass(frozen=True, slots=True)
class RoundDecision:
    """What a round of an M > 1 order needs next: shards to re-assign, or the accepted shards to aggregate
    over (None while the round still waits for units in flight)."""

    retry: tuple[int, ...] = ()
    aggregate_over: tuple[int, ...] | None = None


def plan_round(spec: OrderSpec, round_index: int) -> list[UnitPlan]:
    """The training units of one round: each runs ``unit_steps`` from the round's first step on its shard."""
    if not 0 <= round_index < spec.rounds:
        raise MarketError(f"round {round_index} is outside the order's {spec.rounds} rounds")
    start = round_index * spec.unit_steps
    steps = min(spec.unit_steps, spec.total_steps - start)
    return [UnitPlan(round_index, shard, start, steps) for shard in range(spec.shards)]


def plan_aggregate(spec: OrderSpec, round_index: int) -> UnitPlan:
    """The aggregate unit of a round of an M > 1 order (shard number M keeps its unit key apart)."""
    if spec.shards < 2:
        raise MarketError("only an order with M >= 2 shards has aggregate units")
    end = min((round_index + 1) * spec.unit_steps, spec.total_steps)
    return UnitPlan(round_index, spec.shards, end, 0, UnitKind.AGGREGATE)


def folds(spec: OrderSpec, round_index: int) -> bool:
    """Whether the shard units of this round run the previous round's outer step themselves."""
    return spec.outer_step == "folded" and round_index >= 1


def aggregates_after(spec: OrderSpec, round_index: int, *, rounds_path: bool = False) -> bool:
    """Whether an aggregate unit closes this round once its shards are accepted (every round of an M > 1
    order, or only the last one when the outer step is folded into the shard units, and then not for an
    order settled on the round path: `final_aggregate`)."""
    if spec.shards < 2:
        return False
    return spec.outer_step == "unit" or (
        round_index == spec.rounds - 1 and final_aggregate(spec, rounds_path)
    )


def final_aggregate(spec: OrderSpec, rounds_path: bool) -> bool:
    """Whether the order ends with an aggregate unit after its last round. An order settled on the round
    path does not (even where its units fall back to the per-unit path): its last outer step is a
    deterministic function of the last round's results, whose digests the chain accepted, so the buyer
    computes it itself and checks every input against them (another unit would only re-run it at ~300k gas
    and k replicas' pay). Its escrow still counts that unit (`OrderSpec.unit_count`): the round path's
    reserve for a per-unit retry, whose verifier fee the failed attempt spent (refunded if unused)."""
    return spec.shards > 1 and not (rounds_path and spec.outer_step == "folded")


def decide_shards(spec: OrderSpec, latest: Mapping[int, UnitState]) -> RoundDecision:
    """Given the state of each training shard's latest attempt, re-assign failed shards while the quorum
    still needs them; once every shard is settled and at least the quorum is accepted, aggregate."""
    if set(latest) != set(range(spec.shards)):
        raise MarketError(f"a round of {spec.shards} shards has units for shards {sorted(latest)}")
    accepted = tuple(s for s in sorted(latest) if latest[s] == UnitState.ACCEPTED)
    failed = tuple(s for s in sorted(latest) if latest[s] == UnitState.FAILED)
    if len(accepted) < spec.quorum and failed:
        return RoundDecision(retry=failed)
    if len(accepted) + len(failed) < spec.shards:
        return RoundDecision()  # units in flight: a round never cuts a running unit
    return RoundDecision(aggregate_over=accepted)


def next_state(round_index: int, accepted: Sequence[AcceptedReplica]) -> str:
    """The state a round's closing unit (M = 1: its training unit; M > 1: its aggregate unit) hands to the
    next round: the accepted replicas' state (the majority digest if accepted replicas of a training unit
    disagree within tolerance, ties broken by assignment order)."""
    return _majority(round_index, [replica.state_digest for replica in accepted])


def folded_round_state(round_index: int, accepted: Sequence[AcceptedReplica]) -> str:
    """The state a folded round's shard units computed by their outer step (the majority of the accepted
    replicas' reports; honest ones agree bit for bit), from which the next round's outer step starts."""
    return _majority(round_index, [r.round_state_digest for r in accepted if r.round_state_digest])


def _majority(round_index: int, digests: Sequence[str]) -> str:
    """The most reported digest, ties broken by report order."""
    if not digests:
        raise MarketError(f"round {round_index}: no accepted replica to take the state from")
    counts = Counter(digests)
    best = max(counts.values())
    return next(digest for digest in digests if counts[digest] == best)
