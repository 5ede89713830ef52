"""Canary units (DESIGN.md §4.7, issue 9 item 2): the market replays verified units as ordinary orders
bought by an operator-funded canary account, and sends any replica whose reveal is not the known answer
to the verifiers (the rules: :mod:`market.domain.canary`).

Each accepted training unit of a buyer's order is drawn once, at ``MarketConfig.canary_rate_ppm`` with the
market's own secret randomness, so canaries are that share of the units worked and nobody can tell in
advance when one comes. A drawn unit's order gets a canary order replaying its verified round-0 unit (the
one unit whose start state, the recipe's seeded initialisation, needs no custody): the same recipe, data,
seed, unit length and replication policy, one unit long, posted and escrowed on chain by the canary
account and registered like a buyer's order. The canary's work is paid by the operator (it counts in the
network's compute multiplier, docs/VERIFICATION.md §3d). Once the canary order has ended, the account
closes it, so what its escrow did not spend (the replicas a solo unit did not need, an unused verifier
fee) is paid back to the account instead of staying locked.

Planted cheats test the verifiers the same way (:mod:`market.domain.canary`): a drawn unit is replayed
as a *planted* canary at ``MarketConfig.plant_rate_ppm`` instead (one replica, matched only to one of the
operator's plant agents, which forges it), when the operator runs one never caught (a caught plant's fraud
record would give its next unit away). The plant agents are those named in ``MarketConfig.plant_agents``
and the keys the canary account enrolls (``POST /agents/plants``): a plant agent run with
``--plant-keys DIR`` holds that account's key and, once caught, moves on to the next key of DIR (funded by
the operator) and enrolls it, so planting goes on at the stated rate without a restart. Its
verification job shows the reason of the chain's draw that sent it there, never ``canary``.

Posting follows the outbox's discipline: the canary's spec (deadline included, so its hash is unique) is
written before anything is sent; a post is claimed for ``CANARY_CLAIM_S``; a retry first looks on chain
for the order the account may have posted for that spec hash before a crash, so a canary is never bought
twice.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable

from sqlmodel import Session

from market.context import Lifecycle, MarketContext, row_id
from market.domain.canary import PPM, KnownAnswer, Replay, canary_spec, replay_of, replayable
from market.domain.pricing import escrow_plan
from market.domain.states import OrderState, ReplicaState, UnitState
from market.orders import OrderBook
from market.ports import CanaryAccount
from market.store import CanaryRow, MarketStore, OrderRow, UnitRow
from veritrain.errors import InvalidInput, MarketError
from veritrain.messages import OrderRequest, OrderSpec, UnitKind

log = logging.getLogger(__name__)

# A canary order must be worked within a day of being posted (its escrow comes back when it is closed).
CANARY_DEADLINE_S = 86_400
# A post in flight is left alone this long, and so is a failed one (an unfunded account is not asked again
# every tick); after that a retry looks for its order on chain first.
CANARY_CLAIM_S = 120
# The outbox action that draws a unit for verification (requestVerification) before its reveals are
# relayed: a canary replica revealed something other than the known answer.
VERIFY = "verify"
# Canary rows whose order is on its way: posted on chain, or registered with the market (then closed).
LIVE_CANARY_STATES = ("posted", "registered")
# A canary order in one of these states has no unit left to run: it is closed on chain.
ENDED_ORDER_STATES = frozenset(
    {OrderState.COMPLETED.value, OrderState.EXPIRED.value, OrderState.CANCELLED.value}
)


def _secret_roll() -> int:
    return secrets.randbelow(PPM)


def canary_of(store: MarketStore, session: Session, order: OrderRow) -> CanaryRow | None:
    """The canary ``order`` replays, with its known result digest, if it is one (found by its spec hash and
    chain order, so a canary registered just before a crash, whose row was not updated yet, is still
    recognised)."""
    for row in store.canaries_with_spec(session, order.spec_hash):
        if row.state in LIVE_CANARY_STATES and row.chain_order_id == order.chain_order_id:
            return row
    return None


class CanaryBook(Lifecycle):
    def __init__(
        self,
        ctx: MarketContext,
        orders: OrderBook,
        account: CanaryAccount | None,
        roll: Callable[[], int] = _secret_roll,
    ) -> None:
        super().__init__(ctx)
        self.orders = orders
        self.account = account
        self.roll = roll

    def run(self) -> int:
        """Draw the newly verified units, then post and register every canary on its way; returns how many
        canary orders were registered now. Without a canary account there are no canaries."""
        if self.account is None:
            return 0
        self.plan()
        with self.store.transaction() as session:
            pending = [row_id(row) for row in self.store.canaries_in(session, ["planned", "posted"])]
            ended = [
                row_id(row)
                for row in self.store.canaries_in(session, ["registered"])
                if self.store.get_order(session, row.order_id or 0).state in ENDED_ORDER_STATES
            ]
        for canary_id in ended:
            self.close(canary_id)
        return sum(1 for canary_id in pending if self.post(canary_id) == "registered")

    def close(self, canary_id: int) -> str:
        """Close an ended canary order on chain (its unspent escrow back to the canary account); its state."""
        account = self._account()
        with self.store.transaction() as session:
            chain_order_id = self.store.get_canary(session, canary_id).chain_order_id
        if chain_order_id is None:
            raise MarketError(f"canary {canary_id} is registered without a chain order")
        try:
            account.close_order(chain_order_id)
        except Exception as exc:  # a unit still settling on chain (UnitsStillOpen), RPC down: next run
            return self._record(canary_id, "registered", chain_order_id, f"{type(exc).__name__}: {exc}")
        return self._record(canary_id, "closed", chain_order_id, "")

    def plan(self) -> int:
        """Draw each accepted unit once; a drawn one gets a canary spec. Returns how many drawn."""
        account = self._account()
        now = self.clock()
        drawn = 0
        with self.store.transaction() as session:
            for unit in self.store.canary_candidates(session):
                order = self.store.get_order(session, unit.order_id)
                row = self._considered(session, order, unit, account.address, now)
                session.add(row)
                drawn += row.state == "planned"
        return drawn

    def _considered(
        self, session: Session, order: OrderRow, unit: UnitRow, canary_buyer: str, now: int
    ) -> CanaryRow:
        row = CanaryRow(
            drawn_unit_id=row_id(unit), state="passed", known_result_digest="", created_at=now, updated_at=now
        )
        # a canary's own unit is never drawn: it would only replay its source again
        if order.buyer.lower() == canary_buyer.lower():
            return row
        plant_rate = self.config.plant_rate_ppm if self.config.runs_plants else 0
        replay = replay_of(self.config.canary_rate_ppm, plant_rate, self.roll())
        if replay == Replay.PLANTED and not self._uncaught_plant(session):
            log.warning(
                "no plant agent without a fraud record is registered: unit %d is not replayed as a planted "
                "cheat (a caught plant is a tell to verifiers); start plant agents with fresh keys",
                row_id(unit),
            )
            return row
        if replay == Replay.NONE:
            return row
        spec = OrderSpec.from_stored(order.spec_json)
        known = self._round_0_answer(session, order, spec)
        if known is None:
            return row
        row.source_unit_id, row.known_result_digest = known.source_unit_id, known.result_digest
        planted = replay == Replay.PLANTED
        deadline = now + CANARY_DEADLINE_S
        replayed = canary_spec(spec, canary_buyer, deadline, planted=planted)
        # one chain order per canary, found by its spec hash: two replays of one unit differ by their deadline
        while self.store.canaries_with_spec(session, replayed.spec_hash()):
            deadline += 1
            replayed = canary_spec(spec, canary_buyer, deadline, planted=planted)
        row.state = "planned"
        row.planted = planted
        row.spec_json = replayed.model_dump_json()
        row.spec_hash = replayed.spec_hash()
        return row

    def _uncaught_plant(self, session: Session) -> bool:
        """Whether one of the operator's plant agents is registered and has no fraud on record (the only
        kind :func:`market.domain.matching.match_plant` gives a planted unit to)."""
        return any(agent.rep_fraud == 0 for agent in self.ctx.plant_agents(session))

    def _round_0_answer(self, session: Session, order: OrderRow, spec: OrderSpec) -> KnownAnswer | None:
        """The known answer of the order's accepted round-0 unit, if it has one a canary may replay."""
        round_0 = self.store.round_of(session, row_id(order), 0)
        units = self.store.units_of_round(session, row_id(round_0)) if round_0 is not None else []
        for unit in units:
            if unit.state != UnitState.ACCEPTED.value:
                continue
            accepted = [
                r.result_digest or ""
                for r in self.store.replicas_of(session, row_id(unit))
                if r.state == ReplicaState.ACCEPTED.value
            ]
            known = replayable(spec, UnitKind(unit.kind), unit.round_index, accepted, row_id(unit))
            if known is not None:
                return known
        return None

    def post(self, canary_id: int) -> str:
        """Post a planned canary on chain (at most once) and register it with the market; its state."""
        account = self._account()
        now = self.clock()
        with self.store.transaction() as session:
            row = self.store.get_canary(session, canary_id, for_update=True)
            if row.state == "planned":
                if row.claimed_until > now:
                    return row.state  # someone is posting it
                row.claimed_until = now + CANARY_CLAIM_S
                session.add(row)
            state, spec_json, spec_hash = row.state, row.spec_json, row.spec_hash
            chain_order_id = row.chain_order_id
        spec = OrderSpec.from_stored(spec_json)
        if state == "planned":
            try:
                chain_order_id = account.posted_order(spec_hash)  # posted before a crash: not again
                if chain_order_id is None:
                    plan = escrow_plan(spec, self.recipes.lookup(spec.recipe).flops_per_step)
                    chain_order_id = account.post_order(spec_hash, plan, spec.deadline)
            except Exception as exc:  # unfunded account, RPC down: the next run tries again
                return self._record(canary_id, "planned", None, f"{type(exc).__name__}: {exc}")
            self._record(canary_id, "posted", chain_order_id, "")
            state = "posted"
        if state != "posted" or chain_order_id is None:
            return state
        try:
            order_id = self._register(spec, chain_order_id)
        except (MarketError, InvalidInput) as exc:  # say, the node lags behind the post: tried again later
            return self._record(canary_id, "posted", chain_order_id, f"{type(exc).__name__}: {exc}")
        with self.store.transaction() as session:
            row = self.store.get_canary(session, canary_id, for_update=True)
            row.state, row.order_id, row.updated_at, row.last_error = "registered", order_id, now, None
            session.add(row)
            source = row.source_unit_id
        log.info("canary order %d replays unit %s", order_id, source)
        return "registered"

    def _register(self, spec: OrderSpec, chain_order_id: int) -> int:
        with self.store.transaction() as session:
            existing = self.store.order_by_chain_id(session, chain_order_id)
            if existing is not None:  # registered before a crash
                return row_id(existing)
        # a canary is a unit that must look like any other unit on the per-unit path: never a roster
        return row_id(
            self.orders.post_order(OrderRequest(spec=spec, chain_order_id=chain_order_id, settlement="units"))
        )

    def _record(self, canary_id: int, state: str, chain_order_id: int | None, error: str) -> str:
        now = self.clock()
        with self.store.transaction() as session:
            row = self.store.get_canary(session, canary_id, for_update=True)
            row.state = state
            row.chain_order_id = chain_order_id
            row.claimed_until = now + CANARY_CLAIM_S if error else 0
            row.last_error = error or None
            row.updated_at = now
            session.add(row)
        if error:
            log.warning("canary %d: %s; retried on the next run", canary_id, error)
        return state

    def _account(self) -> CanaryAccount:
        if self.account is None:
            raise MarketError("the market has no canary account configured")
        return self.account
