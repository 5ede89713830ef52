"""Matching: the in-memory candidate pool over the store and the matching pass that proposes providers
and verifiers for pending units (the decision itself is :mod:`market.domain.matching`, the stake-weighted
draw :mod:`market.domain.selection`). The operator's plant agents (planted cheats, market/canary.py) are
kept out of the pool: they get the planted units and nothing else."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlmodel import Session

from market.context import Lifecycle, MarketContext, row_id
from market.domain.matching import (
    CandidatePool,
    DeclineReason,
    Match,
    ProviderCandidate,
    UnitDemand,
    match_plant,
)
from market.domain.replication import Reputation
from market.domain.selection import ROLE_VERIFIERS, sample, selection_seed
from market.domain.states import OrderState, ReplicaState, UnitState, advance
from market.seed_blocks import SeedBlocks, late_stake_block, staked_by
from market.store import AgentRow, OfferRow, OrderRow, ReplicaRow, UnitRow
from veritrain.errors import UnknownRecipe
from veritrain.messages import TRUSTED_STREAK, AgentRole


@dataclass
class MatchWrites:
    """Rows a matching pass writes, collected so they go out as a few executemany statements."""

    replicas: list[dict[str, Any]] = field(default_factory=list)
    logs: list[dict[str, Any]] = field(default_factory=list)
    units: list[dict[str, Any]] = field(default_factory=list)
    orders_started: set[int] = field(default_factory=set)


class Matchmaker(Lifecycle):
    """Owns the candidate pool; the other lifecycles update it when an agent or its load changes."""

    def __init__(self, ctx: MarketContext) -> None:
        super().__init__(ctx)
        self.pool = CandidatePool()
        self._pool_loaded_at: float | None = None

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
            pool = CandidatePool(self._collateral(), self._recipe_memory(recipes))
            plants = self.ctx.plant_addresses(session)
            for agent in agents:
                if agent.address not in plants:
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
            bonded_stake=agent.bonded_stake,
            stake_block=agent.stake_block or 0,
        )

    def refresh_candidate(self, agent: AgentRow, offer: OfferRow | None, load: int) -> None:
        if agent.role == AgentRole.PROVIDER.value and not self.ctx.is_plant(agent.address):
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
        # the contract refuses a verifier whose bonded stake fell below its minimum (it unstaked)
        verifier_collateral = self.chain.terms().verifier_collateral if self.chain else 0
        results: list[Match] = []
        reserved: list[str] = []
        try:
            with self.store.transaction() as session:
                units = self.store.units_in(session, [UnitState.PENDING.value], limit)
                if not units:
                    return []
                seeds = SeedBlocks(self.chain)
                verifiers = [
                    a
                    for a in self.store.agents(session, AgentRole.VERIFIER.value)
                    if a.online and a.free_stake >= verifier_collateral
                ]
                replicas = self.store.replicas_of_units(session, [row_id(u) for u in units])
                orders = {o.id: o for o in self.store.orders_by_ids(session, {u.order_id for u in units})}
                planted = (
                    self.store.planted_orders(session, {u.order_id for u in units})
                    if self.config.runs_plants
                    else set()
                )
                plants = self._plants(session) if planted else {}
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
                        replicas.get(row_id(unit), []),
                        collateral,
                        verifiers,
                        seeds.of(unit),
                        now,
                        writes,
                        plants if unit.order_id in planted else None,
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

    def _plants(self, session: Session) -> dict[str, ProviderCandidate]:
        """The operator's registered plant agents as candidates, with their current load."""
        offers = self.store.offers(session)
        load = self.store.active_load(session)
        return {
            agent.address: self._candidate(agent, offers.get(agent.address), load.get(agent.address, 0))
            for agent in self.ctx.plant_agents(session)
        }

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
        block: tuple[int, str],
        now: int,
        writes: MatchWrites,
        plants: dict[str, ProviderCandidate] | None = None,
    ) -> Match:
        """Match one unit: from the stake-weighted draw, or, for a planted cheat's unit (``plants`` given),
        from the operator's plant agents (whose loads this pass updates as it picks them)."""
        kept = [r for r in replicas if r.state != ReplicaState.DROPPED.value]
        kept_operators = frozenset(self._operator_of(session, r.provider) for r in kept)
        unit_id = row_id(unit)
        # An adaptive unit is sized when none of its replicas is kept (first match, or all dropped): its
        # first drawn candidate's streak, as the order counts it, gives k = 1 or the order's most.
        adaptive = bool(spec.get("adaptive_replication")) and not kept
        needed = int(spec["replicas"]) if adaptive else unit.k - len(kept)
        policy = replace(self.config.policy, trusted_streak=int(spec.get("trusted_streak", TRUSTED_STREAK)))
        demand = UnitDemand(
            unit_id=unit_id,
            recipe=order.recipe,
            min_memory_mb=order.min_memory_mb,
            unit_flops=order.flops_per_step * unit.steps,
            time_budget_s=self.config.unit_time_budget_s,
            max_price_per_pflop=order.max_price_per_pflop,
            collateral=collateral,
            needed=needed,
            adaptive=adaptive,
            excluded=frozenset(r.provider for r in replicas),
            taken_operators=kept_operators,
            seed_block=block[0],
        )
        block_number, block_hash = block
        seed = selection_seed(block_hash, unit.unit_key)
        if plants is None:
            match = self.pool.match(demand, block_hash, seed, policy)
        else:
            match = match_plant(demand, plants.values())
            for address in match.selected:
                plants[address] = replace(plants[address], active_units=plants[address].active_units + 1)
        writes.logs.append(
            {
                "unit_id": unit_id,
                "at": now,
                "selected_json": json.dumps(list(match.selected)),
                "declines_json": json.dumps([[address, reason.value] for address, reason in match.declines]),
                "selection_block": block_number,
                "selection_seed": seed,
            }
        )
        providers = {r.provider for r in kept} | set(match.selected)
        operators = set(kept_operators) | {self._operator_of(session, a) for a in match.selected}
        chosen_verifiers = self._pick_verifiers(verifiers, providers, operators, block, seed)
        short_of_verifiers = len(chosen_verifiers) < self.config.min_verifiers
        if match.complete and short_of_verifiers:
            # the contract needs a quorum of independent verifiers on every unit: wait for them
            writes.logs[-1]["declines_json"] = json.dumps(
                [*json.loads(writes.logs[-1]["declines_json"]), ["verifiers", "not_enough_verifiers"]]
            )
        if not match.complete or short_of_verifiers:
            for address in match.selected:
                self.pool.release(address)
            self._reseed_if_late(session, unit, match, verifiers, block_number)
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
                "k": len(kept) + match.k,
                "verifiers_json": json.dumps(chosen_verifiers),
                "selection_block": block_number,
                "selection_seed": seed,
                "state": advance(UnitState(unit.state), UnitState.PROPOSED, what=f"unit {unit_id}").value,
                "accept_deadline": now + self.config.accept_timeout_s,
                "updated_at": now,
            }
        )
        if order.state == OrderState.OPEN.value:
            advance(OrderState(order.state), OrderState.RUNNING, what=f"order {order.id}")
            writes.orders_started.add(row_id(order))
        return match

    def _reseed_if_late(
        self, session: Session, unit: UnitRow, match: Match, verifiers: list[AgentRow], block_number: int
    ) -> None:
        """A unit that came up short while stake that grew after its seed block waits is seeded next by the
        block of the latest such stake (market/seed_blocks.py): an order posted before enough providers
        staked starts once they have."""
        late_providers = (
            candidate.stake_block
            for address, reason in match.declines
            if reason == DeclineReason.STAKED_AFTER_SEED and (candidate := self.pool.get(address)) is not None
        )
        late_verifiers = (v.stake_block or 0 for v in verifiers)
        late = late_stake_block([*late_providers, *late_verifiers], block_number)
        if late is not None:
            unit.selection_block = late
            session.add(unit)

    def _pick_verifiers(
        self,
        verifiers: list[AgentRow],
        providers: set[str],
        operators: set[str],
        block: tuple[int, str],
        seed: str,
    ) -> list[str]:
        """Verifiers independent of the unit's providers whose stake did not grow after the seed block,
        drawn by bonded stake from the unit's seed (a draw separate from the replicas')."""
        block_number, block_hash = block
        stakes = {
            v.address: v.bonded_stake
            for v in verifiers
            if v.address not in providers and v.operator not in operators and staked_by(v, block_number)
        }
        return list(sample(block_hash, seed, ROLE_VERIFIERS, stakes, self.config.verifiers_per_unit))
