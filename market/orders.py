"""Orders and rounds: register a buyer's escrowed order, open its rounds and units, close accepted rounds
through the outer step, retry failed units under a new key, expire late orders, report status."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from eth_abi import encode as abi_encode
from eth_utils import keccak
from sqlmodel import Session

from market.context import Lifecycle, MarketContext, row_id
from market.custody import CustodyBook, producers_of_state
from market.domain.binding import is_bound
from market.domain.pricing import escrow_plan
from market.domain.rosters import SETTLE_BY_ROUNDS, roster_shape, settlement_of
from market.domain.rounds import (
    AcceptedReplica,
    UnitPlan,
    aggregates_after,
    decide_shards,
    folded_round_state,
    folds,
    next_state,
    plan_aggregate,
    plan_round,
)
from market.domain.states import OrderState, ReplicaState, RoundState, UnitState, advance
from market.rosters import RosterBook
from market.store import OrderRow, ReplicaRow, RoundRow, UnitRow
from veritrain.errors import InvalidInput, MarketError, OrderMismatch, UnderfundedOrder
from veritrain.messages import (
    OrderRequest,
    OrderSpec,
    OrderStatus,
    OuterFields,
    StateSource,
    UnitKind,
    UnitStatus,
)


def unit_key_for(chain_order_id: int, round_index: int, shard: int, attempt: int) -> str:
    """keccak(abi.encode(orderId, round, shard, attempt)): unique per attempt, so a failed unit's retry
    is a new key the contract accepts as a re-assignment."""
    encoded = abi_encode(
        ["uint256", "uint32", "uint32", "uint32"], [chain_order_id, round_index, shard, attempt]
    )
    return "0x" + keccak(encoded).hex()


class OrderBook(Lifecycle):
    def __init__(self, ctx: MarketContext, rosters: RosterBook | None = None) -> None:
        super().__init__(ctx)
        self.custody = CustodyBook(ctx)
        self.rosters = rosters or RosterBook(ctx)

    def post_order(self, request: OrderRequest) -> OrderRow:
        """Register a buyer's order after checking its on-chain escrow covers it at the max price."""
        spec = request.spec
        recipe = self.recipes.lookup(spec.recipe)
        now = self.clock()
        # the round path by default where the spec can have a roster; an explicit "rounds" the spec cannot
        # take is refused before anything else (InvalidOrderSpec: not folded, adaptive ...)
        settlement = settlement_of(spec, request.settlement)
        shape = roster_shape(spec) if settlement == SETTLE_BY_ROUNDS else None
        if spec.total_steps % spec.unit_steps:
            raise InvalidInput(
                f"total_steps {spec.total_steps} must be a multiple of unit_steps {spec.unit_steps}"
            )
        if spec.deadline <= now:
            raise InvalidInput(f"order deadline {spec.deadline} is not in the future (market clock {now})")
        if self.chain is None:
            raise MarketError("the market has no chain configured; it cannot check an order's escrow")
        plan = escrow_plan(spec, recipe.flops_per_step, settlement)
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
                ("min_replicas", on_chain.min_replicas, plan.min_replicas),
                ("trusted_streak", on_chain.trusted_streak, plan.trusted_streak),
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
                rounds_total=spec.rounds,
                flops_per_step=recipe.flops_per_step,
                min_memory_mb=recipe.min_memory_mb,
                price_per_replica=on_chain.price_per_replica,
                max_price_per_pflop=spec.max_price_per_pflop,
                deadline=spec.deadline,
                created_at=now,
                posted_block=on_chain.posted_block or None,
            )
            session.add(order)
            session.flush()
            if shape is not None:  # matched once as a roster (market/rosters.py), not unit by unit
                self.rosters.register(session, order, shape, now)
                return order
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
        seed_block = self._round_seed_block(session, order, index)
        round_row = RoundRow(order_id=row_id(order), index=index, start_state_digest=start_state)
        session.add(round_row)
        session.flush()
        for plan in plan_round(spec, index):
            self._new_unit(session, order, round_row, spec, plan, 0, seed_block, now)
        return round_row

    def _round_seed_block(self, session: Session, order: OrderRow, index: int) -> int | None:
        """The block whose hash seeds round ``index``'s draws: the order's `OrderPosted` block for round 0,
        else the block of the chain event that settled the last of the previous round's units. Both are
        fixed by the chain, not by when the market runs its passes; neither hash was known when the
        transaction that made it was sent (docs/TRUST.md, "Replica and verifier selection")."""
        if index > 0:
            previous = self.store.round_of(session, row_id(order), index - 1)
            units = self.store.units_of_round(session, row_id(previous)) if previous is not None else []
            settled = _settled_after(units)
            if settled is not None:
                return settled
        return order.posted_block

    def _new_unit(
        self,
        session: Session,
        order: OrderRow,
        round_row: RoundRow,
        spec: OrderSpec,
        plan: UnitPlan,
        attempt: int,
        seed_block: int | None,
        now: int,
    ) -> UnitRow:
        unit = UnitRow(
            order_id=row_id(order),
            round_id=row_id(round_row),
            round_index=round_row.index,
            shard=plan.shard,
            kind=plan.kind.value,
            attempt=attempt,
            unit_key=unit_key_for(order.chain_order_id, round_row.index, plan.shard, attempt),
            k=spec.replicas,
            start_step=plan.start_step,
            steps=plan.steps,
            selection_block=seed_block,
            updated_at=now,
        )
        session.add(unit)
        session.flush()
        if plan.kind == UnitKind.TRAIN and attempt == 0 and self.rosters.seats(session, order):
            self.rosters.add_slots(session, order, unit)  # a roster's slots run it: no matching
        # a roster's failed unit is retried on the per-unit path (its round is revealed: no slot can run it)
        return unit

    def order_status(self, order_id: int) -> OrderStatus:
        with self.store.transaction() as session:
            order = self.store.get_order(session, order_id)
            units = []
            for unit in self.store.units_of_order(session, order_id):
                replicas = self.store.replicas_of(session, row_id(unit))
                accepted = [r.state_digest for r in replicas if r.state == ReplicaState.ACCEPTED.value]
                units.append(
                    UnitStatus(
                        unit_id=row_id(unit),
                        round_index=unit.round_index,
                        attempt=unit.attempt,
                        state=unit.state,
                        chain_unit_id=unit.chain_unit_id,
                        providers=tuple(
                            r.provider for r in replicas if r.state != ReplicaState.DROPPED.value
                        ),
                        accepted_state_digest=accepted[0] if accepted else None,
                        shard=unit.shard,
                        kind=UnitKind(unit.kind),
                        verifiers=tuple(json.loads(unit.verifiers_json)),
                        selection_block=unit.selection_block,
                        selection_seed=unit.selection_seed,
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
                roster=self.rosters.status(session, order_id),
                spec=OrderSpec.from_stored(order.spec_json),
            )

    def advance_orders(self) -> int:
        """Close accepted rounds through the outer step, open the next round, retry failed units, expire."""
        now = self.clock()
        changed = 0
        with self.store.transaction() as session:
            for order in self.store.orders_in(session, [OrderState.OPEN.value, OrderState.RUNNING.value]):
                changed += self._advance_order(session, order, now)
                if order.state in (OrderState.OPEN.value, OrderState.RUNNING.value):
                    self.custody.keep(session, row_id(order), self.live_states(session, order), now)
            self.custody.release_ended(session)
        if changed:  # a round opened or a failed unit got a new attempt (or an order ended: harmless)
            self.triggers.match(False)
        return changed

    def _advance_order(self, session: Session, order: OrderRow, now: int) -> int:
        spec = OrderSpec.from_stored(order.spec_json)
        roster = self.store.roster_of_order(session, row_id(order))
        if roster is not None and roster.providers_json == "[]" and roster.state != "failed":
            return 0  # a round-path order opens its first round once its roster is drawn
        # a round-path order's rounds run as a folded order's do, their training units on the roster's slots
        # (market/rosters.py: ROSTERED until every slot opened); past its deadline it expires as any order
        # does (its slots get no more work) and its roster is closed (RosterBook.plan), returning the budget
        if now > order.deadline:
            order.state = advance(OrderState(order.state), OrderState.EXPIRED, what=f"order {order.id}")
            current = self.store.round_of(session, row_id(order), order.rounds_accepted)
            if current is not None and current.state == RoundState.OPEN.value:
                current.state = RoundState.ABANDONED.value
                session.add(current)
            session.add(order)
            return 1
        round_row = self.store.round_of(session, row_id(order), order.rounds_accepted)
        if round_row is None:  # the last round closed and the next one waits for its start state's custody
            return self._open_when_kept(session, order, spec, now)
        units = self.store.units_of_round(session, row_id(round_row))
        shards = _latest(u for u in units if u.kind == UnitKind.TRAIN.value)
        aggregates = _latest(u for u in units if u.kind == UnitKind.AGGREGATE.value)
        closing = aggregates.get(spec.shards)
        if closing is None:
            # an accepted unit whose replicas reported no state bound to their result is retried like a
            # failed one: the next round must never start from an unbound digest
            settled = {shard: self._settled(session, u) for shard, u in shards.items()}
            decision = decide_shards(spec, {shard: state for shard, (state, _) in settled.items()})
            if decision.retry and self.store.is_canary_order(session, row_id(order)):
                # a canary's one unit has done its job once settled: its cheat was caught (a plant's always
                # is), or all its replicas failed; the next draw brings another, so it is not run again
                order.state = advance(OrderState(order.state), OrderState.CANCELLED, what=f"order {order.id}")
                round_row.state = RoundState.ABANDONED.value
                session.add_all([order, round_row])
                return 1
            for shard in decision.retry:  # migrate: a new attempt under a new unit key
                unit = shards[shard]
                retry = UnitPlan(round_row.index, shard, unit.start_step, unit.steps)
                self._new_unit(
                    session, order, round_row, spec, retry, unit.attempt + 1, _seed_after(unit), now
                )
            if decision.aggregate_over is None:
                return len(decision.retry)
            if folds(spec, round_row.index):  # the shard units' outer step made the round's state
                accepted = [replica for _, bound in settled.values() for replica in bound]
                round_row.start_state_digest = folded_round_state(round_row.index, accepted)
                order.current_state_digest = round_row.start_state_digest
                session.add_all([round_row, order])
            if aggregates_after(spec, round_row.index, rounds_path=roster is not None):
                plan = plan_aggregate(spec, round_row.index)
                seed_block = _settled_after(shards.values()) or _seed_after(shards[0])
                self._new_unit(session, order, round_row, spec, plan, 0, seed_block, now)
                return len(decision.retry) + 1
            if spec.shards > 1:  # folded: the next round's units run this round's outer step
                return len(decision.retry) + self._close_round(session, order, spec, round_row, None, now)
            closing = shards[0]
            closing_state, bound = settled[0]
        else:
            closing_state, bound = self._settled(session, closing)
            if closing_state == UnitState.FAILED:
                plan = plan_aggregate(spec, round_row.index)
                self._new_unit(
                    session, order, round_row, spec, plan, closing.attempt + 1, _seed_after(closing), now
                )
                return 1
        if closing_state != UnitState.ACCEPTED:
            return 0
        return self._close_round(session, order, spec, round_row, next_state(round_row.index, bound), now)

    def _close_round(
        self,
        session: Session,
        order: OrderRow,
        spec: OrderSpec,
        round_row: RoundRow,
        state: str | None,
        now: int,
    ) -> int:
        """Accept the round and open the next one. ``state``: the next round's start, which becomes the
        order's current state; None for a folded round, whose successor's units compute it themselves."""
        round_row.state = advance(
            RoundState(round_row.state), RoundState.ACCEPTED, what=f"round {round_row.id}"
        )
        round_row.next_state_digest = state
        session.add(round_row)
        order.rounds_accepted += 1
        if state is not None:
            order.current_state_digest = state
        if order.rounds_accepted == order.rounds_total:
            order.state = advance(OrderState(order.state), OrderState.COMPLETED, what=f"order {order.id}")
        else:
            self.custody.keep(session, row_id(order), self.live_states(session, order), now)
            self._open_when_kept(session, order, spec, now)
        session.add(order)
        return 1

    def _open_when_kept(self, session: Session, order: OrderRow, spec: OrderSpec, now: int) -> int:
        """Open the next round once its start state is held by someone besides its producers (or nobody
        else could be asked, or ``custody_wait_s`` passed): from then on the order relies on that state."""
        state = order.current_state_digest  # None: a folded order's round 1 starts from the genesis
        if order.rounds_accepted >= order.rounds_total:
            return 0
        if state is not None and not self.custody.may_rely_on(session, row_id(order), state, now):
            return 0
        # a folded round's own state is known once its units computed it (set when its shards close)
        start = None if folds(spec, order.rounds_accepted) else state
        self._open_round(session, order, spec, order.rounds_accepted, start, now)
        return 1

    def live_states(self, session: Session, order: OrderRow) -> dict[str, set[str]]:
        """The states the order may still start a unit from, each with the providers that produced it: the
        current round's start and (M > 1) each shard's last accepted result (its inner AdamW state), and
        for a folded round every accepted result of the round before (its units' outer step reads them)."""
        live: dict[str, set[str]] = {}
        if order.current_state_digest is not None:
            digest = order.current_state_digest
            live[digest] = set(producers_of_state(session, row_id(order), digest))
        spec = OrderSpec.from_stored(order.spec_json)
        if spec.shards > 1:
            latest: dict[int, UnitRow] = {}
            inputs: list[UnitRow] = []
            for unit in self.store.units_of_order(session, row_id(order)):  # by id: later rounds last
                if unit.kind == UnitKind.TRAIN.value and unit.state == UnitState.ACCEPTED.value:
                    latest[unit.shard] = unit
                    if folds(spec, order.rounds_accepted) and unit.round_index == order.rounds_accepted - 1:
                        inputs.append(unit)
            for unit in [*latest.values(), *inputs]:
                bound = self._bound_accepted(session, unit)
                if bound:
                    digest = next_state(unit.round_index, bound)
                    live.setdefault(digest, set()).update(
                        r.provider for r in bound if r.state_digest == digest
                    )
        return live

    def _settled(self, session: Session, unit: UnitRow) -> tuple[UnitState, list[AcceptedReplica]]:
        """The unit's state for round logic and its bound accepted replicas (read once): accepted counts
        only with a bound state to start from."""
        if unit.state != UnitState.ACCEPTED.value:
            return UnitState(unit.state), []
        bound = self._bound_accepted(session, unit)
        return (UnitState.ACCEPTED if bound else UnitState.FAILED), bound

    def _bound_accepted(self, session: Session, unit: UnitRow) -> list[AcceptedReplica]:
        """The unit's accepted replicas whose reported state is bound to their revealed result."""
        return [
            AcceptedReplica(row_id(unit), r.provider, r.state_digest or "", r.round_state_digest)
            for r in self.store.replicas_of(session, row_id(unit))
            if r.state == ReplicaState.ACCEPTED.value
            and is_bound(
                r.result_digest,
                r.state_digest,
                r.transcript_root,
                aggregate=unit.kind == UnitKind.AGGREGATE.value,
                # the reveal of a folded unit's replica must name its outer step, any other's must not
                fold=_fold_of(r),
            )
        ]

    def unit_work(self, session: Session, order: OrderRow, unit: UnitRow) -> dict[str, Any]:
        """The UnitWork fields shared by a provider's assignment and a verifier's job."""
        spec = OrderSpec.from_stored(order.spec_json)
        work: dict[str, Any] = {
            "unit_id": row_id(unit),
            "order_id": row_id(order),
            "recipe": spec.recipe,
            "dataset_digest": spec.dataset_digest,
            "seed": spec.seed,
            "round_index": unit.round_index,
            "shard": unit.shard,
            "start_step": unit.start_step,
            "steps": unit.steps,
            "checkpoint_every": spec.checkpoint_every_for(unit.steps) if unit.steps else 1,
            "num_shards": spec.shards,
            "start_state": self._start_state(session, unit),
            "kind": UnitKind(unit.kind),
        }
        if spec.shards == 1:
            return work
        aggregate = unit.kind == UnitKind.AGGREGATE.value
        if aggregate or folds(spec, unit.round_index):  # the outer step over a round's accepted results
            inputs_round = (
                unit.round_id
                if aggregate
                else row_id(self._round(session, unit.order_id, unit.round_index - 1))
            )
            round_units = self.store.units_of_round(session, inputs_round)
            shards = _latest(u for u in round_units if u.kind == UnitKind.TRAIN.value)
            work["shard_results"] = tuple(
                self._result_source(session, shards[shard])
                if shard in shards and shards[shard].state == UnitState.ACCEPTED.value
                else None
                for shard in range(spec.shards)
            )
            work["outer"] = OuterFields(
                aggregation=spec.outer_aggregation,
                trim=spec.outer_trim,
                lr=spec.outer_lr,
                momentum=spec.outer_momentum,
            )
        if not aggregate:
            work["previous"] = self._previous_result(session, unit)
        return work

    def _round(self, session: Session, order_id: int, index: int) -> RoundRow:
        round_row = self.store.round_of(session, order_id, index)
        if round_row is None:
            raise MarketError(f"order {order_id} has no round {index}")
        return round_row

    def _start_state(self, session: Session, unit: UnitRow) -> StateSource:
        """The round's start state and the agents that produced it (they keep and serve the blob); for a
        folded shard unit, the previous round's state its outer step starts from."""
        round_row = self.store.get_round(session, unit.round_id)
        order = self.store.get_order(session, unit.order_id)
        if unit.kind == UnitKind.TRAIN.value and folds(
            OrderSpec.from_stored(order.spec_json), unit.round_index
        ):
            round_row = self._round(session, unit.order_id, unit.round_index - 1)
        digest = round_row.start_state_digest
        if digest is None or round_row.index == 0:
            return StateSource(state_digest=digest)
        previous = self.store.round_of(session, unit.order_id, round_row.index - 1)
        holders: list[str] = []
        if previous is not None:
            for prior in self.store.units_of_round(session, row_id(previous)):
                holders.extend(self._holders(session, prior, digest))
        for sibling in self.store.units_of_round(session, row_id(round_row)):  # they fetched it and keep it
            holders.extend(a for a in self._holders(session, sibling) if a not in holders)
        kept = self.custody.holders(session, unit.order_id, digest)
        holders.extend(a for a in kept if a not in holders)
        return StateSource(state_digest=digest, holders=tuple(holders))

    def _previous_result(self, session: Session, unit: UnitRow) -> StateSource | None:
        """Shard m's last accepted result before this round (its inner AdamW state carries on from it), or
        None when the shard has none yet."""
        for index in range(unit.round_index - 1, -1, -1):
            round_row = self.store.round_of(session, unit.order_id, index)
            if round_row is None:
                continue
            for prior in self.store.units_of_round(session, row_id(round_row)):
                if (
                    prior.kind == UnitKind.TRAIN.value
                    and prior.shard == unit.shard
                    and prior.state == UnitState.ACCEPTED.value
                ):
                    return self._result_source(session, prior)
        return None

    def _result_source(self, session: Session, unit: UnitRow) -> StateSource:
        """An accepted shard unit's state and who holds it: its accepted replicas, and the accepted
        replicas of its round's aggregate unit, which fetched it (so one lost provider loses no state)."""
        digest = next_state(unit.round_index, self._bound_accepted(session, unit))
        holders = self._holders(session, unit, digest)
        for sibling in self.store.units_of_round(session, unit.round_id):
            if sibling.kind == UnitKind.AGGREGATE.value:
                holders.extend(a for a in self._holders(session, sibling) if a not in holders)
        holders.extend(a for a in self.custody.holders(session, unit.order_id, digest) if a not in holders)
        return StateSource(state_digest=digest, holders=tuple(holders))

    def _holders(self, session: Session, unit: UnitRow, digest: str | None = None) -> list[str]:
        """Addresses of the unit's accepted replicas (that produced ``digest``, when given)."""
        holders = []
        for replica in self.store.replicas_of(session, row_id(unit)):
            if replica.state == ReplicaState.ACCEPTED.value and digest in (None, replica.state_digest):
                agent = self.store.find_agent(session, replica.provider)
                if agent is not None and agent.p2p_addr:
                    holders.append(agent.p2p_addr)
        return holders


def _fold_of(replica: ReplicaRow) -> tuple[str, str] | None:
    """The outer step a replica's reveal named (only a folded unit's reveal may name one)."""
    if replica.round_state_digest is None or replica.inputs_commitment is None:
        return None
    return replica.round_state_digest, replica.inputs_commitment


def _latest(units: Iterable[UnitRow]) -> dict[int, UnitRow]:
    """Each shard's latest attempt."""
    latest: dict[int, UnitRow] = {}
    for unit in units:
        if unit.shard not in latest or unit.attempt > latest[unit.shard].attempt:
            latest[unit.shard] = unit
    return latest


def _settled_after(units: Iterable[UnitRow]) -> int | None:
    """The block of the chain event that settled the last of ``units`` (None: none settled on chain)."""
    return max((u.settled_block for u in units if u.settled_block is not None), default=None)


def _seed_after(unit: UnitRow) -> int | None:
    """The seed block of what replaces or follows ``unit`` alone: the block that settled it, else its own."""
    return unit.settled_block if unit.settled_block is not None else unit.selection_block
