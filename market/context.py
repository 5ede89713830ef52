"""Plumbing every market lifecycle shares: the configuration, the clock, the task triggers and the one
:class:`MarketContext` (store, recipes, chain) they all work over.

Why one context object: tests and the composition root swap ``config`` or ``triggers`` after building
the market; each lifecycle reads them through the same context, so the change reaches all of them.

Rules every lifecycle keeps:
- Input is checked completely (signature, freshness, state) *before* anything is written, inside one
  transaction, so refused input changes nothing.
- A state change that needs a chain transaction writes a settlement-outbox intent in the same
  transaction; only :meth:`market.outbox.SettlementOutbox.send_outbox_entry` talks to the chain, and it
  is idempotent.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlmodel import Session

from market.domain.replication import DEFAULT_POLICY, ReplicationPolicy
from market.domain.states import ReplicaState
from market.ports import RecipeCatalog, SettlementPort
from market.store import AgentRow, HeartbeatRow, MarketStore, ReplicaRow, UnitRow
from veritrain.errors import InvalidSignature, MarketError, NotFound
from veritrain.messages import AgentMessage, AgentRole, ReplicaResult, require_fresh


@dataclass(frozen=True)
class MarketConfig:
    chain_id: int = 31337
    heartbeat_timeout_s: int = 30
    accept_timeout_s: int = 60
    max_skew_s: int = 300
    unit_time_budget_s: int = 600
    commit_window_s: int = 600
    reveal_window_s: int = 600
    verdict_window_s: int = 1200
    verifiers_per_unit: int = 2
    min_verifiers: int = 1
    # round audits (market/round_audits.py): a roster is opened with verifiers_per_unit verifiers, who
    # audit its drawn units off chain; a round whose audit has no quorum within round_audit_timeout_s has
    # its drawn units set aside for a verdict. False: rosters have no verifiers (every drawn unit set aside)
    round_audits: bool = True
    round_audit_timeout_s: int = 300
    provider_collateral: int = 0  # used only without a chain (benchmarks); the chain's value wins
    pool_refresh_s: float = 5.0
    # chain events are applied only this many blocks below the head, so a reorg of up to this depth never
    # touches what the market applied (0 suits a dev chain that mines a block only per transaction)
    confirmations: int = 0
    # custody of live states (market/custody.py): other agents asked to keep each state an open order may
    # still start from; one that has not reported holding it within custody_timeout_s no longer counts;
    # a round waits up to custody_wait_s for a custodian of its start state (0: it does not wait; the
    # deployed market's default is VERITRAIN_CUSTODY_WAIT_S)
    custody_copies: int = 1
    custody_timeout_s: int = 60
    custody_wait_s: int = 0
    policy: ReplicationPolicy = DEFAULT_POLICY
    # share of verified round-0 units replayed as canary units (market/canary.py), in ppm; 0: none. Off
    # here (tests, benchmarks); the deployed market's default is VERITRAIN_CANARY_RATE_PPM
    canary_rate_ppm: int = 0
    # planted cheats for the verifiers (market/canary.py): the operator's plant agents, which only planted
    # units are routed to (and which never run a buyer's unit), and the share of verified round-0 units
    # replayed as one, in ppm; besides those named here, the keys `plant_authority` (the canary account)
    # enrolls at run time (POST /agents/plants), as its plant agent moves to a fresh key once caught
    plant_agents: frozenset[str] = frozenset()
    plant_authority: str | None = None
    plant_rate_ppm: int = 0

    @property
    def runs_plants(self) -> bool:
        """Whether the operator can have plants: named ones, or an authority that enrolls them."""
        return bool(self.plant_agents) or self.plant_authority is not None


def unix_now() -> int:
    return int(time.time())


def _ignore(*_args: object) -> None:
    """No task engine wired in (tests, benchmarks): the periodic tick does the work."""


@dataclass(frozen=True)
class Triggers:
    """Ask the task engine to run a step now instead of at the next tick (wired in by `market.tasks`).

    ``match(refresh_pool)``: units are waiting for providers; ``refresh_pool`` when an agent's
    registration, offer or liveness changed, since the matcher's pool lives in the worker process.
    ``advance()``: a unit settled, so its round may close and the next one open.
    ``settle()``: a settlement intent is waiting in the outbox (or waited for one that just landed).
    """

    match: Callable[[bool], None] = _ignore
    advance: Callable[[], None] = _ignore
    settle: Callable[[], None] = _ignore


NO_TRIGGERS = Triggers()


@dataclass
class MarketContext:
    """The store, recipes and chain port every lifecycle works over, with the mutable config and triggers."""

    store: MarketStore
    recipes: RecipeCatalog
    chain: SettlementPort | None
    config: MarketConfig
    clock: Callable[[], int] = unix_now
    triggers: Triggers = field(default=NO_TRIGGERS)

    def job_market(self) -> str:
        if self.chain is None:
            raise MarketError("the market has no chain configured")
        return self.chain.job_market_address

    def accept_agent_message(self, session: Session, message: AgentMessage, now: int) -> HeartbeatRow:
        """Replay guard shared by all agent messages: one nonce/timestamp sequence per agent."""
        guard = self.store.heartbeat_of(session, message.agent, for_update=True)
        require_fresh(
            guard.last_nonce if guard else None,
            guard.last_timestamp if guard else None,
            message.nonce,
            message.timestamp,
            now,
            self.config.max_skew_s,
        )
        if guard is None:
            guard = HeartbeatRow(agent=message.agent)
        guard.last_nonce = message.nonce
        guard.last_timestamp = message.timestamp
        guard.received_at = now
        session.add(guard)
        return guard

    def live_replicas(self, session: Session, unit: UnitRow) -> list[ReplicaRow]:
        return [
            r for r in self.store.replicas_of(session, row_id(unit)) if r.state != ReplicaState.DROPPED.value
        ]

    def replica_results(self, session: Session, unit: UnitRow) -> tuple[ReplicaResult, ...]:
        """What a verifier re-executes a unit against: each live replica's claimed result and where its
        provider serves it (a per-unit verification job's view and a round audit's, alike)."""
        results = []
        for replica in self.live_replicas(session, unit):
            agent = self.store.find_agent(session, replica.provider)
            results.append(
                ReplicaResult(
                    provider=replica.provider,
                    result_digest=replica.result_digest,
                    state_digest=replica.state_digest,
                    transcript_root=replica.transcript_root,
                    p2p_addr=agent.p2p_addr if agent else "",
                )
            )
        return tuple(results)

    def plant_addresses(self, session: Session) -> frozenset[str]:
        """The operator's plant keys: named in the config, or enrolled by its plant authority."""
        if self.config.plant_authority is None:
            return self.config.plant_agents
        return self.config.plant_agents | self.store.enrolled_plants(session)

    def is_plant(self, address: str) -> bool:
        """Whether `address` is one of the operator's plant keys (the store is asked only when the
        market has a plant authority, so a market without one pays no query)."""
        if address in self.config.plant_agents:
            return True
        if self.config.plant_authority is None:
            return False
        with self.store.transaction() as session:
            return self.store.is_enrolled_plant(session, address)

    def plant_agents(self, session: Session) -> list[AgentRow]:
        """The operator's plant agents that registered as providers."""
        plants = self.plant_addresses(session)
        providers = self.store.agents(session, AgentRole.PROVIDER.value)
        return [agent for agent in providers if agent.address in plants]


class Lifecycle:
    """Base of the lifecycle modules and of their composition: the shared plumbing, read through the
    context on every use (so swapping ``config`` or ``triggers`` anywhere reaches every lifecycle)."""

    def __init__(self, ctx: MarketContext) -> None:
        self.ctx = ctx

    @property
    def store(self) -> MarketStore:
        return self.ctx.store

    @property
    def recipes(self) -> RecipeCatalog:
        return self.ctx.recipes

    @property
    def chain(self) -> SettlementPort | None:
        return self.ctx.chain

    @property
    def config(self) -> MarketConfig:
        return self.ctx.config

    @config.setter
    def config(self, config: MarketConfig) -> None:
        self.ctx.config = config

    @property
    def triggers(self) -> Triggers:
        return self.ctx.triggers

    @triggers.setter
    def triggers(self, triggers: Triggers) -> None:
        self.ctx.triggers = triggers

    def clock(self) -> int:
        return self.ctx.clock()


def require_signer(domain: Any, primary: str, message: dict[str, Any], signature: str, expected: str) -> None:
    from veritrain.chain.eip712 import recover_typed

    try:
        recovered = recover_typed(domain, primary, message, bytes.fromhex(signature[2:]))
    except Exception as exc:  # malformed v/r/s
        raise InvalidSignature(f"{primary} signature cannot be recovered: {exc}") from exc
    if recovered != expected:
        raise InvalidSignature(f"{primary} must be signed by {expected}, recovered {recovered}")


def row_id(row: Any) -> int:
    """Primary key of a flushed row (None only before flush, which the market never reads)."""
    if row.id is None:
        raise NotFound(f"{type(row).__name__} has no id yet")
    return int(row.id)
