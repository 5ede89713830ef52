"""The market service: every operation of the control plane, over the store, the chain port and the
pure domain core. The API and the Celery tasks are thin callers of this class.

Rules every method keeps:
- Input is checked completely (signature, freshness, state) *before* anything is written, inside one
  transaction, so refused input changes nothing.
- A state change that needs a chain transaction writes a settlement-outbox intent in the same
  transaction; only :meth:`MarketService.send_outbox_entry` talks to the chain, and it is idempotent.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from eth_abi import encode as abi_encode
from eth_utils import keccak, to_checksum_address
from sqlmodel import Session

from market.domain.matching import CandidatePool, Match, ProviderCandidate, UnitDemand
from market.domain.pricing import escrow_plan
from market.domain.replication import (
    DEFAULT_POLICY,
    ReplicationPolicy,
    Reputation,
    audit_rate_ppm,
    spot_check_drawn,
)
from market.domain.rounds import AcceptedReplica, outer_step_for, plan_round
from market.domain.states import (
    OrderState,
    ReplicaState,
    RoundState,
    UnitState,
    advance,
)
from market.ports import RecipeCatalog, SettlementPort, SignedAccept, SignedVerdict
from market.store import (
    AgentRow,
    HeartbeatRow,
    MarketStore,
    OfferRow,
    OrderRow,
    OutboxRow,
    ReplicaRow,
    RoundRow,
    UnitRow,
    VerdictSignatureRow,
    VerificationJobRow,
)
from veritrain.errors import (
    IllegalTransition,
    InvalidInput,
    InvalidSignature,
    MarketError,
    NotFound,
    OrderMismatch,
    UnderfundedOrder,
    UnknownRecipe,
)
from veritrain.messages import (
    AcceptSubmission,
    AgentMessage,
    AgentRole,
    Assignment,
    AssignmentPhase,
    CommitSubmission,
    Heartbeat,
    HeartbeatReply,
    Offer,
    OrderRequest,
    OrderSpec,
    OrderStatus,
    Registration,
    ReplicaOutcome,
    ReplicaResult,
    RevealSubmission,
    Signed,
    StateSource,
    UnitStatus,
    VerdictSubmission,
    VerificationJobsReply,
    VerificationJobView,
    require_fresh,
    verify_signed,
)

OUTBOX_MAX_ATTEMPTS = 5
OUTBOX_LEASE_S = 60
# Reverts that mean "this settlement already happened": the intent is done, not failed.
ALREADY_SETTLED_ERRORS = frozenset({"UnitAlreadySettled", "InvalidUnitState"})
# Events that change an account's free stake (by the name of the account argument) ...
STAKE_EVENTS = {
    "Staked": "account",
    "UnstakeRequested": "account",
    "StakeWithdrawn": "account",
    "StakeSlashed": "account",
    "ReplicaSlashed": "provider",
}
# ... and unit events that lock or release collateral and write reputation for every replica's provider.
UNIT_SETTLEMENT_EVENTS = frozenset({"UnitAssigned", "UnitFinalized", "VerdictRecorded", "UnitExpired"})
# Outbox actions that end a unit: its round may close (or a retry open) right away.
SETTLING_ACTIONS = frozenset({"finalize", "verdict", "expire"})
# Outbox actions that lock (assign) or release and slash (the settling ones) providers' stake.
STAKE_CHANGING_ACTIONS = SETTLING_ACTIONS | {"assign"}


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
    verifier_quorum: int = 1
    units_per_round: int = 1
    provider_collateral: int = 0  # used only without a chain (benchmarks); the chain's value wins
    pool_refresh_s: float = 5.0
    policy: ReplicationPolicy = DEFAULT_POLICY


def unix_now() -> int:
    return int(time.time())


def unit_key_for(chain_order_id: int, round_index: int, shard: int, attempt: int) -> str:
    """keccak(abi.encode(orderId, round, shard, attempt)): unique per attempt, so a failed unit's retry
    is a new key the contract accepts as a re-assignment."""
    encoded = abi_encode(
        ["uint256", "uint32", "uint32", "uint32"], [chain_order_id, round_index, shard, attempt]
    )
    return "0x" + keccak(encoded).hex()


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
class OutboxResult:
    entry_id: int
    state: str
    sent: bool
    detail: str = ""


@dataclass
class MatchWrites:
    """Rows a matching pass writes, collected so they go out as a few executemany statements."""

    replicas: list[dict[str, Any]] = field(default_factory=list)
    logs: list[dict[str, Any]] = field(default_factory=list)
    units: list[dict[str, Any]] = field(default_factory=list)
    orders_started: set[int] = field(default_factory=set)


@dataclass
class SweepResult:
    lost_agents: list[str] = field(default_factory=list)
    dropped_replicas: int = 0
    expiring_units: int = 0


class MarketService:
    def __init__(
        self,
        store: MarketStore,
        recipes: RecipeCatalog,
        chain: SettlementPort | None = None,
        config: MarketConfig | None = None,
        clock: Callable[[], int] = unix_now,
    ) -> None:
        self.store = store
        self.recipes = recipes
        self.chain = chain
        self.config = config or MarketConfig(chain_id=chain.chain_id if chain else 31337)
        self.clock = clock
        self.pool = CandidatePool()
        self._pool_loaded_at: float | None = None
        self.triggers: Triggers = NO_TRIGGERS

    # --- agents ----------------------------------------------------------------------------------------

    def _accept_agent_message(self, session: Session, message: AgentMessage, now: int) -> HeartbeatRow:
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

    def register(self, signed: Signed[Registration]) -> AgentRow:
        """Register or update an agent from its signed Registration."""
        message = verify_signed(signed, self.config.chain_id)
        for recipe in message.recipes:
            self.recipes.lookup(recipe)  # UnknownRecipe for a name outside the registry
        now = self.clock()
        free_stake, reputation = self._chain_facts(message.agent)
        with self.store.transaction() as session:
            self._accept_agent_message(session, message, now)
            row = self.store.find_agent(session, message.agent) or AgentRow(
                address=message.agent,
                role=message.role.value,
                operator=message.operator,
                memory_mb=message.memory_mb,
                gflops=message.gflops,
                hardware_class=message.hardware_class,
                registered_at=now,
            )
            row.role = message.role.value
            row.operator = message.operator
            row.memory_mb = message.memory_mb
            row.gflops = message.gflops
            row.hardware_class = message.hardware_class
            row.recipes_json = json.dumps(list(message.recipes))
            row.p2p_addr = message.p2p_addr
            row.online = True
            row.free_stake = free_stake
            row.rep_valid, row.rep_fault = reputation.valid, reputation.fault
            row.rep_fraud, row.rep_consecutive_valid = reputation.fraud, reputation.consecutive_valid
            session.add(row)
            offer = self.store.offer_of(session, row.address)
            load = self.store.active_load(session, row.address).get(row.address, 0)
        self._refresh_candidate(row, offer, load)
        if row.role == AgentRole.PROVIDER.value:
            self.triggers.match(True)
        return row

    def _chain_facts(self, account: str) -> tuple[int, Reputation]:
        if self.chain is None:
            return 0, Reputation()
        return self.chain.free_stake(account), self.chain.reputation_of(account)

    def post_offer(self, signed: Signed[Offer]) -> OfferRow:
        message = verify_signed(signed, self.config.chain_id)
        now = self.clock()
        if message.expires_at <= now:
            raise InvalidInput(f"offer expired at {message.expires_at}, market clock is {now}")
        with self.store.transaction() as session:
            agent = self.store.get_agent(session, message.agent)
            if agent.role != AgentRole.PROVIDER.value:
                raise InvalidInput(
                    f"{message.agent} is registered as {agent.role}; only providers make offers"
                )
            self._accept_agent_message(session, message, now)
            offer = self.store.offer_of(session, message.agent) or OfferRow(
                agent=message.agent, price_per_pflop=0, expires_at=0, signed_at=0
            )
            offer.price_per_pflop = message.price_per_pflop
            offer.expires_at = message.expires_at
            offer.signed_at = message.timestamp
            session.add(offer)
            load = self.store.active_load(session, agent.address).get(agent.address, 0)
        self._refresh_candidate(agent, offer, load)
        self.triggers.match(True)
        return offer

    def heartbeat(self, signed: Signed[Heartbeat]) -> HeartbeatReply:
        """Liveness plus pull: the reply lists what the agent should do next for each of its replicas."""
        message = verify_signed(signed, self.config.chain_id)
        now = self.clock()
        with self.store.transaction() as session:
            agent = self.store.get_agent(session, message.agent)
            self._accept_agent_message(session, message, now)
            came_back = not agent.online
            agent.online = True
            session.add(agent)
            assignments = self._assignments_for(session, agent.address)
            offer = self.store.offer_of(session, agent.address)
            load = self.store.active_load(session, agent.address).get(agent.address, 0)
        if came_back:
            self._refresh_candidate(agent, offer, load)
            if agent.role == AgentRole.PROVIDER.value:
                self.triggers.match(True)
        return HeartbeatReply(agent=message.agent, assignments=tuple(assignments))

    def _assignments_for(self, session: Session, provider: str) -> list[Assignment]:
        active = [ReplicaState.PROPOSED.value, ReplicaState.SIGNED.value, ReplicaState.COMMITTED.value]
        views: list[Assignment] = []
        for replica in self.store.replicas_of_provider(session, provider, active):
            unit = self.store.get_unit(session, replica.unit_id)
            phase = _phase(UnitState(unit.state), ReplicaState(replica.state))
            if phase is None:
                continue
            order = self.store.get_order(session, unit.order_id)
            views.append(self._assignment_view(session, order, unit, replica, phase))
        return views

    def _assignment_view(
        self, session: Session, order: OrderRow, unit: UnitRow, replica: ReplicaRow, phase: AssignmentPhase
    ) -> Assignment:
        return Assignment(
            **self._unit_work(session, order, unit),
            replica_index=replica.index,
            phase=phase,
            chain_order_id=order.chain_order_id,
            unit_key=unit.unit_key,
            accept_deadline=unit.accept_deadline,
            chain_unit_id=unit.chain_unit_id,
            commit_deadline=unit.commit_deadline or None,
        )

    def _unit_work(self, session: Session, order: OrderRow, unit: UnitRow) -> dict[str, Any]:
        """The UnitWork fields shared by a provider's assignment and a verifier's job."""
        spec = OrderSpec.model_validate_json(order.spec_json)
        return {
            "unit_id": _id(unit),
            "order_id": _id(order),
            "recipe": spec.recipe,
            "dataset_digest": spec.dataset_digest,
            "seed": spec.seed,
            "round_index": unit.round_index,
            "shard": unit.shard,
            "start_step": unit.start_step,
            "steps": unit.steps,
            "checkpoint_every": spec.checkpoint_every_for(unit.steps),
            "num_shards": self.config.units_per_round,
            "start_state": self._start_state(session, unit),
        }

    def _start_state(self, session: Session, unit: UnitRow) -> StateSource:
        """The round's start state and the agents that produced it (they keep and serve the blob)."""
        round_row = self.store.get_round(session, unit.round_id)
        digest = round_row.start_state_digest
        if digest is None or round_row.index == 0:
            return StateSource(state_digest=digest)
        previous = self.store.round_of(session, unit.order_id, round_row.index - 1)
        holders: list[str] = []
        if previous is not None:
            for prior in self.store.units_of_round(session, _id(previous)):
                for replica in self.store.replicas_of(session, _id(prior)):
                    if replica.state == ReplicaState.ACCEPTED.value and replica.state_digest == digest:
                        agent = self.store.find_agent(session, replica.provider)
                        if agent is not None and agent.p2p_addr:
                            holders.append(agent.p2p_addr)
        return StateSource(state_digest=digest, holders=tuple(holders))

    # --- orders ----------------------------------------------------------------------------------------

    def post_order(self, request: OrderRequest) -> OrderRow:
        """Register a buyer's order after checking its on-chain escrow covers it at the max price."""
        spec = request.spec
        recipe = self.recipes.lookup(spec.recipe)
        now = self.clock()
        if spec.total_steps % spec.unit_steps:
            raise InvalidInput(
                f"total_steps {spec.total_steps} must be a multiple of unit_steps {spec.unit_steps}"
            )
        if spec.deadline <= now:
            raise InvalidInput(f"order deadline {spec.deadline} is not in the future (market clock {now})")
        if spec.adaptive_replication:
            raise InvalidInput(
                "adaptive replication is not available: the JobMarket assigns exactly `replicas` providers "
                "per unit of an order"
            )
        if self.chain is None:
            raise MarketError("the market has no chain configured; it cannot check an order's escrow")
        plan = escrow_plan(spec, recipe.flops_per_step)
        on_chain = self.chain.get_order(request.chain_order_id)
        if on_chain is None:
            raise OrderMismatch(f"no order {request.chain_order_id} on the JobMarket")
        mismatches = [
            f"{name}: chain {have} != spec {want}"
            for name, have, want in (
                ("spec_hash", on_chain.spec_hash.lower(), spec.spec_hash()),
                ("buyer", on_chain.buyer.lower(), spec.buyer.lower()),
                ("units", on_chain.units, plan.units),
                ("replicas", on_chain.replicas, plan.replicas),
            )
            if have != want
        ]
        if mismatches:
            raise OrderMismatch(
                f"order {request.chain_order_id} does not match its spec: " + "; ".join(mismatches)
            )
        if on_chain.price_per_replica < plan.price_per_replica or (
            on_chain.verifier_fee_per_unit < plan.verifier_fee_per_unit
        ):
            raise UnderfundedOrder(
                f"order {request.chain_order_id} escrows {on_chain.price_per_replica} per replica and "
                f"{on_chain.verifier_fee_per_unit} verifier fee per unit; {spec.unit_steps} steps of "
                f"{spec.recipe} "
                f"at max {spec.max_price_per_pflop}/PFLOP need {plan.price_per_replica} per replica and "
                f"{plan.verifier_fee_per_unit} per unit (total {plan.total})"
            )
        with self.store.transaction() as session:
            if self.store.order_by_chain_id(session, request.chain_order_id) is not None:
                raise InvalidInput(f"order {request.chain_order_id} is already registered")
            order = OrderRow(
                chain_order_id=request.chain_order_id,
                buyer=spec.buyer,
                spec_json=spec.model_dump_json(),
                spec_hash=spec.spec_hash(),
                recipe=spec.recipe,
                rounds_total=spec.unit_count,
                flops_per_step=recipe.flops_per_step,
                min_memory_mb=recipe.min_memory_mb,
                price_per_replica=on_chain.price_per_replica,
                max_price_per_pflop=spec.max_price_per_pflop,
                deadline=spec.deadline,
                created_at=now,
            )
            session.add(order)
            session.flush()
            self._open_round(session, order, spec, 0, None, now)
        self.triggers.match(False)
        return order

    def _open_round(
        self,
        session: Session,
        order: OrderRow,
        spec: OrderSpec,
        index: int,
        start_state: str | None,
        now: int,
    ) -> RoundRow:
        round_row = RoundRow(order_id=_id(order), index=index, start_state_digest=start_state)
        session.add(round_row)
        session.flush()
        for plan in plan_round(spec, index, self.config.units_per_round):
            self._new_unit(session, order, round_row, spec, plan.shard, plan.start_step, plan.steps, 0, now)
        return round_row

    def _new_unit(
        self,
        session: Session,
        order: OrderRow,
        round_row: RoundRow,
        spec: OrderSpec,
        shard: int,
        start_step: int,
        steps: int,
        attempt: int,
        now: int,
    ) -> UnitRow:
        unit = UnitRow(
            order_id=_id(order),
            round_id=_id(round_row),
            round_index=round_row.index,
            shard=shard,
            attempt=attempt,
            unit_key=unit_key_for(order.chain_order_id, round_row.index, shard, attempt),
            k=spec.replicas,
            start_step=start_step,
            steps=steps,
            updated_at=now,
        )
        session.add(unit)
        session.flush()
        return unit

    def order_status(self, order_id: int) -> OrderStatus:
        with self.store.transaction() as session:
            order = self.store.get_order(session, order_id)
            units = []
            for unit in self.store.units_of_order(session, order_id):
                replicas = self.store.replicas_of(session, _id(unit))
                accepted = [r.state_digest for r in replicas if r.state == ReplicaState.ACCEPTED.value]
                units.append(
                    UnitStatus(
                        unit_id=_id(unit),
                        round_index=unit.round_index,
                        attempt=unit.attempt,
                        state=unit.state,
                        chain_unit_id=unit.chain_unit_id,
                        providers=tuple(
                            r.provider for r in replicas if r.state != ReplicaState.DROPPED.value
                        ),
                        accepted_state_digest=accepted[0] if accepted else None,
                    )
                )
            return OrderStatus(
                order_id=order_id,
                chain_order_id=order.chain_order_id,
                state=order.state,
                rounds_total=order.rounds_total,
                rounds_accepted=order.rounds_accepted,
                current_state_digest=order.current_state_digest,
                units=tuple(units),
            )

    # --- matching --------------------------------------------------------------------------------------

    def refresh_pool(self, force: bool = False) -> None:
        """Rebuild the in-memory candidate index from the store when it is older than ``pool_refresh_s``."""
        now = time.monotonic()
        if (
            not force
            and self._pool_loaded_at is not None
            and now - self._pool_loaded_at < self.config.pool_refresh_s
        ):
            return
        with self.store.transaction() as session:
            offers = self.store.offers(session)
            load = self.store.active_load(session)
            agents = self.store.agents(session, AgentRole.PROVIDER.value)
            recipes = {name for agent in agents for name in agent.recipes}
            pool = CandidatePool(self.pool.weights, self._collateral(), self._recipe_memory(recipes))
            for agent in agents:
                pool.upsert(self._candidate(agent, offers.get(agent.address), load.get(agent.address, 0)))
        self.pool = pool
        self._pool_loaded_at = now

    def _recipe_memory(self, names: set[str]) -> dict[str, int]:
        """Memory each known recipe needs; names outside the registry are left out (never matched)."""
        needs = {}
        for name in sorted(names):
            try:
                needs[name] = self.recipes.lookup(name).min_memory_mb
            except UnknownRecipe:
                continue
        return needs

    def _candidate(self, agent: AgentRow, offer: OfferRow | None, load: int) -> ProviderCandidate:
        live = offer is not None and offer.expires_at > self.clock()
        return ProviderCandidate(
            address=agent.address,
            operator=agent.operator,
            memory_mb=agent.memory_mb,
            gflops=agent.gflops,
            hardware_class=agent.hardware_class,
            recipes=frozenset(agent.recipes),
            free_stake=agent.free_stake,
            price_per_pflop=offer.price_per_pflop if live and offer is not None else None,
            reputation=Reputation(
                agent.rep_valid, agent.rep_fault, agent.rep_fraud, agent.rep_consecutive_valid
            ),
            online=agent.online,
            active_units=load,
            capacity=agent.capacity,
        )

    def _refresh_candidate(self, agent: AgentRow, offer: OfferRow | None, load: int) -> None:
        if agent.role == AgentRole.PROVIDER.value:
            self.pool.upsert(self._candidate(agent, offer, load))

    def match_pending(
        self, limit: int = 500, latencies: list[tuple[float, float]] | None = None
    ) -> list[Match]:
        """Match up to ``limit`` pending units in one transaction; each decision is logged with declines.

        Candidates come from the in-memory pool, the batch's replicas and orders are read in one query
        each, and the writes (replicas, match log, unit states, provider load) go out as a few
        executemany statements at the end, so the per-unit cost is the decision itself.
        ``latencies`` (optional) receives (wall, thread CPU) seconds of each unit's decision.
        """
        self.refresh_pool()
        now = self.clock()
        collateral = self._collateral()
        results: list[Match] = []
        reserved: list[str] = []
        try:
            with self.store.transaction() as session:
                units = self.store.units_in(session, [UnitState.PENDING.value], limit)
                if not units:
                    return []
                verifiers = [a for a in self.store.agents(session, AgentRole.VERIFIER.value) if a.online]
                replicas = self.store.replicas_of_units(session, [_id(u) for u in units])
                orders = {o.id: o for o in self.store.orders_by_ids(session, {u.order_id for u in units})}
                specs: dict[int, dict[str, Any]] = {}
                writes = MatchWrites()
                for unit in units:
                    started, started_cpu = time.perf_counter(), time.thread_time()
                    order = orders[unit.order_id]
                    if unit.order_id not in specs:
                        specs[unit.order_id] = json.loads(order.spec_json)  # validated when the order came in
                    match = self._match_unit(
                        session,
                        order,
                        specs[unit.order_id],
                        unit,
                        replicas.get(_id(unit), []),
                        collateral,
                        verifiers,
                        now,
                        writes,
                    )
                    reserved.extend(match.selected)
                    results.append(match)
                    if latencies is not None:
                        latencies.append((time.perf_counter() - started, time.thread_time() - started_cpu))
                self.store.write_matches(
                    session, writes.replicas, writes.logs, writes.units, writes.orders_started
                )
        except BaseException:
            for address in reserved:  # the transaction rolled back: give the reservations back
                self.pool.release(address)
            raise
        return results

    def _collateral(self) -> int:
        return self.chain.terms().provider_collateral if self.chain else self.config.provider_collateral

    def _operator_of(self, session: Session, address: str) -> str:
        candidate = self.pool.get(address)
        return (
            candidate.operator if candidate is not None else self.store.get_agent(session, address).operator
        )

    def _match_unit(
        self,
        session: Session,
        order: OrderRow,
        spec: dict[str, Any],
        unit: UnitRow,
        replicas: Sequence[ReplicaRow],
        collateral: int,
        verifiers: list[AgentRow],
        now: int,
        writes: MatchWrites,
    ) -> Match:
        kept = [r for r in replicas if r.state != ReplicaState.DROPPED.value]
        kept_operators = frozenset(self._operator_of(session, r.provider) for r in kept)
        unit_id = _id(unit)
        demand = UnitDemand(
            unit_id=unit_id,
            recipe=order.recipe,
            min_memory_mb=order.min_memory_mb,
            unit_flops=order.flops_per_step * unit.steps,
            time_budget_s=self.config.unit_time_budget_s,
            max_price_per_pflop=order.max_price_per_pflop,
            collateral=collateral,
            needed=unit.k - len(kept),
            excluded=frozenset(r.provider for r in replicas),
            taken_operators=kept_operators,
        )
        match = self.pool.match(demand, self.config.policy)
        writes.logs.append(
            {
                "unit_id": unit_id,
                "at": now,
                "selected_json": json.dumps(list(match.selected)),
                "declines_json": json.dumps([[address, reason.value] for address, reason in match.declines]),
            }
        )
        providers = {r.provider for r in kept} | set(match.selected)
        operators = set(kept_operators) | {self._operator_of(session, a) for a in match.selected}
        chosen_verifiers = self._pick_verifiers(verifiers, providers, operators, unit_id)
        short_of_verifiers = len(chosen_verifiers) < self.config.verifier_quorum
        if match.complete and short_of_verifiers:
            # the contract needs a quorum of independent verifiers on every unit: wait for them
            writes.logs[-1]["declines_json"] = json.dumps(
                [*json.loads(writes.logs[-1]["declines_json"]), ["verifiers", "not_enough_verifiers"]]
            )
        if not match.complete or short_of_verifiers:
            for address in match.selected:
                self.pool.release(address)
            return Match(match.unit_id, (), match.k, match.declines)
        for offset, address in enumerate(match.selected):
            writes.replicas.append(
                {
                    "unit_id": unit_id,
                    "index": len(replicas) + offset,
                    "provider": address,
                    "state": ReplicaState.PROPOSED.value,
                }
            )
        writes.units.append(
            {
                "target": unit_id,
                "verifiers_json": json.dumps(chosen_verifiers),
                "state": advance(UnitState(unit.state), UnitState.PROPOSED, what=f"unit {unit_id}").value,
                "accept_deadline": now + self.config.accept_timeout_s,
                "updated_at": now,
            }
        )
        if order.state == OrderState.OPEN.value:
            advance(OrderState(order.state), OrderState.RUNNING, what=f"order {order.id}")
            writes.orders_started.add(_id(order))
        return match

    def _pick_verifiers(
        self, verifiers: list[AgentRow], providers: set[str], operators: set[str], unit_id: int
    ) -> list[str]:
        """Verifiers independent of the unit's providers, rotated by unit id to spread the load."""
        eligible = [
            v.address for v in verifiers if v.address not in providers and v.operator not in operators
        ]
        if not eligible:
            return []
        start = unit_id % len(eligible)
        rotated = eligible[start:] + eligible[:start]
        return rotated[: self.config.verifiers_per_unit]

    # --- accept / commit / reveal ----------------------------------------------------------------------

    def _job_market(self) -> str:
        if self.chain is None:
            raise MarketError("the market has no chain configured")
        return self.chain.job_market_address

    def accept(self, submission: AcceptSubmission) -> UnitRow:
        """Record a provider's Accept signature; when all replicas signed, queue the assign transaction."""
        unit = self._record_accept(submission)
        if unit.state == UnitState.ASSIGNING.value:
            self.triggers.settle()
        return unit

    def _record_accept(self, submission: AcceptSubmission) -> UnitRow:
        from veritrain.chain.eip712 import market_domain

        now = self.clock()
        domain = market_domain(self.config.chain_id, self._job_market())
        with self.store.transaction() as session:
            unit = self.store.get_unit(session, submission.unit_id, for_update=True)
            order = self.store.get_order(session, unit.order_id)
            replica = self.store.replica(session, _id(unit), submission.provider)
            if unit.state != UnitState.PROPOSED.value or replica.state != ReplicaState.PROPOSED.value:
                raise IllegalTransition(
                    f"unit {unit.id} is {unit.state}, replica of {submission.provider} is {replica.state}; "
                    "Accept is only taken while both are proposed"
                )
            if submission.deadline <= now:
                raise InvalidInput(f"Accept deadline {submission.deadline} has passed (market clock {now})")
            message = {
                "orderId": order.chain_order_id,
                "unitKey": unit.unit_key,
                "provider": submission.provider,
                "nonce": submission.nonce,
                "deadline": submission.deadline,
            }
            _require_signer(domain, "Accept", message, submission.signature, submission.provider)
            replica.state = advance(ReplicaState(replica.state), ReplicaState.SIGNED, what="replica")
            replica.accept_nonce = submission.nonce
            replica.accept_deadline = submission.deadline
            replica.accept_signature = submission.signature
            session.add(replica)
            session.flush()
            live = [
                r for r in self.store.replicas_of(session, _id(unit)) if r.state != ReplicaState.DROPPED.value
            ]
            if len(live) == unit.k and all(r.state == ReplicaState.SIGNED.value for r in live):
                unit.state = advance(UnitState(unit.state), UnitState.ASSIGNING, what=f"unit {unit.id}")
                unit.updated_at = now
                session.add(unit)
                payload = {
                    "order_id": order.chain_order_id,
                    "unit_key": unit.unit_key,
                    "providers": [r.provider for r in live],
                    "verifiers": json.loads(unit.verifiers_json),
                    "accepts": [
                        {
                            "provider": r.provider,
                            "nonce": r.accept_nonce,
                            "deadline": r.accept_deadline,
                            "signature": r.accept_signature,
                        }
                        for r in live
                    ],
                }
                self.store.enqueue(session, _id(unit), "assign", payload, now)
            return unit

    def commit(self, submission: CommitSubmission) -> UnitRow:
        """Record and queue a provider's signed commit; when all committed the reveal phase begins."""
        unit = self._record_commit(submission)
        self.triggers.settle()
        return unit

    def _record_commit(self, submission: CommitSubmission) -> UnitRow:
        from veritrain.chain.eip712 import market_domain

        now = self.clock()
        domain = market_domain(self.config.chain_id, self._job_market())
        with self.store.transaction() as session:
            unit = self.store.get_unit(session, submission.unit_id, for_update=True)
            replica = self.store.replica(session, _id(unit), submission.provider)
            if unit.state != UnitState.COMMITTING.value or unit.chain_unit_id is None:
                raise IllegalTransition(f"unit {unit.id} is {unit.state}; commits are taken while committing")
            advance(
                ReplicaState(replica.state), ReplicaState.COMMITTED, what=f"replica of {replica.provider}"
            )
            message = {
                "unitId": unit.chain_unit_id,
                "provider": submission.provider,
                "commitment": submission.commitment,
                "nonce": submission.nonce,
                "deadline": submission.deadline,
            }
            _require_signer(domain, "Commit", message, submission.signature, submission.provider)
            replica.state = ReplicaState.COMMITTED.value
            replica.commitment = submission.commitment
            replica.commit_nonce = submission.nonce
            replica.commit_deadline = submission.deadline
            replica.commit_signature = submission.signature
            session.add(replica)
            payload = {
                "unit_id": unit.chain_unit_id,
                **submission.model_dump(mode="json", exclude={"unit_id"}),
            }
            self.store.enqueue(session, _id(unit), f"commit:{submission.provider}", payload, now)
            session.flush()
            if all(r.state == ReplicaState.COMMITTED.value for r in self._live_replicas(session, unit)):
                unit.state = advance(UnitState(unit.state), UnitState.REVEALING, what=f"unit {unit.id}")
                unit.updated_at = now
                session.add(unit)
            return unit

    def reveal(self, submission: RevealSubmission) -> UnitRow:
        """Check the preimage against the commitment, queue the reveal, decide the unit when complete."""
        unit = self._record_reveal(submission)
        self.triggers.settle()
        return unit

    def _record_reveal(self, submission: RevealSubmission) -> UnitRow:
        from veritrain.chain.eip712 import commitment as commitment_of

        now = self.clock()
        with self.store.transaction() as session:
            unit = self.store.get_unit(session, submission.unit_id, for_update=True)
            replica = self.store.replica(session, _id(unit), submission.provider)
            if unit.state != UnitState.REVEALING.value or unit.chain_unit_id is None:
                raise IllegalTransition(f"unit {unit.id} is {unit.state}; reveals are taken while revealing")
            advance(ReplicaState(replica.state), ReplicaState.REVEALED, what=f"replica of {replica.provider}")
            expected = commitment_of(
                submission.result_digest, submission.salt, submission.provider, unit.chain_unit_id
            )
            if replica.commitment is None or "0x" + expected.hex() != replica.commitment:
                raise InvalidInput(
                    f"reveal of {submission.provider} for unit {unit.id} does not match its commitment"
                )
            replica.state = ReplicaState.REVEALED.value
            replica.result_digest = submission.result_digest
            replica.salt = submission.salt
            replica.state_digest = submission.state_digest
            replica.transcript_root = submission.transcript_root
            session.add(replica)
            payload = {
                "unit_id": unit.chain_unit_id,
                "provider": submission.provider,
                "result_digest": submission.result_digest,
                "salt": submission.salt,
            }
            self.store.enqueue(session, _id(unit), f"reveal:{submission.provider}", payload, now)
            session.flush()
            live = self._live_replicas(session, unit)
            if all(r.state == ReplicaState.REVEALED.value for r in live):
                self._decide(session, unit, live, now)
            return unit

    def _live_replicas(self, session: Session, unit: UnitRow) -> list[ReplicaRow]:
        return [
            r for r in self.store.replicas_of(session, _id(unit)) if r.state != ReplicaState.DROPPED.value
        ]

    def _decide(self, session: Session, unit: UnitRow, live: Sequence[ReplicaRow], now: int) -> None:
        """Fast path (all digests equal, not drawn) → finalize; otherwise a verification job."""
        randomness = self._randomness()
        unit.randomness = randomness
        revealed = [r for r in live if r.state == ReplicaState.REVEALED.value]
        unanimous = len(revealed) == len(live) and len({r.result_digest for r in revealed}) == 1
        drawn = spot_check_drawn(randomness, unit.unit_key, audit_rate_ppm(unit.k, self.config.policy))
        if unanimous and not drawn:
            unit.state = advance(UnitState(unit.state), UnitState.FINALIZING, what=f"unit {unit.id}")
            self.store.enqueue(session, _id(unit), "finalize", {"unit_id": unit.chain_unit_id}, now)
        else:
            unit.state = advance(UnitState(unit.state), UnitState.VERIFYING, what=f"unit {unit.id}")
            unit.spot_checked = unanimous and drawn
            reason = (
                "spot_check"
                if unit.spot_checked
                else ("digests_differ" if revealed == list(live) else "missing")
            )
            if unit.spot_checked:
                self.store.enqueue(
                    session, _id(unit), "request_verification", {"unit_id": unit.chain_unit_id}, now
                )
            session.add(
                VerificationJobRow(unit_id=_id(unit), reason=reason, randomness=randomness, created_at=now)
            )
        unit.updated_at = now
        session.add(unit)

    def _randomness(self) -> str:
        """A block hash after the commit phase: nobody could know it when committing."""
        if self.chain is None:
            raise MarketError("the market has no chain configured")
        return self.chain.block_hash(self.chain.block_number())

    # --- verification ----------------------------------------------------------------------------------

    def pull_jobs(self, signed: Signed[Heartbeat], limit: int = 5) -> VerificationJobsReply:
        """A verifier's signed pull: open jobs of units it is assigned to and has not signed yet."""
        message = verify_signed(signed, self.config.chain_id)
        now = self.clock()
        with self.store.transaction() as session:
            agent = self.store.get_agent(session, message.agent)
            if agent.role != AgentRole.VERIFIER.value:
                raise InvalidInput(f"{message.agent} is registered as {agent.role}, not as a verifier")
            self._accept_agent_message(session, message, now)
            agent.online = True
            session.add(agent)
            views = []
            for job in self.store.open_jobs(session, limit=200):
                unit = self.store.get_unit(session, job.unit_id)
                if agent.address not in json.loads(unit.verifiers_json):
                    continue
                if any(v.verifier == agent.address for v in self.store.verdicts_of(session, _id(job))):
                    continue
                views.append(self._job_view(session, job, unit))
                if len(views) == limit:
                    break
        return VerificationJobsReply(verifier=message.agent, jobs=tuple(views))

    def _job_view(self, session: Session, job: VerificationJobRow, unit: UnitRow) -> VerificationJobView:
        order = self.store.get_order(session, unit.order_id)
        replicas = []
        for r in self._live_replicas(session, unit):
            agent = self.store.find_agent(session, r.provider)
            replicas.append(
                ReplicaResult(
                    provider=r.provider,
                    result_digest=r.result_digest,
                    state_digest=r.state_digest,
                    transcript_root=r.transcript_root,
                    p2p_addr=agent.p2p_addr if agent else "",
                )
            )
        return VerificationJobView(
            **self._unit_work(session, order, unit),
            job_id=_id(job),
            chain_unit_id=unit.chain_unit_id,
            replicas=tuple(replicas),
            randomness=job.randomness,
            reason=job.reason,
        )

    def submit_verdict(self, submission: VerdictSubmission) -> VerificationJobRow:
        """Store one verifier's signed verdict; at quorum on identical outcomes, queue the verdict relay."""
        job = self._record_verdict(submission)
        if job.state == "quorum":
            self.triggers.settle()
        return job

    def _record_verdict(self, submission: VerdictSubmission) -> VerificationJobRow:
        from veritrain.chain.eip712 import market_domain, outcomes_hash

        now = self.clock()
        domain = market_domain(self.config.chain_id, self._job_market())
        with self.store.transaction() as session:
            job = self.store.get_job(session, submission.job_id)
            unit = self.store.get_unit(session, job.unit_id, for_update=True)
            if job.state != "open":
                raise IllegalTransition(
                    f"verification job {job.id} is {job.state}; it takes no more verdicts"
                )
            if submission.verifier not in json.loads(unit.verifiers_json):
                raise InvalidInput(f"{submission.verifier} is not an assigned verifier of unit {unit.id}")
            live = self._live_replicas(session, unit)
            if len(submission.outcomes) != len(live):
                raise InvalidInput(
                    f"unit {unit.id} has {len(live)} replicas; got {len(submission.outcomes)} outcomes"
                )
            if any(v.verifier == submission.verifier for v in self.store.verdicts_of(session, _id(job))):
                raise InvalidInput(f"{submission.verifier} already signed a verdict for job {job.id}")
            message = {
                "unitId": unit.chain_unit_id,
                "outcomesHash": outcomes_hash([int(o) for o in submission.outcomes]),
                "reasonsHash": submission.reasons_hash,
                "nonce": submission.nonce,
                "deadline": submission.deadline,
            }
            _require_signer(domain, "Verdict", message, submission.signature, submission.verifier)
            session.add(
                VerdictSignatureRow(
                    job_id=_id(job),
                    verifier=submission.verifier,
                    outcomes_json=json.dumps([int(o) for o in submission.outcomes]),
                    reasons_hash=submission.reasons_hash,
                    nonce=submission.nonce,
                    deadline=submission.deadline,
                    signature=submission.signature,
                )
            )
            session.flush()
            agreeing = [
                v
                for v in self.store.verdicts_of(session, _id(job))
                if json.loads(v.outcomes_json) == [int(o) for o in submission.outcomes]
                and v.reasons_hash == submission.reasons_hash
            ]
            if len(agreeing) >= self.config.verifier_quorum:
                job.state = "quorum"
                payload = {
                    "unit_id": unit.chain_unit_id,
                    "outcomes": [int(o) for o in submission.outcomes],
                    "reasons_hash": submission.reasons_hash,
                    "verdicts": [
                        {
                            "verifier": v.verifier,
                            "nonce": v.nonce,
                            "deadline": v.deadline,
                            "signature": v.signature,
                        }
                        for v in agreeing
                    ],
                }
                self.store.enqueue(session, _id(unit), "verdict", payload, now)
            session.add(job)
            return job

    # --- settlement outbox -----------------------------------------------------------------------------

    def pending_outbox(self, limit: int = 100) -> list[int]:
        with self.store.transaction() as session:
            return [_id(row) for row in self.store.outbox_in(session, ["pending", "sending"], limit)]

    def send_outbox_entry(self, entry_id: int) -> OutboxResult:
        """Send one settlement intent at most once per claim; safe to run twice or concurrently.

        Claim (pending → sending, row-locked), send, then record. A second run sees ``sending`` with a
        live lease, or ``sent``/``confirmed``, and does nothing. A revert saying the unit is already
        settled means someone did it: the intent is confirmed, not retried.
        """
        from veritrain.chain.errors import ContractReverted

        if self.chain is None:
            raise MarketError("the market has no chain configured")
        now = self.clock()
        with self.store.transaction() as session:
            entry = self.store.get_outbox(session, entry_id, for_update=True)
            if entry.state in ("sent", "confirmed", "dead"):
                return OutboxResult(entry_id, entry.state, False, "already done")
            if entry.state == "sending" and now - entry.updated_at < OUTBOX_LEASE_S:
                return OutboxResult(entry_id, entry.state, False, "claimed by another run")
            if not self._prerequisites_sent(session, entry):
                return OutboxResult(entry_id, entry.state, False, "waiting for earlier actions of the unit")
            entry.state = "sending"
            entry.attempts += 1
            entry.updated_at = now
            session.add(entry)
            action, payload = entry.action, json.loads(entry.payload_json)
        try:
            tx_or_unit = self._send(action, payload)
        except ContractReverted as exc:
            already = (
                type(exc).__name__ in ALREADY_SETTLED_ERRORS
                or getattr(exc, "name", "") in ALREADY_SETTLED_ERRORS
            )
            return self._record_send(entry_id, "confirmed" if already else "failed", None, str(exc))
        except Exception as exc:  # RPC down, timeout: retry later under the attempt cap
            return self._record_send(entry_id, "failed", None, f"{type(exc).__name__}: {exc}")
        return self._record_send(entry_id, "sent", tx_or_unit, "")

    def _prerequisites_sent(self, session: Session, entry: OutboxRow) -> bool:
        """A unit's actions go out in order: assign, commits, reveals, then finalize/verdict."""
        if entry.action == "assign":
            return True
        earlier = self.store.outbox_in(session, ["pending", "sending", "failed"], limit=1000)
        return not any(e.unit_id == entry.unit_id and _id(e) < _id(entry) for e in earlier)

    def _send(self, action: str, payload: dict[str, Any]) -> str:
        chain = self.chain
        assert chain is not None
        kind = action.split(":", 1)[0]
        if kind == "assign":
            accepts = [SignedAccept(**a) for a in payload["accepts"]]
            unit_id = chain.assign(
                payload["order_id"], payload["unit_key"], payload["providers"], payload["verifiers"], accepts
            )
            return str(unit_id)
        if kind == "commit":
            return chain.commit_with_sig(
                payload["unit_id"],
                payload["provider"],
                payload["commitment"],
                payload["nonce"],
                payload["deadline"],
                payload["signature"],
            )
        if kind == "reveal":
            return chain.reveal(
                payload["unit_id"], payload["provider"], payload["result_digest"], payload["salt"]
            )
        if kind == "request_verification":
            return chain.request_verification(payload["unit_id"])
        if kind == "finalize":
            return chain.finalize(payload["unit_id"])
        if kind == "verdict":
            verdicts = [SignedVerdict(**v) for v in payload["verdicts"]]
            return chain.submit_verdict(
                payload["unit_id"], payload["outcomes"], payload["reasons_hash"], verdicts
            )
        if kind == "expire":
            return chain.expire_unit(payload["unit_id"])
        raise MarketError(f"unknown settlement action {action!r}")

    def _record_send(self, entry_id: int, outcome: str, result: str | None, error: str) -> OutboxResult:
        now = self.clock()
        with self.store.transaction() as session:
            entry = self.store.get_outbox(session, entry_id, for_update=True)
            entry.updated_at = now
            entry.last_error = error or None
            if outcome == "failed":
                entry.state = "dead" if entry.attempts >= OUTBOX_MAX_ATTEMPTS else "pending"
            else:
                entry.state = outcome
                entry.tx_hash = result if result and result.startswith("0x") else entry.tx_hash
                self._apply_settlement(session, entry, result, now)
            session.add(entry)
            recorded = OutboxResult(entry_id, entry.state, outcome == "sent", error)
            kind = entry.action.split(":", 1)[0]
            landed = outcome != "failed" and kind in STAKE_CHANGING_ACTIONS
            # later intents of the unit wait for this one (assign, commits, reveals, then the settlement)
            unblocked = outcome != "failed" and any(
                e.unit_id == entry.unit_id and _id(e) > entry_id
                for e in self.store.outbox_in(session, ["pending"], limit=1000)
            )
            providers = (
                {r.provider for r in self.store.replicas_of(session, entry.unit_id)} if landed else set()
            )
        # the chain already shows the new stake and reputation: matching must not wait for the event sync
        self.refresh_chain_facts(providers)
        if landed and kind in SETTLING_ACTIONS:
            self.triggers.advance()
        if unblocked:
            self.triggers.settle()
        return recorded

    def _apply_settlement(self, session: Session, entry: OutboxRow, result: str | None, now: int) -> None:
        """The market-side effect of a settlement that is now on chain."""
        unit = self.store.get_unit(session, entry.unit_id, for_update=True)
        kind = entry.action.split(":", 1)[0]
        if kind == "assign" and unit.state == UnitState.ASSIGNING.value:
            if result is not None and result.isdigit():
                unit.chain_unit_id = int(result)
            self._on_assigned(unit, now)
        elif kind == "finalize":
            self._settle_unit(
                session, unit, [ReplicaOutcome.ACCEPT] * len(self._live_replicas(session, unit)), now
            )
        elif kind == "verdict":
            outcomes = [ReplicaOutcome(o) for o in json.loads(entry.payload_json)["outcomes"]]
            self._settle_unit(session, unit, outcomes, now)
            job = self.store.job_for_unit(session, _id(unit))
            if job is not None:
                job.state = "relayed"
                session.add(job)
        elif kind == "expire" and unit.state not in (UnitState.ACCEPTED.value, UnitState.FAILED.value):
            self._fail_unit(session, unit, now)
        session.add(unit)

    def _on_assigned(self, unit: UnitRow, now: int) -> None:
        unit.state = advance(UnitState(unit.state), UnitState.COMMITTING, what=f"unit {unit.id}")
        unit.commit_deadline = now + self.config.commit_window_s
        unit.updated_at = now

    def _settle_unit(
        self, session: Session, unit: UnitRow, outcomes: Sequence[ReplicaOutcome], now: int
    ) -> None:
        if unit.state in (UnitState.ACCEPTED.value, UnitState.FAILED.value):
            return
        live = self._live_replicas(session, unit)
        target = {
            ReplicaOutcome.ACCEPT: ReplicaState.ACCEPTED,
            ReplicaOutcome.FAULT: ReplicaState.FAULT,
            ReplicaOutcome.FRAUD: ReplicaState.FRAUD,
        }
        for replica, outcome in zip(live, outcomes, strict=True):
            wanted = target[outcome]
            if wanted == ReplicaState.FAULT and replica.state not in (ReplicaState.REVEALED.value,):
                replica.state = ReplicaState.FAULT.value  # never revealed (or never committed): a fault
            else:
                replica.state = advance(
                    ReplicaState(replica.state), wanted, what=f"replica of {replica.provider}"
                )
            session.add(replica)
            self._free_provider(replica.provider)
        accepted = ReplicaOutcome.ACCEPT in outcomes
        unit.state = advance(
            UnitState(unit.state),
            UnitState.ACCEPTED if accepted else UnitState.FAILED,
            what=f"unit {unit.id}",
        )
        unit.updated_at = now

    def _fail_unit(self, session: Session, unit: UnitRow, now: int) -> None:
        for replica in self._live_replicas(session, unit):
            if replica.state in (
                ReplicaState.PROPOSED.value,
                ReplicaState.SIGNED.value,
                ReplicaState.COMMITTED.value,
            ):
                replica.state = (
                    ReplicaState.DROPPED.value
                    if replica.state == ReplicaState.PROPOSED.value
                    else ReplicaState.FAULT.value
                )
                session.add(replica)
                self._free_provider(replica.provider)
            elif replica.state == ReplicaState.REVEALED.value:
                replica.state = ReplicaState.FAULT.value
                session.add(replica)
                self._free_provider(replica.provider)
        unit.state = advance(UnitState(unit.state), UnitState.FAILED, what=f"unit {unit.id}")
        unit.updated_at = now

    def _free_provider(self, provider: str) -> None:
        """The replica no longer keeps its provider busy (the store's load is derived from replicas)."""
        self.pool.release(provider)

    # --- chain events ----------------------------------------------------------------------------------

    def sync_chain_events(self, max_blocks: int = 2000) -> int:
        """Apply JobMarket events since the cursor; confirms outbox entries someone else may have sent."""
        if self.chain is None:
            raise MarketError("the market has no chain configured")
        head = self.chain.block_number()
        now = self.clock()
        with self.store.transaction() as session:
            cursor = self.store.cursor(session)
            if cursor.next_block > head:
                return 0
            to_block = min(head, cursor.next_block + max_blocks - 1)
            events = self.chain.events(cursor.next_block, to_block)
            touched: set[str] = set()
            for chain_event in events:
                touched |= self._accounts_touched(session, chain_event.name, chain_event.args)
                self._apply_event(session, chain_event.name, chain_event.args, now)
            cursor.next_block = to_block + 1
            session.add(cursor)
        self.refresh_chain_facts(touched)
        return len(events)

    def _accounts_touched(self, session: Session, name: str, args: dict[str, Any]) -> set[str]:
        """Accounts whose free stake or reputation an event changed (matching must see the new values)."""
        if name in STAKE_EVENTS:
            return {to_checksum_address(args[STAKE_EVENTS[name]])}
        if name not in UNIT_SETTLEMENT_EVENTS:
            return set()
        unit = (
            self.store.unit_by_key(session, _hex32(args["unitKey"]))
            if name == "UnitAssigned"
            else self.store.unit_by_chain_id(session, int(args["unitId"]))
        )
        if unit is None:
            return set()
        return {r.provider for r in self._live_replicas(session, unit)}

    def refresh_chain_facts(self, accounts: set[str]) -> None:
        """Re-read free stake and reputation of registered providers from the chain's views into the store
        and the candidate pool: a slashed or busy provider must not be matched on its old stake."""
        if self.chain is None or not accounts:
            return
        with self.store.transaction() as session:
            providers = [
                a.address
                for a in (self.store.find_agent(session, account) for account in sorted(accounts))
                if a is not None and a.role == AgentRole.PROVIDER.value
            ]
        facts = {address: self._chain_facts(address) for address in providers}
        refreshed = []
        with self.store.transaction() as session:
            for address, (free_stake, reputation) in facts.items():
                agent = self.store.get_agent(session, address)
                agent.free_stake = free_stake
                agent.rep_valid, agent.rep_fault = reputation.valid, reputation.fault
                agent.rep_fraud, agent.rep_consecutive_valid = reputation.fraud, reputation.consecutive_valid
                session.add(agent)
                offer = self.store.offer_of(session, address)
                load = self.store.active_load(session, address).get(address, 0)
                refreshed.append((agent, offer, load))
        for agent, offer, load in refreshed:
            self._refresh_candidate(agent, offer, load)

    def _apply_event(self, session: Session, name: str, args: dict[str, Any], now: int) -> None:
        if name == "UnitAssigned":
            unit = self.store.unit_by_key(session, _hex32(args["unitKey"]))
            if unit is None:
                return
            unit.chain_unit_id = int(args["unitId"])
            if unit.state == UnitState.ASSIGNING.value:
                self._on_assigned(unit, now)
            if "commitDeadline" in args:  # the chain's own deadline beats our estimate
                unit.commit_deadline = int(args["commitDeadline"])
            self._confirm(session, _id(unit), "assign", now)
            session.add(unit)
            return
        unit_id = args.get("unitId")
        unit = self.store.unit_by_chain_id(session, int(unit_id)) if unit_id is not None else None
        if unit is None:
            return
        if name in ("ReplicaCommitted", "ReplicaRevealed"):
            # A worker may crash after the transaction landed but before recording it; its retry then
            # reverts (nonce used / already revealed), so the chain event is what confirms the intent.
            kind = "commit" if name == "ReplicaCommitted" else "reveal"
            self._confirm(session, _id(unit), f"{kind}:{to_checksum_address(args['provider'])}", now)
            return
        if name == "UnitFinalized":
            self._confirm(session, _id(unit), "finalize", now)
            self._settle_unit(
                session, unit, [ReplicaOutcome.ACCEPT] * len(self._live_replicas(session, unit)), now
            )
        elif name == "VerdictRecorded" and "outcomes" in args:
            self._confirm(session, _id(unit), "verdict", now)
            self._settle_unit(session, unit, [ReplicaOutcome(int(o)) for o in args["outcomes"]], now)
        elif name == "UnitExpired":
            self._confirm(session, _id(unit), "expire", now)
            if unit.state not in (UnitState.ACCEPTED.value, UnitState.FAILED.value):
                self._fail_unit(session, unit, now)
        session.add(unit)

    def _confirm(self, session: Session, unit_id: int, action: str, now: int) -> None:
        entry = self.store.outbox_entry(session, unit_id, action)
        if entry is not None and entry.state != "confirmed":
            entry.state = "confirmed"
            entry.updated_at = now
            session.add(entry)

    # --- orders advance, heartbeat sweep -----------------------------------------------------------------

    def advance_orders(self) -> int:
        """Close accepted rounds through the outer step, open the next round, retry failed units, expire."""
        now = self.clock()
        changed = 0
        with self.store.transaction() as session:
            for order in self.store.orders_in(session, [OrderState.OPEN.value, OrderState.RUNNING.value]):
                changed += self._advance_order(session, order, now)
        if changed:  # a round opened or a failed unit got a new attempt (or an order ended: harmless)
            self.triggers.match(False)
        return changed

    def _advance_order(self, session: Session, order: OrderRow, now: int) -> int:
        spec = OrderSpec.model_validate_json(order.spec_json)
        if now > order.deadline:
            order.state = advance(OrderState(order.state), OrderState.EXPIRED, what=f"order {order.id}")
            current = self.store.round_of(session, _id(order), order.rounds_accepted)
            if current is not None and current.state == RoundState.OPEN.value:
                current.state = RoundState.ABANDONED.value
                session.add(current)
            session.add(order)
            return 1
        round_row = self.store.round_of(session, _id(order), order.rounds_accepted)
        if round_row is None:
            return 0
        units = self.store.units_of_round(session, _id(round_row))
        latest: dict[int, UnitRow] = {}
        for unit in units:
            if unit.shard not in latest or unit.attempt > latest[unit.shard].attempt:
                latest[unit.shard] = unit
        changed = 0
        for shard, unit in latest.items():
            if unit.state == UnitState.FAILED.value:  # migrate: a new attempt under a new unit key
                self._new_unit(
                    session, order, round_row, spec, shard, unit.start_step, unit.steps, unit.attempt + 1, now
                )
                changed += 1
        if changed or any(u.state != UnitState.ACCEPTED.value for u in latest.values()):
            return changed
        accepted = [
            [
                AcceptedReplica(_id(u), r.provider, r.state_digest or "")
                for r in self.store.replicas_of(session, _id(u))
                if r.state == ReplicaState.ACCEPTED.value
            ]
            for u in sorted(latest.values(), key=lambda u: u.shard)
        ]
        step = outer_step_for(self.config.units_per_round)
        next_state = step.next_state(round_row.index, round_row.start_state_digest, accepted)
        round_row.state = advance(
            RoundState(round_row.state), RoundState.ACCEPTED, what=f"round {round_row.id}"
        )
        round_row.next_state_digest = next_state
        session.add(round_row)
        order.rounds_accepted += 1
        order.current_state_digest = next_state
        if order.rounds_accepted == order.rounds_total:
            order.state = advance(OrderState(order.state), OrderState.COMPLETED, what=f"order {order.id}")
        else:
            self._open_round(session, order, spec, order.rounds_accepted, next_state, now)
        session.add(order)
        return 1

    def sweep(self) -> SweepResult:
        """Mark silent agents lost and migrate their not-yet-on-chain replicas; drop unsigned proposals
        past their accept deadline; queue expiry of on-chain units past their verdict window."""
        now = self.clock()
        result = SweepResult()
        with self.store.transaction() as session:
            for agent in self.store.stale_agents(session, now - self.config.heartbeat_timeout_s):
                agent.online = False
                session.add(agent)
                self.pool.remove(agent.address)
                result.lost_agents.append(agent.address)
                pending = [ReplicaState.PROPOSED.value, ReplicaState.SIGNED.value]
                for replica in self.store.replicas_of_provider(session, agent.address, pending):
                    unit = self.store.get_unit(session, replica.unit_id, for_update=True)
                    if unit.state == UnitState.PROPOSED.value:
                        self._drop_replica(session, unit, replica, now)
                        result.dropped_replicas += 1
            for unit in self.store.units_in(session, [UnitState.PROPOSED.value]):
                if unit.accept_deadline and now > unit.accept_deadline:
                    for replica in self.store.replicas_of(session, _id(unit)):
                        if replica.state == ReplicaState.PROPOSED.value:
                            self._drop_replica(session, unit, replica, now)
                            result.dropped_replicas += 1
            self._close_phases(session, now)
            for unit in self.store.units_in(
                session, [UnitState.COMMITTING.value, UnitState.REVEALING.value, UnitState.VERIFYING.value]
            ):
                settle_by = unit.commit_deadline + self.config.reveal_window_s + self.config.verdict_window_s
                if unit.commit_deadline and now > settle_by and unit.chain_unit_id is not None:
                    self.store.enqueue(session, _id(unit), "expire", {"unit_id": unit.chain_unit_id}, now)
                    result.expiring_units += 1
        if result.dropped_replicas or result.lost_agents:  # units back to pending, a provider gone
            self.triggers.match(True)
        return result

    def _close_phases(self, session: Session, now: int) -> None:
        """Deadlines the chain enforces: after the commit deadline the committed replicas reveal; after
        the reveal deadline whatever was revealed is decided (missing replicas become faults)."""
        for unit in self.store.units_in(session, [UnitState.COMMITTING.value]):
            if unit.commit_deadline and now > unit.commit_deadline:
                live = self._live_replicas(session, unit)
                if any(r.state == ReplicaState.COMMITTED.value for r in live):
                    unit.state = advance(UnitState(unit.state), UnitState.REVEALING, what=f"unit {unit.id}")
                    unit.updated_at = now
                    session.add(unit)
        for unit in self.store.units_in(session, [UnitState.REVEALING.value]):
            if unit.commit_deadline and now > unit.commit_deadline + self.config.reveal_window_s:
                live = self._live_replicas(session, unit)
                if any(r.state == ReplicaState.REVEALED.value for r in live):
                    self._decide(session, unit, live, now)

    def _drop_replica(self, session: Session, unit: UnitRow, replica: ReplicaRow, now: int) -> None:
        """Take a replica off a unit that is not on chain yet; the unit goes back to matching for a refill."""
        replica.state = advance(ReplicaState(replica.state), ReplicaState.DROPPED, what="replica")
        session.add(replica)
        self._free_provider(replica.provider)
        if unit.state == UnitState.PROPOSED.value:
            unit.state = advance(UnitState(unit.state), UnitState.PENDING, what=f"unit {unit.id}")
            unit.updated_at = now
            session.add(unit)


def _phase(unit: UnitState, replica: ReplicaState) -> AssignmentPhase | None:
    """What a provider should do now for one replica (None: nothing until something changes)."""
    if replica == ReplicaState.PROPOSED and unit == UnitState.PROPOSED:
        return AssignmentPhase.ACCEPT
    if replica == ReplicaState.SIGNED and unit == UnitState.COMMITTING:
        return AssignmentPhase.RUN
    if replica == ReplicaState.COMMITTED and unit == UnitState.REVEALING:
        return AssignmentPhase.REVEAL
    return None


def _require_signer(
    domain: Any, primary: str, message: dict[str, Any], signature: str, expected: str
) -> None:
    from veritrain.chain.eip712 import recover_typed

    try:
        recovered = recover_typed(domain, primary, message, bytes.fromhex(signature[2:]))
    except Exception as exc:  # malformed v/r/s
        raise InvalidSignature(f"{primary} signature cannot be recovered: {exc}") from exc
    if recovered != expected:
        raise InvalidSignature(f"{primary} must be signed by {expected}, recovered {recovered}")


def _hex32(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        return "0x" + bytes(value).hex()
    return str(value).lower()


def _id(row: Any) -> int:
    """Primary key of a flushed row (None only before flush, which the service never reads)."""
    if row.id is None:
        raise NotFound(f"{type(row).__name__} has no id yet")
    return int(row.id)
