"""Order, round, unit and replica state machines with their allowed transitions listed explicitly.

Every state change in the market goes through :func:`advance`, so a transition a machine does not list
(a finished unit being re-assigned, a failed unit paid) is an :class:`IllegalTransition`, not a silent
overwrite. The store persists the ``.value`` strings.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

from veritrain.errors import IllegalTransition


class OrderState(StrEnum):
    OPEN = "open"  # registered, escrow checked, no unit assigned yet
    RUNNING = "running"
    COMPLETED = "completed"  # every round accepted
    EXPIRED = "expired"  # deadline passed before completion
    CANCELLED = "cancelled"


class RoundState(StrEnum):
    OPEN = "open"
    ACCEPTED = "accepted"  # outer step applied; the next round may start
    ABANDONED = "abandoned"  # the order ended first


class UnitState(StrEnum):
    PENDING = "pending"  # waiting for matching
    PROPOSED = "proposed"  # replicas chosen, collecting their Accept signatures
    ASSIGNING = "assigning"  # all signed; the assign transaction is in the outbox
    COMMITTING = "committing"  # assigned on chain; replicas run and commit
    REVEALING = "revealing"  # commit phase over; collecting reveals
    FINALIZING = "finalizing"  # unanimous and not drawn: finalize is in the outbox
    VERIFYING = "verifying"  # digests differ or spot-check drawn: verifiers decide
    ACCEPTED = "accepted"  # settled with at least one accepted replica
    FAILED = "failed"  # expired, or no replica accepted: the round needs a new attempt
    # a round-path order's training unit (market/rosters.py): its slots' works and openings go to the roster,
    # which settles it on chain by stepRound; accepted once every slot opened the same result and the chain
    # will not set it aside, else verifying once the step set it aside (its verdict settles it)
    ROSTERED = "rostered"


class ReplicaState(StrEnum):
    PROPOSED = "proposed"
    SIGNED = "signed"  # Accept signature received
    COMMITTED = "committed"
    REVEALED = "revealed"
    ACCEPTED = "accepted"  # paid
    FAULT = "fault"
    FRAUD = "fraud"
    DROPPED = "dropped"  # replaced before the unit went on chain (lost agent, no signature in time)


ORDER_TRANSITIONS: dict[OrderState, frozenset[OrderState]] = {
    OrderState.OPEN: frozenset({OrderState.RUNNING, OrderState.EXPIRED, OrderState.CANCELLED}),
    # cancelled while running: a canary order whose one unit failed is not retried (market/canary.py)
    OrderState.RUNNING: frozenset({OrderState.COMPLETED, OrderState.EXPIRED, OrderState.CANCELLED}),
    OrderState.COMPLETED: frozenset(),
    OrderState.EXPIRED: frozenset(),
    OrderState.CANCELLED: frozenset(),
}

ROUND_TRANSITIONS: dict[RoundState, frozenset[RoundState]] = {
    RoundState.OPEN: frozenset({RoundState.ACCEPTED, RoundState.ABANDONED}),
    RoundState.ACCEPTED: frozenset(),
    RoundState.ABANDONED: frozenset(),
}

UNIT_TRANSITIONS: dict[UnitState, frozenset[UnitState]] = {
    UnitState.PENDING: frozenset({UnitState.PROPOSED, UnitState.FAILED}),
    UnitState.PROPOSED: frozenset({UnitState.ASSIGNING, UnitState.PENDING, UnitState.FAILED}),
    UnitState.ASSIGNING: frozenset({UnitState.COMMITTING, UnitState.PENDING, UnitState.FAILED}),
    UnitState.COMMITTING: frozenset({UnitState.REVEALING, UnitState.FAILED}),
    UnitState.REVEALING: frozenset({UnitState.FINALIZING, UnitState.VERIFYING, UnitState.FAILED}),
    UnitState.FINALIZING: frozenset({UnitState.ACCEPTED, UnitState.VERIFYING, UnitState.FAILED}),
    UnitState.VERIFYING: frozenset({UnitState.ACCEPTED, UnitState.FAILED}),
    # PENDING: its roster never opened and the order fell back to the per-unit path (market/rosters.py)
    UnitState.ROSTERED: frozenset(
        {UnitState.ACCEPTED, UnitState.VERIFYING, UnitState.FAILED, UnitState.PENDING}
    ),
    UnitState.ACCEPTED: frozenset(),
    UnitState.FAILED: frozenset(),
}

REPLICA_TRANSITIONS: dict[ReplicaState, frozenset[ReplicaState]] = {
    ReplicaState.PROPOSED: frozenset({ReplicaState.SIGNED, ReplicaState.DROPPED}),
    ReplicaState.SIGNED: frozenset({ReplicaState.COMMITTED, ReplicaState.DROPPED, ReplicaState.FAULT}),
    ReplicaState.COMMITTED: frozenset({ReplicaState.REVEALED, ReplicaState.FAULT}),
    ReplicaState.REVEALED: frozenset({ReplicaState.ACCEPTED, ReplicaState.FAULT, ReplicaState.FRAUD}),
    ReplicaState.ACCEPTED: frozenset(),
    ReplicaState.FAULT: frozenset(),
    ReplicaState.FRAUD: frozenset(),
    ReplicaState.DROPPED: frozenset(),
}

TERMINAL_UNIT_STATES = frozenset({UnitState.ACCEPTED, UnitState.FAILED})
TERMINAL_REPLICA_STATES = frozenset(
    {ReplicaState.ACCEPTED, ReplicaState.FAULT, ReplicaState.FRAUD, ReplicaState.DROPPED}
)
ON_CHAIN_UNIT_STATES = frozenset(
    {UnitState.COMMITTING, UnitState.REVEALING, UnitState.FINALIZING, UnitState.VERIFYING}
)

S = TypeVar("S", OrderState, RoundState, UnitState, ReplicaState)

_TABLES: dict[type, dict] = {
    OrderState: ORDER_TRANSITIONS,
    RoundState: ROUND_TRANSITIONS,
    UnitState: UNIT_TRANSITIONS,
    ReplicaState: REPLICA_TRANSITIONS,
}


def can_advance(current: S, target: S) -> bool:
    return target in _TABLES[type(current)][current]


def advance(current: S, target: S, *, what: str = "") -> S:
    """``target`` if the machine allows ``current -> target``, else :class:`IllegalTransition`."""
    if type(current) is not type(target):
        raise IllegalTransition(f"{what or type(current).__name__}: cannot mix {current!r} and {target!r}")
    if not can_advance(current, target):
        allowed = sorted(s.value for s in _TABLES[type(current)][current]) or ["none (terminal)"]
        raise IllegalTransition(
            f"{what or type(current).__name__}: {current.value} -> {target.value} is not allowed "
            f"(allowed: {', '.join(allowed)})"
        )
    return target


def settle_to(current: S, target: S, *, what: str = "") -> S:
    """``target``, a terminal state the chain settled on, from whatever state the market had.

    Why not :func:`advance`: the chain is the source of truth and anyone may act on it directly (a
    provider revealing straight on chain finalizes a unit the market still has as committed). The market
    catches up instead of refusing the chain's fact, which would stall every later event.
    """
    terminal = {UnitState: TERMINAL_UNIT_STATES, ReplicaState: TERMINAL_REPLICA_STATES}.get(type(current))
    if terminal is None or type(current) is not type(target) or target not in terminal:
        raise IllegalTransition(f"{what or type(current).__name__}: {target!r} is not a settled state")
    return target
