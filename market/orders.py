"""Orders and rounds: register a buyer's escrowed order, open its rounds and units, close accepted rounds
through the outer step, retry failed units under a new key, expire late orders, report status."""

from __future__ import annotations

from typing import Any

from eth_abi import encode as abi_encode
from eth_utils import keccak
from sqlmodel import Session

from market.context import Lifecycle, row_id
from market.domain.binding import is_bound
from market.domain.pricing import escrow_plan
from market.domain.rounds import AcceptedReplica, outer_step_for, plan_round
from market.domain.states import OrderState, ReplicaState, RoundState, UnitState, advance
from market.store import OrderRow, RoundRow, UnitRow
from veritrain.errors import InvalidInput, MarketError, OrderMismatch, UnderfundedOrder
from veritrain.messages import OrderRequest, OrderSpec, OrderStatus, StateSource, UnitStatus


def unit_key_for(chain_order_id: int, round_index: int, shard: int, attempt: int) -> str:
    """keccak(abi.encode(orderId, round, shard, attempt)): unique per attempt, so a failed unit's retry
    is a new key the contract accepts as a re-assignment."""
    encoded = abi_encode(
        ["uint256", "uint32", "uint32", "uint32"], [chain_order_id, round_index, shard, attempt]
    )
    return "0x" + keccak(encoded).hex()


class OrderBook(Lifecycle):
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
        round_row = RoundRow(order_id=row_id(order), index=index, start_state_digest=start_state)
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
            order_id=row_id(order),
            round_id=row_id(round_row),
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
            current = self.store.round_of(session, row_id(order), order.rounds_accepted)
            if current is not None and current.state == RoundState.OPEN.value:
                current.state = RoundState.ABANDONED.value
                session.add(current)
            session.add(order)
            return 1
        round_row = self.store.round_of(session, row_id(order), order.rounds_accepted)
        if round_row is None:
            return 0
        units = self.store.units_of_round(session, row_id(round_row))
        latest: dict[int, UnitRow] = {}
        for unit in units:
            if unit.shard not in latest or unit.attempt > latest[unit.shard].attempt:
                latest[unit.shard] = unit
        changed = 0
        for shard, unit in latest.items():
            # migrate: a new attempt under a new unit key (also when no accepted replica reported a state
            # bound to its result: the next round must never start from an unbound digest)
            if unit.state == UnitState.FAILED.value or (
                unit.state == UnitState.ACCEPTED.value and not self._bound_accepted(session, unit)
            ):
                self._new_unit(
                    session, order, round_row, spec, shard, unit.start_step, unit.steps, unit.attempt + 1, now
                )
                changed += 1
        if changed or any(u.state != UnitState.ACCEPTED.value for u in latest.values()):
            return changed
        accepted = [self._bound_accepted(session, u) for u in sorted(latest.values(), key=lambda u: u.shard)]
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

    def _bound_accepted(self, session: Session, unit: UnitRow) -> list[AcceptedReplica]:
        """The unit's accepted replicas whose reported state is bound to their revealed result."""
        return [
            AcceptedReplica(row_id(unit), r.provider, r.state_digest or "")
            for r in self.store.replicas_of(session, row_id(unit))
            if r.state == ReplicaState.ACCEPTED.value
            and is_bound(r.result_digest, r.state_digest, r.transcript_root)
        ]

    def unit_work(self, session: Session, order: OrderRow, unit: UnitRow) -> dict[str, Any]:
        """The UnitWork fields shared by a provider's assignment and a verifier's job."""
        spec = OrderSpec.model_validate_json(order.spec_json)
        return {
            "unit_id": row_id(unit),
            "order_id": row_id(order),
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
            for prior in self.store.units_of_round(session, row_id(previous)):
                for replica in self.store.replicas_of(session, row_id(prior)):
                    if replica.state == ReplicaState.ACCEPTED.value and replica.state_digest == digest:
                        agent = self.store.find_agent(session, replica.provider)
                        if agent is not None and agent.p2p_addr:
                            holders.append(agent.p2p_addr)
        return StateSource(state_digest=digest, holders=tuple(holders))
