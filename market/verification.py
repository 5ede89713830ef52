"""Verification jobs: a verifier pulls the open jobs of the units it is assigned to and signs verdicts;
once a majority of the unit's assigned verifiers signed identical outcomes (the contract's quorum), the
verdict relay goes to the settlement outbox. Reasons never have to match: each verifier measures its own
floats, and the chain sees outcomes only. Once a unit's verdict is in, any registered verifier may ask for its
evidence: a referee seated on the unit's appeal panel (VerdictAppeals) re-executes it from that."""

from __future__ import annotations

import json

from sqlmodel import Session

from market.context import Lifecycle, MarketContext, require_signer, row_id
from market.orders import OrderBook
from market.store import AgentRow, UnitRow, VerdictSignatureRow, VerificationJobRow
from veritrain.errors import IllegalTransition, InvalidInput, NotFound
from veritrain.messages import (
    AgentRole,
    EvidenceRequest,
    Heartbeat,
    Signed,
    VerdictSubmission,
    VerificationJobsReply,
    VerificationJobView,
    verify_signed,
)


def majority(verifier_count: int) -> int:
    """Signatures a verdict needs on chain: a majority of the unit's assigned verifiers."""
    return verifier_count // 2 + 1


class VerificationJobs(Lifecycle):
    def __init__(self, ctx: MarketContext, orders: OrderBook) -> None:
        super().__init__(ctx)
        self.orders = orders

    def pull_jobs(self, signed: Signed[Heartbeat], limit: int = 5) -> VerificationJobsReply:
        """A verifier's signed pull: open jobs of units it is assigned to and has not signed yet."""
        message = verify_signed(signed, self.config.chain_id)
        now = self.clock()
        with self.store.transaction() as session:
            agent = self._verifier_message(session, message, now)
            agent.online = True
            session.add(agent)
            views = []
            for job in self.store.open_jobs(session, limit=200):
                unit = self.store.get_unit(session, job.unit_id)
                if agent.address not in json.loads(unit.verifiers_json):
                    continue
                if any(v.verifier == agent.address for v in self.store.verdicts_of(session, row_id(job))):
                    continue
                views.append(self._job_view(session, job, unit))
                if len(views) == limit:
                    break
            custody = self.orders.custody.custody_for(session, agent.address)
        return VerificationJobsReply(verifier=message.agent, jobs=tuple(views), custody=custody)

    def evidence(self, signed: Signed[EvidenceRequest]) -> VerificationJobView:
        """A decided unit's job as its verifiers saw it, reason "appeal", for a referee to re-execute.

        Why any registered verifier and not only the panel: the market does not follow panels, and nothing
        here is secret once the verdict is in (the digests are on chain; the blobs are served by their
        holders to staked parties only). An open job is refused: its verifiers have not decided yet."""
        message = verify_signed(signed, self.config.chain_id)
        now = self.clock()
        with self.store.transaction() as session:
            self._verifier_message(session, message, now)
            unit = self.store.unit_by_chain_id(session, message.chain_unit_id)
            job = self.store.job_for_unit(session, row_id(unit)) if unit is not None else None
            if unit is None or job is None:
                raise NotFound(f"chain unit {message.chain_unit_id} has no verification job in this market")
            if job.state == "open":
                raise IllegalTransition(f"chain unit {message.chain_unit_id} has no verdict yet")
            view = self._job_view(session, job, unit)
        return view.model_copy(update={"reason": "appeal"})

    def _verifier_message(self, session: Session, message: Heartbeat | EvidenceRequest, now: int) -> AgentRow:
        """The registered verifier that signed `message`, once the message passed the replay check."""
        agent = self.store.get_agent(session, message.agent)
        if agent.role != AgentRole.VERIFIER.value:
            raise InvalidInput(f"{message.agent} is registered as {agent.role}, not as a verifier")
        self.ctx.accept_agent_message(session, message, now)
        return agent

    def _job_view(self, session: Session, job: VerificationJobRow, unit: UnitRow) -> VerificationJobView:
        order = self.store.get_order(session, unit.order_id)
        return VerificationJobView(
            **self.orders.unit_work(session, order, unit),
            job_id=row_id(job),
            chain_unit_id=unit.chain_unit_id,
            replicas=self.ctx.replica_results(session, unit),
            randomness=job.randomness,
            reason=job.reason,
        )

    def submit_verdict(self, submission: VerdictSubmission) -> VerificationJobRow:
        """Store one verifier's signed verdict; once a majority of the unit's verifiers signed identical
        outcomes, queue the verdict relay."""
        job = self._record_verdict(submission)
        if job.state == "quorum":
            self.triggers.settle()
        return job

    def _record_verdict(self, submission: VerdictSubmission) -> VerificationJobRow:
        from veritrain.chain.eip712 import market_domain, outcomes_hash

        now = self.clock()
        domain = market_domain(self.config.chain_id, self.ctx.job_market())
        with self.store.transaction() as session:
            job = self.store.get_job(session, submission.job_id)
            unit = self.store.get_unit(session, job.unit_id, for_update=True)
            if job.state != "open":
                raise IllegalTransition(
                    f"verification job {job.id} is {job.state}; it takes no more verdicts"
                )
            if submission.verifier not in json.loads(unit.verifiers_json):
                raise InvalidInput(f"{submission.verifier} is not an assigned verifier of unit {unit.id}")
            live = self.ctx.live_replicas(session, unit)
            if len(submission.outcomes) != len(live):
                raise InvalidInput(
                    f"unit {unit.id} has {len(live)} replicas; got {len(submission.outcomes)} outcomes"
                )
            if any(v.verifier == submission.verifier for v in self.store.verdicts_of(session, row_id(job))):
                raise InvalidInput(f"{submission.verifier} already signed a verdict for job {job.id}")
            message = {
                "unitId": unit.chain_unit_id,
                "outcomesHash": outcomes_hash([int(o) for o in submission.outcomes]),
                "deadline": submission.deadline,
            }
            require_signer(domain, "Verdict", message, submission.signature, submission.verifier)
            session.add(
                VerdictSignatureRow(
                    job_id=row_id(job),
                    verifier=submission.verifier,
                    outcomes_json=json.dumps([int(o) for o in submission.outcomes]),
                    reasons_hash=submission.reasons_hash,
                    deadline=submission.deadline,
                    signature=submission.signature,
                )
            )
            session.flush()
            agreeing = [
                v
                for v in self.store.verdicts_of(session, row_id(job))
                if json.loads(v.outcomes_json) == [int(o) for o in submission.outcomes]
            ]
            if len(agreeing) >= majority(len(json.loads(unit.verifiers_json))):
                job.state = "quorum"
                payload = {
                    "unit_id": unit.chain_unit_id,
                    "outcomes": [int(o) for o in submission.outcomes],
                    "verdicts": [
                        {
                            "verifier": v.verifier,
                            "deadline": v.deadline,
                            "signature": v.signature,
                        }
                        for v in agreeing
                    ],
                }
                self.store.enqueue(session, row_id(unit), "verdict", payload, now)
            session.add(job)
            return job
