"""Custody of live states: the market asks registered agents other than a state's producers to fetch and
keep a state an open order may still start a unit from, lists them as holders once they report holding
it, and releases them when the state is no longer live or the order ended (market/domain/custody.py says
why). Agents learn what to keep from their heartbeat (or verification-jobs) reply."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from sqlmodel import Session, col, or_, select

from market.context import Lifecycle
from market.domain.custody import Custodian, custodians_needed, may_rely_on, pick_custodians
from market.domain.states import OrderState, ReplicaState
from market.store import CustodyRow, OrderRow, ReplicaRow, UnitRow
from veritrain.errors import NotFound
from veritrain.messages import MAX_CUSTODY, Custody, CustodyReport, Signed, StateSource, verify_signed

LIVE_ORDER_STATES = (OrderState.OPEN.value, OrderState.RUNNING.value)


class CustodyBook(Lifecycle):
    def keep(self, session: Session, order_id: int, live: Mapping[str, set[str]], now: int) -> None:
        """Make the order's live states (digest → its producers) the only ones it keeps custody of: release
        the rest, and ask more agents wherever fewer than ``custody_copies`` online custodians count."""
        rows = self.store.custody_of_order(session, order_id)
        for row in rows:
            if row.state_digest not in live:
                session.delete(row)
        if not live or self.config.custody_copies == 0:
            return
        online = {a.address for a in self.store.agents(session) if a.online and a.p2p_addr}
        load = Counter(row.agent for row in self.store.custody_rows(session))
        for digest, producers in sorted(live.items()):
            asked = [row for row in rows if row.state_digest == digest]
            custodians = [_custodian(row, online) for row in asked]
            need = custodians_needed(
                custodians, self.config.custody_copies, now, self.config.custody_timeout_s
            )
            excluded = producers | {row.agent for row in asked}
            for agent in pick_custodians(need, sorted(online), excluded, load):
                session.add(CustodyRow(order_id=order_id, state_digest=digest, agent=agent, requested_at=now))
                load[agent] += 1
        session.flush()

    def release_ended(self, session: Session) -> int:
        """Drop every custody of orders that ended (completed, expired, cancelled)."""
        query = (
            select(CustodyRow)
            .join(OrderRow, col(OrderRow.id) == col(CustodyRow.order_id))
            .where(col(OrderRow.state).not_in(LIVE_ORDER_STATES))
        )
        ended = session.exec(query).all()
        for row in ended:
            session.delete(row)
        return len(ended)

    def may_rely_on(self, session: Session, order_id: int, digest: str, now: int) -> bool:
        """May a round start from this state now (market/domain/custody.py `may_rely_on`)?"""
        online = {a.address for a in self.store.agents(session) if a.online}
        custodians = [
            _custodian(row, online) for row in self.store.custody_of_state(session, order_id, digest)
        ]
        return may_rely_on(custodians, now, self.config.custody_wait_s)

    def holders(self, session: Session, order_id: int, digest: str, *, but: str = "") -> list[str]:
        """Addresses of the agents that reported holding the state for this order (``but`` left out)."""
        holders = []
        for row in self.store.custody_of_state(session, order_id, digest):
            agent = self.store.find_agent(session, row.agent)
            if row.held_at is not None and row.agent != but and agent is not None and agent.p2p_addr:
                holders.append(agent.p2p_addr)
        return holders

    def custody_for(self, session: Session, agent: str) -> tuple[Custody, ...]:
        """What the agent is asked to keep, each with the holders to fetch it from: its producers, then the
        custodians that hold it already."""
        kept = []
        for row in self.store.custody_of_agent(session, agent)[:MAX_CUSTODY]:
            holders = self.producer_addresses(session, row.order_id, row.state_digest)
            holders += [
                a
                for a in self.holders(session, row.order_id, row.state_digest, but=agent)
                if a not in holders
            ]
            source = StateSource(state_digest=row.state_digest, holders=tuple(holders))
            kept.append(Custody(state=source, held=row.held_at is not None))
        return tuple(kept)

    def producer_addresses(self, session: Session, order_id: int, digest: str) -> list[str]:
        """Addresses of the accepted replicas of the order whose reported state is ``digest``."""
        addresses = []
        for provider in producers_of_state(session, order_id, digest):
            agent = self.store.find_agent(session, provider)
            if agent is not None and agent.p2p_addr:
                addresses.append(agent.p2p_addr)
        return addresses

    def report(self, signed: Signed[CustodyReport]) -> int:
        """An agent's signed word that it holds a state it was asked to keep; NotFound if it was not asked
        (or the state was released meanwhile). The next round may be waiting for it, so advance at once."""
        message = verify_signed(signed, self.config.chain_id)
        now = self.clock()
        with self.store.transaction() as session:
            self.store.get_agent(session, message.agent)
            self.ctx.accept_agent_message(session, message, now)
            rows = [
                r
                for r in self.store.custody_of_agent(session, message.agent)
                if r.state_digest == message.state_digest
            ]
            if not rows:
                raise NotFound(f"{message.agent} is not asked to keep state {message.state_digest}")
            for row in rows:
                if row.held_at is None:
                    row.held_at = now
                    session.add(row)
        self.triggers.advance()
        return len(rows)


def producers_of_state(session: Session, order_id: int, digest: str) -> Sequence[str]:
    """Providers whose accepted replica of a unit of the order reported ``digest`` as its state (or, a
    folded shard unit, as the round state its outer step made)."""
    query = (
        select(ReplicaRow.provider)
        .join(UnitRow, col(UnitRow.id) == col(ReplicaRow.unit_id))
        .where(
            UnitRow.order_id == order_id,
            or_(ReplicaRow.state_digest == digest, ReplicaRow.round_state_digest == digest),
            ReplicaRow.state == ReplicaState.ACCEPTED.value,
        )
        .order_by(col(ReplicaRow.id))
    )
    return list(dict.fromkeys(session.exec(query).all()))


def _custodian(row: CustodyRow, online: set[str]) -> Custodian:
    return Custodian(row.agent, row.requested_at, row.held_at is not None, row.agent in online)
