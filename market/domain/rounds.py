"""Rounds and the outer-step seam: how accepted unit results become the next round's start state.

M = 1 (plain sequential training) is a pass-through: the accepted state is the next start state. M > 1
is DiLoCo (each unit trains on its own shard; the accepted pseudo-gradients are averaged and an outer
Nesterov step is applied). That needs the tensors, so it runs in an agent, not here; the interface is
present so the round logic does not change when it lands.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from veritrain.errors import MarketError, OuterStepNotImplemented
from veritrain.messages import OrderSpec


@dataclass(frozen=True, slots=True)
class UnitPlan:
    """One unit of a round: run ``steps`` optimizer steps from ``start_step`` on data shard ``shard``."""

    round_index: int
    shard: int
    start_step: int
    steps: int


@dataclass(frozen=True, slots=True)
class AcceptedReplica:
    """A replica of a unit that settlement accepted, with the state it produced."""

    unit_id: int
    provider: str
    state_digest: str


class OuterStep(Protocol):
    """Turns the accepted results of round ``round_index`` into the next round's start state digest."""

    units_per_round: int

    def next_state(
        self, round_index: int, start_state: str | None, accepted_by_unit: Sequence[Sequence[AcceptedReplica]]
    ) -> str: ...


class PassThroughOuterStep:
    """M = 1: the round's single accepted state is the next start state (the majority digest if the
    accepted replicas disagree within tolerance, ties broken by assignment order)."""

    units_per_round = 1

    def next_state(
        self, round_index: int, start_state: str | None, accepted_by_unit: Sequence[Sequence[AcceptedReplica]]
    ) -> str:
        if len(accepted_by_unit) != 1:
            raise MarketError(f"round {round_index}: M = 1 expects one unit, got {len(accepted_by_unit)}")
        accepted = accepted_by_unit[0]
        if not accepted:
            raise MarketError(f"round {round_index}: no accepted replica to take the state from")
        counts = Counter(replica.state_digest for replica in accepted)
        best = max(counts.values())
        return next(r.state_digest for r in accepted if counts[r.state_digest] == best)


class DiLoCoOuterStep:
    """M > 1: average pseudo-gradients of the accepted shards and apply an outer Nesterov step."""

    def __init__(self, units_per_round: int, outer_lr: float = 0.7, momentum: float = 0.9) -> None:
        if units_per_round < 2:
            raise ValueError("DiLoCo needs at least two units per round")
        self.units_per_round = units_per_round
        self.outer_lr = outer_lr
        self.momentum = momentum

    def next_state(
        self, round_index: int, start_state: str | None, accepted_by_unit: Sequence[Sequence[AcceptedReplica]]
    ) -> str:
        raise OuterStepNotImplemented(
            f"round {round_index}: the DiLoCo outer step (M = {self.units_per_round}) is not "
            "implemented yet; orders run with M = 1"
        )


def outer_step_for(units_per_round: int) -> OuterStep:
    return PassThroughOuterStep() if units_per_round == 1 else DiLoCoOuterStep(units_per_round)


def plan_round(spec: OrderSpec, round_index: int, units_per_round: int = 1) -> list[UnitPlan]:
    """Units of one round: each runs ``unit_steps`` from the round's first step on its own shard."""
    if not 0 <= round_index < rounds_in(spec):
        raise MarketError(f"round {round_index} is outside the order's {rounds_in(spec)} rounds")
    start = round_index * spec.unit_steps
    steps = min(spec.unit_steps, spec.total_steps - start)
    return [UnitPlan(round_index, shard, start, steps) for shard in range(units_per_round)]


def rounds_in(spec: OrderSpec) -> int:
    return spec.unit_count
