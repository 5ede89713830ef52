"""A unit's assignment: the providers' accept, commit and reveal, the decision (finalize or verify), the
unit's outcome once settled, and the deadlines that move it on when a replica is silent."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlmodel import Session

from market.canary import VERIFY, canary_of
from market.context import Lifecycle, MarketContext, require_signer, row_id
from market.domain.binding import is_bound
from market.domain.canary import differs_from_known
from market.domain.rounds import folds
from market.domain.states import ReplicaState, UnitState, advance, settle_to
from market.matchmaker import Matchmaker
from market.orders import OrderBook
from market.store import CanaryRow, OrderRow, ReplicaRow, UnitRow, VerificationJobRow
from veritrain.errors import IllegalTransition, InvalidInput, MarketError, UnboundResult
from veritrain.messages import (
    CANARY_REASON,
    AcceptSubmission,
    Assignment,
    AssignmentPhase,
    CommitSubmission,
    OrderSpec,
    ReplicaOutcome,
    RevealSubmission,
    UnitKind,
)

# Batched settlement: a unit's signed commits go out in one commitBatch once every replica committed, its
# reveals in one revealBatch once every committed replica revealed. Until then each waits, but never past
# its phase's deadline less a margin (a quarter of the window, at least 10 s: room for the send, its
# retries and the chain's clock) nor past its signature's deadline less 10 s, so a silent replica never
# makes the others miss theirs.
BATCH_MARGIN_MIN_S = 10
BATCH_MARGIN_SHARE = 4


def batch_send_by(deadline: int, window_s: int) -> int:
    """The latest time a commit or reveal waiting for its unit's others is sent anyway."""
    return deadline - max(BATCH_MARGIN_MIN_S, window_s // BATCH_MARGIN_SHARE)


@dataclass
class SweepResult:
    lost_agents: list[str] = field(default_factory=list)
    dropped_replicas: int = 0
    expiring_units: int = 0


class Assignments(Lifecycle):
    def __init__(self, ctx: MarketContext, orders: OrderBook, matching: Matchmaker) -> None:
        super().__init__(ctx)
        self.orders = orders
        self.matching = matching

    def assignments_for(self, session: Session, provider: str) -> list[Assignment]:
        active = [ReplicaState.PROPOSED.value, ReplicaState.SIGNED.value, ReplicaState.COMMITTED.value]
        views: list[Assignment] = []
        for replica in self.store.replicas_of_provider(session, provider, active):
            unit = self.store.get_unit(session, replica.unit_id)
            if unit.state == UnitState.ROSTERED.value:  # a roster slot (market/rosters.py)
                order = self.store.get_order(session, unit.order_id)
                slot = self.orders.rosters.slot_assignment(session, order, unit, replica)
                if slot is not None:
                    views.append(
                        Assignment(
                            **self.orders.unit_work(session, order, unit),
                            replica_index=replica.index,
                            chain_order_id=order.chain_order_id,
                            **slot,
                        )
                    )
                continue
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
            **self.orders.unit_work(session, order, unit),
            replica_index=replica.index,
            phase=phase,
            chain_order_id=order.chain_order_id,
            unit_key=unit.unit_key,
            accept_deadline=unit.accept_deadline,
            chain_unit_id=unit.chain_unit_id,
            commit_deadline=unit.commit_deadline or None,
        )

    def accept(self, submission: AcceptSubmission) -> UnitRow:
        """Record a provider's Accept signature; when all replicas signed, queue the assign transaction."""
        unit = self._record_accept(submission)
        if unit.state == UnitState.ASSIGNING.value:
            self.triggers.settle()
        return unit

    def _record_accept(self, submission: AcceptSubmission) -> UnitRow:
        from veritrain.chain.eip712 import market_domain

        now = self.clock()
        domain = market_domain(self.config.chain_id, self.ctx.job_market())
        with self.store.transaction() as session:
            unit = self.store.get_unit(session, submission.unit_id, for_update=True)
            order = self.store.get_order(session, unit.order_id)
            replica = self.store.replica(session, row_id(unit), submission.provider)
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
            require_signer(domain, "Accept", message, submission.signature, submission.provider)
            replica.state = advance(ReplicaState(replica.state), ReplicaState.SIGNED, what="replica")
            replica.accept_nonce = submission.nonce
            replica.accept_deadline = submission.deadline
            replica.accept_signature = submission.signature
            session.add(replica)
            session.flush()
            live = self.ctx.live_replicas(session, unit)
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
                self.store.enqueue(session, row_id(unit), "assign", payload, now)
            return unit

    def commit(self, submission: CommitSubmission) -> UnitRow:
        """Record and queue a provider's signed commit; when all committed the reveal phase begins."""
        unit = self._record_commit(submission)
        self.triggers.settle()
        return unit

    def _record_commit(self, submission: CommitSubmission) -> UnitRow:
        from veritrain.chain.eip712 import market_domain

        now = self.clock()
        domain = market_domain(self.config.chain_id, self.ctx.job_market())
        with self.store.transaction() as session:
            unit = self.store.get_unit(session, submission.unit_id, for_update=True)
            replica = self.store.replica(session, row_id(unit), submission.provider)
            if unit.state != UnitState.COMMITTING.value or unit.chain_unit_id is None:
                raise IllegalTransition(f"unit {unit.id} is {unit.state}; commits are taken while committing")
            advance(
                ReplicaState(replica.state), ReplicaState.COMMITTED, what=f"replica of {replica.provider}"
            )
            if submission.deadline <= now:  # it would only fail its unit's batch
                raise InvalidInput(f"commit deadline {submission.deadline} has passed (market clock {now})")
            message = {
                "unitId": unit.chain_unit_id,
                "provider": submission.provider,
                "commitment": submission.commitment,
                "deadline": submission.deadline,
            }
            require_signer(domain, "UnitCommit", message, submission.signature, submission.provider)
            replica.state = ReplicaState.COMMITTED.value
            replica.commitment = submission.commitment
            replica.commit_deadline = submission.deadline
            replica.commit_signature = submission.signature
            session.add(replica)
            payload = {
                "unit_id": unit.chain_unit_id,
                **submission.model_dump(mode="json", exclude={"unit_id"}),
            }
            entry = self.store.enqueue(session, row_id(unit), f"commit:{submission.provider}", payload, now)
            entry.next_attempt_at = min(
                batch_send_by(unit.commit_deadline, self.config.commit_window_s),
                submission.deadline - BATCH_MARGIN_MIN_S,  # the chain checks the signature's deadline too
            )
            session.flush()
            if all(r.state == ReplicaState.COMMITTED.value for r in self.ctx.live_replicas(session, unit)):
                unit.state = advance(UnitState(unit.state), UnitState.REVEALING, what=f"unit {unit.id}")
                unit.updated_at = now
                session.add(unit)
                self._release_batch(session, unit, "commit", now)
            return unit

    def _release_batch(self, session: Session, unit: UnitRow, kind: str, now: int) -> None:
        """Every replica's ``kind`` is in: the unit's waiting intents of that kind are due now (one batch)."""
        for entry in self.store.outbox_of_kind(session, row_id(unit), kind):
            if entry.state == "pending" and entry.next_attempt_at > now:
                entry.next_attempt_at = now
                session.add(entry)

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
            replica = self.store.replica(session, row_id(unit), submission.provider)
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
            aggregate = unit.kind == UnitKind.AGGREGATE.value
            order = self.store.get_order(session, unit.order_id)
            folded = not aggregate and folds(OrderSpec.from_stored(order.spec_json), unit.round_index)
            round_state, inputs = submission.round_state_digest, submission.inputs_commitment
            fold = None if round_state is None or inputs is None else (round_state, inputs)
            if folded != (fold is not None) or (fold is None and (round_state or inputs)):
                need = "required: the unit runs the outer step" if folded else "only for a folded shard unit"
                raise UnboundResult(
                    f"reveal of {submission.provider} for unit {unit.id}: round_state_digest and "
                    f"inputs_commitment are {need}"
                )
            if not is_bound(
                submission.result_digest,
                submission.state_digest,
                submission.transcript_root,
                aggregate=aggregate,
                fold=fold,
            ):
                opened = (
                    "output digest and inputs commitment" if aggregate else "state_digest and transcript_root"
                )
                raise UnboundResult(
                    f"reveal of {submission.provider} for unit {unit.id}: {opened} "
                    f"do not hash to result_digest {submission.result_digest}"
                )
            replica.state = ReplicaState.REVEALED.value
            replica.result_digest = submission.result_digest
            replica.salt = submission.salt
            replica.state_digest = submission.state_digest
            replica.transcript_root = submission.transcript_root
            replica.round_state_digest = submission.round_state_digest
            replica.inputs_commitment = submission.inputs_commitment
            session.add(replica)
            # before the reveal is relayed (queued first, so the reveal waits for it): the operator's
            # unanimous reveal batch of an undrawn unit finalizes it in the same transaction
            self._check_known_answer(session, unit, submission.result_digest, now)
            payload = {
                "unit_id": unit.chain_unit_id,
                "provider": submission.provider,
                "result_digest": submission.result_digest,
                "salt": submission.salt,
            }
            entry = self.store.enqueue(session, row_id(unit), f"reveal:{submission.provider}", payload, now)
            reveal_deadline = unit.commit_deadline + self.config.reveal_window_s
            entry.next_attempt_at = batch_send_by(reveal_deadline, self.config.reveal_window_s)
            session.flush()
            self._after_reveal(session, unit, now)
            return unit

    def on_revealed_on_chain(self, session: Session, unit: UnitRow, digest: str, now: int) -> None:
        """A replica's reveal landed on chain without the market's relay (its provider, or anyone with its
        salt, sent it): check it against a canary's known answer, as a relayed reveal is, and decide the
        unit once every replica is in. The chain leaves such a unit to the operator's finalize until its
        verdict deadline, so this check always comes first."""
        if unit.state not in (UnitState.COMMITTING.value, UnitState.REVEALING.value):
            return
        self._check_known_answer(session, unit, digest, now)
        live = self.ctx.live_replicas(session, unit)
        if unit.state == UnitState.COMMITTING.value:
            if any(r.state == ReplicaState.SIGNED.value for r in live):
                return  # a replica never committed: the commit deadline will move the unit on
            unit.state = advance(UnitState(unit.state), UnitState.REVEALING, what=f"unit {unit.id}")
            unit.updated_at = now
            session.add(unit)
        self._after_reveal(session, unit, now)

    def _check_known_answer(self, session: Session, unit: UnitRow, digest: str, now: int) -> None:
        """A reveal that is not the known answer of the canary ``unit`` replays: draw the unit on chain."""
        if self._missed_canary(session, unit, [digest]) is not None:
            self.store.enqueue(session, row_id(unit), VERIFY, {"unit_id": unit.chain_unit_id}, now)

    def _after_reveal(self, session: Session, unit: UnitRow, now: int) -> None:
        """Every committed replica revealed (one that never committed has nothing to reveal): send the
        waiting reveals now; every replica revealed: decide the unit."""
        live = self.ctx.live_replicas(session, unit)
        if not any(r.state == ReplicaState.COMMITTED.value for r in live):
            self._release_batch(session, unit, "reveal", now)
        if all(r.state == ReplicaState.REVEALED.value for r in live):
            self._decide(session, unit, live, now)

    def _decide(self, session: Session, unit: UnitRow, live: Sequence[ReplicaRow], now: int) -> None:
        """Unanimous → finalize (unless the chain drew it: see {on_drawn}); otherwise a verification job.

        The spot-check draw is the chain's, fixed by the block of the last commit before any reveal: the
        market neither draws nor could race a finalize past it."""
        revealed = [r for r in live if r.state == ReplicaState.REVEALED.value]
        missed = self._missed_canary(session, unit, [r.result_digest or "" for r in revealed])
        if len(revealed) == len(live) and len({r.result_digest for r in revealed}) == 1 and missed is None:
            unit.state = advance(UnitState(unit.state), UnitState.FINALIZING, what=f"unit {unit.id}")
            self.store.enqueue(session, row_id(unit), "finalize", {"unit_id": unit.chain_unit_id}, now)
        else:
            unit.state = advance(UnitState(unit.state), UnitState.VERIFYING, what=f"unit {unit.id}")
            # a missed canary is audited even when unanimous, and in full: the market knows the answer is
            # wrong (on its hardware class), so the verifiers re-execute every segment (verifier/agent.py)
            reason = "digests_differ"
            if revealed != list(live):
                reason = "missing"
            elif missed is not None:
                # a planted cheat is shown to its verifiers as the spot check it looks like on chain
                reason = "spot_check" if missed.planted else CANARY_REASON
            unit.spot_checked = missed is not None
            self._open_verification(session, unit, reason, now)
        unit.updated_at = now
        session.add(unit)

    def _missed_canary(self, session: Session, unit: UnitRow, revealed: Sequence[str]) -> CanaryRow | None:
        """The canary ``unit`` replays when a reveal is not its known answer (verifiers must decide it)."""
        canary = canary_of(self.store, session, self.store.get_order(session, unit.order_id))
        if canary is None or not any(differs_from_known(canary.known_result_digest, d) for d in revealed):
            return None
        return canary

    def on_drawn(self, session: Session, unit: UnitRow, now: int) -> None:
        """The chain drew this unanimous unit for a spot check (its finalize reverted with
        UnitUnderVerification): verifiers decide it instead."""
        if unit.state != UnitState.FINALIZING.value:
            return
        unit.state = advance(UnitState(unit.state), UnitState.VERIFYING, what=f"unit {unit.id}")
        unit.spot_checked = True
        self._open_verification(session, unit, "spot_check", now)
        unit.updated_at = now
        session.add(unit)

    def on_unassignable(self, session: Session, unit: UnitRow, now: int) -> None:
        """The unit's assign can never land on chain: drop its signed replicas (not their providers' fault:
        no reputation is touched, and they are free again) and fail the unit, so that its order runs it
        again as a new attempt under a new unit key (asking for fresh Accept signatures)."""
        if unit.state != UnitState.ASSIGNING.value:
            return
        for replica in self.ctx.live_replicas(session, unit):
            replica.state = advance(ReplicaState(replica.state), ReplicaState.DROPPED, what="replica")
            session.add(replica)
            self._free_provider(replica.provider)
        unit.state = advance(UnitState(unit.state), UnitState.FAILED, what=f"unit {unit.id}")
        unit.updated_at = now
        session.add(unit)

    def _open_verification(self, session: Session, unit: UnitRow, reason: str, now: int) -> None:
        randomness = self._randomness()
        unit.randomness = randomness
        session.add(
            VerificationJobRow(unit_id=row_id(unit), reason=reason, randomness=randomness, created_at=now)
        )

    def _randomness(self) -> str:
        """A block hash after the commit phase: nobody could know it when committing."""
        if self.chain is None:
            raise MarketError("the market has no chain configured")
        return self.chain.block_hash(self.chain.block_number())

    def on_assigned(self, unit: UnitRow, now: int) -> None:
        unit.state = advance(UnitState(unit.state), UnitState.COMMITTING, what=f"unit {unit.id}")
        unit.commit_deadline = now + self.config.commit_window_s
        unit.updated_at = now

    def settle_unit(
        self, session: Session, unit: UnitRow, outcomes: Sequence[ReplicaOutcome], now: int
    ) -> None:
        """Apply a settlement the chain recorded (finalize, verdict), whatever the market had seen before."""
        if unit.state in (UnitState.ACCEPTED.value, UnitState.FAILED.value):
            return
        live = self.ctx.live_replicas(session, unit)
        target = {
            ReplicaOutcome.ACCEPT: ReplicaState.ACCEPTED,
            ReplicaOutcome.FAULT: ReplicaState.FAULT,
            ReplicaOutcome.FRAUD: ReplicaState.FRAUD,
        }
        for replica, outcome in zip(live, outcomes, strict=True):
            replica.state = settle_to(
                ReplicaState(replica.state), target[outcome], what=f"replica of {replica.provider}"
            )
            session.add(replica)
            self._free_provider(replica.provider)
        accepted = ReplicaOutcome.ACCEPT in outcomes
        unit.state = settle_to(
            UnitState(unit.state),
            UnitState.ACCEPTED if accepted else UnitState.FAILED,
            what=f"unit {unit.id}",
        )
        unit.updated_at = now

    def fail_unit(self, session: Session, unit: UnitRow, now: int) -> None:
        if unit.state in (UnitState.ACCEPTED.value, UnitState.FAILED.value):
            return
        for replica in self.ctx.live_replicas(session, unit):
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
        unit.state = settle_to(UnitState(unit.state), UnitState.FAILED, what=f"unit {unit.id}")
        unit.updated_at = now

    def _free_provider(self, provider: str) -> None:
        """The replica no longer keeps its provider busy (the store's load is derived from replicas)."""
        self.matching.pool.release(provider)

    def sweep_deadlines(self, session: Session, now: int, result: SweepResult) -> None:
        """Drop unsigned proposals past their accept deadline, close phases, queue expiry of on-chain units
        past their verdict window."""
        for unit in self.store.units_in(session, [UnitState.PROPOSED.value]):
            if unit.accept_deadline and now > unit.accept_deadline:
                for replica in self.store.replicas_of(session, row_id(unit)):
                    if replica.state == ReplicaState.PROPOSED.value:
                        self.drop_replica(session, unit, replica, now)
                        result.dropped_replicas += 1
        self._close_phases(session, now)
        # FINALIZING too: a unit the market saw unanimous whose commits or reveals never landed on chain
        # (its worker down for the whole window) is refused every finalize and would stay open for good
        on_chain_open = [UnitState.COMMITTING, UnitState.REVEALING, UnitState.FINALIZING, UnitState.VERIFYING]
        for unit in self.store.units_in(session, [state.value for state in on_chain_open]):
            settle_by = unit.commit_deadline + self.config.reveal_window_s + self.config.verdict_window_s
            if unit.commit_deadline and now > settle_by and unit.chain_unit_id is not None:
                self.store.enqueue(session, row_id(unit), "expire", {"unit_id": unit.chain_unit_id}, now)
                result.expiring_units += 1

    def _close_phases(self, session: Session, now: int) -> None:
        """Deadlines the chain enforces: after the commit deadline the committed replicas reveal; after
        the reveal deadline whatever was revealed is decided (missing replicas become faults)."""
        for unit in self.store.units_in(session, [UnitState.COMMITTING.value]):
            if unit.commit_deadline and now > unit.commit_deadline:
                live = self.ctx.live_replicas(session, unit)
                if any(r.state == ReplicaState.COMMITTED.value for r in live):
                    unit.state = advance(UnitState(unit.state), UnitState.REVEALING, what=f"unit {unit.id}")
                    unit.updated_at = now
                    session.add(unit)
        for unit in self.store.units_in(session, [UnitState.REVEALING.value]):
            if unit.commit_deadline and now > unit.commit_deadline + self.config.reveal_window_s:
                live = self.ctx.live_replicas(session, unit)
                if any(r.state == ReplicaState.REVEALED.value for r in live):
                    self._decide(session, unit, live, now)

    def drop_replica(self, session: Session, unit: UnitRow, replica: ReplicaRow, now: int) -> None:
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
