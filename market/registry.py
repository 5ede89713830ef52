"""Registration and heartbeats: agents register and post offers by signed messages, pull their
assignments by signed heartbeats, and are marked lost when they fall silent. Free stake and reputation
come from the chain at registration and are re-read whenever a settlement or an event changed them."""

from __future__ import annotations

import json

from market.assignments import Assignments, SweepResult
from market.context import Lifecycle, MarketContext
from market.domain.replication import Reputation
from market.domain.states import ReplicaState, UnitState
from market.matchmaker import Matchmaker
from market.store import AgentRow, OfferRow
from veritrain.errors import InvalidInput, NotAuthorized
from veritrain.messages import (
    AgentRole,
    Heartbeat,
    HeartbeatReply,
    Offer,
    PlantEnrollment,
    Registration,
    Signed,
    verify_signed,
)


class AgentRegistry(Lifecycle):
    def __init__(self, ctx: MarketContext, matching: Matchmaker, assignments: Assignments) -> None:
        super().__init__(ctx)
        self.matching = matching
        self.assignments = assignments

    def register(self, signed: Signed[Registration]) -> AgentRow:
        """Register or update an agent from its signed Registration."""
        message = verify_signed(signed, self.config.chain_id)
        for recipe in message.recipes:
            self.recipes.lookup(recipe)  # UnknownRecipe for a name outside the registry
        now = self.clock()
        with self.store.transaction() as session:  # a replay is refused before any RPC call is spent
            self.ctx.accept_agent_message(session, message, now)
        free_stake, bonded_stake, reputation = self._chain_facts(message.agent)
        stake_block = self.chain.last_staked_block(message.agent) if self.chain is not None else None
        with self.store.transaction() as session:
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
            row.free_stake, row.bonded_stake = free_stake, bonded_stake
            row.stake_block = stake_block
            row.rep_valid, row.rep_fault = reputation.valid, reputation.fault
            row.rep_fraud, row.rep_consecutive_valid = reputation.fraud, reputation.consecutive_valid
            session.add(row)
            offer = self.store.offer_of(session, row.address)
            load = self.store.active_load(session, row.address).get(row.address, 0)
        self.matching.refresh_candidate(row, offer, load)
        if row.role == AgentRole.PROVIDER.value:
            self.triggers.match(True)
        return row

    def enroll_plant(self, signed: Signed[PlantEnrollment]) -> str:
        """Enroll a key of the operator's plant agent, vouched for by the plant authority (the canary
        account): from now on it is kept out of the draw and planted units may be routed to it."""
        message = verify_signed(signed, self.config.chain_id)
        authority = self.config.plant_authority
        if authority is None:
            raise NotAuthorized("this market enrolls no plants (it runs no canary account)")
        if message.agent != authority:
            raise NotAuthorized(f"plants are enrolled by the canary account {authority}, not {message.agent}")
        now = self.clock()
        with self.store.transaction() as session:
            agent = self.store.find_agent(session, message.plant)
            if agent is not None and agent.role != AgentRole.PROVIDER.value:
                raise InvalidInput(f"{message.plant} is registered as {agent.role}; a plant is a provider")
            self.ctx.accept_agent_message(session, message, now)
            self.store.enroll_plant(session, message.plant, authority, now)
        self.matching.pool.remove(message.plant)  # out of the draw here; the worker's pool on its refresh
        self.triggers.match(True)
        return message.plant

    def _chain_facts(self, account: str) -> tuple[int, int, Reputation]:
        """Free stake (gates collateral), bonded stake (the selection weight) and reputation."""
        if self.chain is None:
            return 0, 0, Reputation()
        return (
            self.chain.free_stake(account),
            self.chain.bonded_stake(account),
            self.chain.reputation_of(account),
        )

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
            self.ctx.accept_agent_message(session, message, now)
            offer = self.store.offer_of(session, message.agent) or OfferRow(
                agent=message.agent, price_per_pflop=0, expires_at=0, signed_at=0
            )
            offer.price_per_pflop = message.price_per_pflop
            offer.expires_at = message.expires_at
            offer.signed_at = message.timestamp
            session.add(offer)
            load = self.store.active_load(session, agent.address).get(agent.address, 0)
        self.matching.refresh_candidate(agent, offer, load)
        self.triggers.match(True)
        return offer

    def heartbeat(self, signed: Signed[Heartbeat]) -> HeartbeatReply:
        """Liveness plus pull: the reply lists what the agent should do next for each of its replicas."""
        message = verify_signed(signed, self.config.chain_id)
        now = self.clock()
        with self.store.transaction() as session:
            agent = self.store.get_agent(session, message.agent)
            self.ctx.accept_agent_message(session, message, now)
            came_back = not agent.online
            agent.online = True
            session.add(agent)
            assignments = self.assignments.assignments_for(session, agent.address)
            custody = self.assignments.orders.custody.custody_for(session, agent.address)
            offer = self.store.offer_of(session, agent.address)
            load = self.store.active_load(session, agent.address).get(agent.address, 0)
        if came_back:
            self.matching.refresh_candidate(agent, offer, load)
            if agent.role == AgentRole.PROVIDER.value:
                self.triggers.match(True)
        return HeartbeatReply(agent=message.agent, assignments=tuple(assignments), custody=custody)

    def refresh_chain_facts(self, accounts: set[str]) -> None:
        """Re-read free and bonded stake and reputation of registered agents from the chain's views into
        the store and the candidate pool: a slashed or busy provider, or a verifier that unstaked below
        the minimum, must not be matched on its old stake."""
        if self.chain is None or not accounts:
            return
        with self.store.transaction() as session:
            known = {
                a.address: a.bonded_stake
                for a in (self.store.find_agent(session, account) for account in sorted(accounts))
                if a is not None
            }
        facts = {address: self._chain_facts(address) for address in known}
        # a stake that grew counts in a draw only from its block on (market/seed_blocks.py): read that block
        # now rather than wait for the chain sync to apply its Staked event
        grown = {
            address: self.chain.last_staked_block(address)
            for address, (_, bonded_stake, _) in facts.items()
            if bonded_stake > known[address]
        }
        refreshed = []
        with self.store.transaction() as session:
            for address, (free_stake, bonded_stake, reputation) in facts.items():
                agent = self.store.get_agent(session, address)
                if address in grown:
                    agent.stake_block = max(agent.stake_block or 0, grown[address])
                agent.free_stake, agent.bonded_stake = free_stake, bonded_stake
                agent.rep_valid, agent.rep_fault = reputation.valid, reputation.fault
                agent.rep_fraud, agent.rep_consecutive_valid = reputation.fraud, reputation.consecutive_valid
                session.add(agent)
                offer = self.store.offer_of(session, address)
                load = self.store.active_load(session, address).get(address, 0)
                refreshed.append((agent, offer, load))
        for agent, offer, load in refreshed:
            self.matching.refresh_candidate(agent, offer, load)

    def sweep(self) -> SweepResult:
        """Mark silent agents lost and migrate their not-yet-on-chain replicas; drop unsigned proposals
        past their accept deadline; queue expiry of on-chain units past their verdict window."""
        now = self.clock()
        result = SweepResult()
        with self.store.transaction() as session:
            for agent in self.store.stale_agents(session, now - self.config.heartbeat_timeout_s):
                agent.online = False
                session.add(agent)
                self.matching.pool.remove(agent.address)
                result.lost_agents.append(agent.address)
                pending = [ReplicaState.PROPOSED.value, ReplicaState.SIGNED.value]
                for replica in self.store.replicas_of_provider(session, agent.address, pending):
                    unit = self.store.get_unit(session, replica.unit_id, for_update=True)
                    if unit.state == UnitState.PROPOSED.value:
                        self.assignments.drop_replica(session, unit, replica, now)
                        result.dropped_replicas += 1
            self.assignments.sweep_deadlines(session, now, result)
        if result.dropped_replicas or result.lost_agents:  # units back to pending, a provider gone
            self.triggers.match(True)
        return result
