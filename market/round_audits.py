"""Round audits (PLAN 5b/5d, "Deferred round audits"): a roster's verifiers re-execute each round's drawn
unanimous units off chain, and one posting of their signatures over the roster's pending audit chain pays
every audited round at close.

- open: once a pending round's openings are all in and its commit block's hash fixed the draw, the round's
  audited units (drawn, unanimous, no provider below the roster's streak: the contract's rule,
  `predict_set_aside`'s DRAWN) get an audit row: the chain's pending audit chain before the round and
  through it (`records`, what a verifier signs: `RoundAudit(chainOrderId, records)`).
- jobs: each roster verifier pulls it as a `RoundAuditJob` (a per-unit verification job per audited unit,
  the round's openings, the pending chain), re-executes the units and recomputes `records` from the chain's
  state (veritrain/chain/round_audit.py) before it signs; or refuses.
- decision: a majority of the roster's verifiers signed `records` -> signed: the units are accepted (the
  next round may start from them) and the step revealing the round leaves them pending; a refusal, or no
  quorum by the deadline -> refused: the round is held and its drawn units set aside for a verdict, as on
  a roster without verifiers.
- posting: a step that must post (the last, or one that carries verifiers) takes the quorum signed over the
  pending chain it leaves (:meth:`RoundAudits.posting`); every signature is checked before it is stored.
- the chain's pending records (:meth:`RoundAudits.first_unheld`): anyone may reveal a round without
  verifiers and so pend its drawn units, the market's quorum or not. A pending record the market holds no
  quorum for waits while its audit collects (the verifiers still sign it: the same record), else it and
  every record after it are taken off the pending chain (`setAsidePending`, market/roster_outbox.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlmodel import Session

from market.context import Lifecycle, MarketContext, require_signer, row_id
from market.domain.rosters import SetAsideReason
from market.domain.states import UnitState
from market.ports import SignedAudit
from market.store import OrderRow, RosterRow, RoundAuditRow, RoundAuditVoteRow, UnitRow
from veritrain.chain.client import AuditRecord
from veritrain.chain.eip712 import audit_chains, market_domain, round_unit_id
from veritrain.chain.round_audit import records_through, unit_digests
from veritrain.errors import IllegalTransition, InvalidInput, MarketError, NotFound
from veritrain.messages import (
    AgentRole,
    Heartbeat,
    RoundAuditJob,
    RoundAuditJobsReply,
    RoundAuditRefusal,
    RoundAuditSubmission,
    RoundOpening,
    Signed,
    VerificationJobView,
    verify_signed,
)

COLLECTING, SIGNED, REFUSED = "collecting", "signed", "refused"
ROUND_AUDIT_REASON = "round_audit"  # a verification job view's reason inside a RoundAuditJob
ZERO32 = "0x" + "00" * 32
UnitWorkOf = Callable[[Session, OrderRow, UnitRow], dict[str, Any]]


def majority(verifier_count: int) -> int:
    """Signatures a posting needs: a majority of the roster's verifiers (JobMarket `_postAudits`)."""
    return verifier_count // 2 + 1


def pending_records(records: Sequence[AuditRecord]) -> list[tuple[int, str]]:
    """The roster's pending round records (those after its last posting), each as (its round, the pending
    chain through it: what a posting covering it signs)."""
    start = max((i + 1 for i, r in enumerate(records) if r.posting), default=0)
    return [
        (records[i].round, "0x" + audit_chains([r.as_tuple() for r in records[: i + 1]])[1].hex())
        for i in range(start, len(records))
    ]


def posting_closes_at(records: Sequence[AuditRecord], verdict_window_s: int) -> int:
    """When the last posting's challenge window ends (the close reverts until after it; 0: no posting)."""
    times = [(r.info >> 72) & ((1 << 40) - 1) for r in records if r.posting]
    return times[-1] + verdict_window_s if times else 0


def verifiers_of(row: RosterRow) -> list[str]:
    return list(json.loads(row.verifiers_json or "[]"))


def _bytes(hex_text: str) -> bytes:
    return bytes.fromhex(hex_text.removeprefix("0x"))


class RoundAudits(Lifecycle):
    def __init__(self, ctx: MarketContext) -> None:
        super().__init__(ctx)

    # --- planning (RosterBook.decide) ---

    def usable_units(
        self,
        session: Session,
        row: RosterRow,
        round_index: int,
        reasons: Mapping[int, SetAsideReason],
        values: Sequence[str | None],
        opened: bool,
        seed_block: int,
    ) -> frozenset[int]:
        """The units of the pending round `round_index` its audit lets the next round use now: its drawn
        units once a quorum signed their audit. Opens the audit (the roster has verifiers, some unit is
        drawn, every slot `opened` to the market) and refuses one past its deadline, or whose units are no
        longer the draw's (the seed's hash became unreadable: every unit drawn)."""
        drawn = sorted(unit for unit, reason in reasons.items() if reason == SetAsideReason.DRAWN)
        if not verifiers_of(row) or not drawn or not opened:
            return frozenset()
        units = sum(1 << unit for unit in drawn)
        now = self.clock()
        audit = self.store.round_audit(session, row_id(row), round_index, for_update=True)
        if audit is None:
            from market.rosters import roster_port

            pending = roster_port(self.chain).pending_audits(row.chain_order_id)
            digests = unit_digests([_bytes(v) for v in values if v is not None], row.replicas)
            records = records_through(_bytes(pending), round_index, units, digests)
            session.add(
                RoundAuditRow(
                    roster_id=row_id(row),
                    round_index=round_index,
                    units=units,
                    pending=pending.lower(),
                    records="0x" + records.hex(),
                    seed_block=seed_block,
                    deadline=now + self.config.round_audit_timeout_s,
                    created_at=now,
                    updated_at=now,
                )
            )
            session.flush()
            self.triggers.settle()
            return frozenset()
        if audit.state == COLLECTING and (now > audit.deadline or audit.units != units):
            self._set_state(session, audit, REFUSED, now)
        if audit.state != SIGNED or audit.units != units:
            return frozenset()
        return frozenset(drawn)

    def collecting(self, session: Session, row: RosterRow, round_index: int) -> bool:
        """Whether the round's audit is still collecting signatures (its step waits)."""
        audit = self.store.round_audit(session, row_id(row), round_index)
        return audit is not None and audit.state == COLLECTING

    def signed_units(self, row: RosterRow, round_index: int, pending: str) -> tuple[int, str]:
        """The units of round `round_index` a signed audit covers and the pending audit chain once the step
        revealing the round added their record: (0, `pending`) unless the audit was signed over the chain's
        pending audit chain `pending` (its signatures would not hold for the step otherwise)."""
        with self.store.transaction() as session:
            audit = self.store.round_audit(session, row_id(row), round_index)
            if audit is None or audit.state != SIGNED or audit.pending != pending.lower():
                return 0, pending.lower()
            return audit.units, audit.records

    def first_unheld(
        self, session: Session, row: RosterRow, records: Sequence[AuditRecord]
    ) -> tuple[int, str] | None:
        """The first of the chain's pending round records the market holds no quorum over (so no posting of
        its can pay it, nor any record after it), as (its round, the answer it waits for): "collecting" while
        the round's audit may still be signed over exactly that record, else "refused" (refused, past its
        deadline, signed over another chain, or never opened: someone else revealed the round). None when
        the market holds a quorum over every pending record."""
        now = self.clock()
        for round_index, through in pending_records(records):
            audit = self.store.round_audit(session, row_id(row), round_index, for_update=True)
            if audit is not None and audit.state == SIGNED and audit.records == through:
                continue
            if audit is None or audit.state != COLLECTING:
                return round_index, REFUSED
            if now > audit.deadline or audit.records != through:  # no quorum can come for this record
                self._set_state(session, audit, REFUSED, now)
                return round_index, REFUSED
            return round_index, COLLECTING
        return None

    def posting(self, row: RosterRow, records: str) -> list[SignedAudit]:
        """A quorum of the roster's verifiers' signatures over the pending chain `records` (MarketError when
        the market holds none: it pends a round only with one in hand)."""
        verifiers = verifiers_of(row)
        with self.store.transaction() as session:
            for audit in self.store.round_audits(session, row_id(row)):
                if audit.state != SIGNED or audit.records != records.lower():
                    continue
                signed = {
                    vote.verifier: vote.signature
                    for vote in self.store.round_audit_votes(session, row_id(audit))
                    if vote.signature is not None
                }
                quorum = [
                    SignedAudit(index, signed[address])
                    for index, address in enumerate(verifiers)
                    if address in signed
                ][: majority(len(verifiers))]
                if len(quorum) == majority(len(verifiers)):
                    return quorum
        raise MarketError(f"no quorum of roster verifiers signed the pending audit chain {records}")

    # --- the verifiers' side (API) ---

    def jobs(self, signed: Signed[Heartbeat], unit_work: UnitWorkOf, limit: int = 5) -> RoundAuditJobsReply:
        """A roster verifier's signed pull: the collecting round audits of its rosters it has not answered."""
        message = verify_signed(signed, self.config.chain_id)
        now = self.clock()
        audits: list[RoundAuditJob] = []
        with self.store.transaction() as session:
            self._verifier(session, message.agent)
            self.ctx.accept_agent_message(session, message, now)
            for audit in self.store.round_audits_in(session, [COLLECTING]):
                row = self.store.get_roster(session, audit.roster_id)
                if message.agent not in verifiers_of(row):
                    continue
                if any(
                    v.verifier == message.agent for v in self.store.round_audit_votes(session, row_id(audit))
                ):
                    continue
                audits.append(self._job(session, row, audit, unit_work))
                if len(audits) == limit:
                    break
        return RoundAuditJobsReply(verifier=message.agent, audits=tuple(audits))

    def submit(self, submission: RoundAuditSubmission) -> str:
        """A roster verifier's signature over the audit's records (checked before it is stored); the same
        again is a no-op, another one refused. Returns the audit's state."""
        now = self.clock()
        with self.store.transaction() as session:
            row, audit = self._open_audit(session, submission.order_id, submission.round_index)
            if submission.verifier not in verifiers_of(row):
                raise InvalidInput(
                    f"{submission.verifier} is not a verifier of the roster of order {row.order_id}"
                )
            if submission.records != audit.records:
                raise InvalidInput(
                    f"the audit of round {audit.round_index} signs {audit.records}, not {submission.records}"
                )
            domain = market_domain(self.config.chain_id, self.ctx.job_market())
            message = {"orderId": row.chain_order_id, "records": _bytes(audit.records)}
            require_signer(domain, "RoundAudit", message, submission.signature, submission.verifier)
            if self._voted(session, audit, submission.verifier, submission.signature, ""):
                return audit.state
            signatures = sum(
                1
                for vote in self.store.round_audit_votes(session, row_id(audit))
                if vote.signature is not None
            )
            if audit.state == COLLECTING and signatures >= majority(len(verifiers_of(row))):
                self._set_state(session, audit, SIGNED, now)
            state = audit.state
        self.triggers.settle()
        return state

    def refuse(self, signed: Signed[RoundAuditRefusal]) -> str:
        """A roster verifier's signed refusal: the audit is refused (its units set aside for a verdict)."""
        message = verify_signed(signed, self.config.chain_id)
        now = self.clock()
        with self.store.transaction() as session:
            self._verifier(session, message.agent)
            self.ctx.accept_agent_message(session, message, now)
            row, audit = self._open_audit(session, message.order_id, message.round_index)
            if message.agent not in verifiers_of(row):
                raise InvalidInput(f"{message.agent} is not a verifier of the roster of order {row.order_id}")
            self._voted(session, audit, message.agent, None, message.reason)
            if audit.state == COLLECTING:
                self._set_state(session, audit, REFUSED, now)
            state = audit.state
        self.triggers.settle()
        return state

    def _voted(
        self, session: Session, audit: RoundAuditRow, verifier: str, signature: str | None, reason: str
    ) -> bool:
        """Store `verifier`'s answer; True when it gave this very answer before (a retried request)."""
        for vote in self.store.round_audit_votes(session, row_id(audit)):
            if vote.verifier == verifier:
                if vote.signature == signature and (signature is not None or vote.reason == reason):
                    return True
                raise InvalidInput(f"{verifier} already answered the audit of round {audit.round_index}")
        if audit.state != COLLECTING:
            raise IllegalTransition(f"the audit of round {audit.round_index} is {audit.state}")
        session.add(
            RoundAuditVoteRow(audit_id=row_id(audit), verifier=verifier, signature=signature, reason=reason)
        )
        session.flush()
        return False

    def _open_audit(
        self, session: Session, order_id: int, round_index: int
    ) -> tuple[RosterRow, RoundAuditRow]:
        row = self.store.roster_of_order(session, order_id, for_update=True)
        if row is None:
            raise NotFound(f"order {order_id} has no roster")
        audit = self.store.round_audit(session, row_id(row), round_index, for_update=True)
        if audit is None:
            raise NotFound(f"round {round_index} of order {order_id} has no audit")
        return row, audit

    def _verifier(self, session: Session, address: str) -> None:
        agent = self.store.get_agent(session, address)
        if agent.role != AgentRole.VERIFIER.value:
            raise InvalidInput(f"{address} is registered as {agent.role}, not as a verifier")

    def _set_state(self, session: Session, audit: RoundAuditRow, state: str, now: int) -> None:
        audit.state, audit.updated_at = state, now
        session.add(audit)

    def _job(
        self, session: Session, row: RosterRow, audit: RoundAuditRow, unit_work: UnitWorkOf
    ) -> RoundAuditJob:
        """The audit as a verifier sees it: one verification job view per audited unit (its ROSTERED
        training unit), the round's openings and the pending chain."""
        from market.rosters import roster_of

        roster = roster_of(row)
        order = self.store.get_order(session, row.order_id)
        works = self.store.roster_works(session, row_id(row), audit.round_index)
        randomness = self.ctx.chain.block_hash(audit.seed_block) if self.ctx.chain else ZERO32
        round_row = self.store.round_of(session, row.order_id, audit.round_index)
        units = (
            {u.shard: u for u in self.store.units_of_round(session, row_id(round_row))} if round_row else {}
        )
        views = []
        for shard in range(row.units_per_round):
            if not audit.units >> shard & 1:
                continue
            unit = units.get(shard)
            if unit is None or unit.state != UnitState.ROSTERED.value:
                raise MarketError(f"round {audit.round_index}'s unit {shard} is not waiting for its audit")
            views.append(
                VerificationJobView(
                    **unit_work(session, order, unit),
                    job_id=row_id(audit),
                    chain_unit_id=round_unit_id(row.chain_order_id, audit.round_index, shard),
                    replicas=self.ctx.replica_results(session, unit),
                    randomness=randomness,
                    reason=ROUND_AUDIT_REASON,
                )
            )
        return RoundAuditJob(
            order_id=row.order_id,
            chain_order_id=row.chain_order_id,
            round_index=audit.round_index,
            providers=roster.providers,
            slots=roster.slots,
            replicas=roster.replicas,
            rounds=roster.rounds,
            verifiers=roster.verifiers,
            openings=tuple(
                RoundOpening(result_digest=w.result_digest or ZERO32, salt=w.salt or ZERO32) for w in works
            ),
            pending=audit.pending,
            units=audit.units,
            records=audit.records,
            deadline=audit.deadline,
            jobs=tuple(views),
        )
