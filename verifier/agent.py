"""Verifier agent (`veritrain verifier run`): stakes, checks disputed or drawn units, signs verdicts.

Why it is built this way: a verifier is paid per checked unit and earns bounties for caught cheats, so
its work must be cheap and its verdicts binding. It pulls jobs from the market (signed heartbeat, no
broker access), fetches each replica's PoL manifest and only the checkpoints it re-executes straight
from the replicas over libp2p (the market never handles blobs), runs the verifier core, and signs the
contract's outcome-only EIP-712 Verdict; the market relays it once a majority of the unit's verifiers
signed the same outcomes. Its collateral is locked per unit and slashed if its signature contradicts the
unit's truth; so it sends transactions of its own only to appeal such a verdict
(veritrain.chain.appeal_watch) and, with `--referee`, to sit in the referee pool and vote on the appeal
panels the chain seats it on (verifier.refereeing), re-executing each unit from the evidence the market
serves.

`--lazy` (demos and tests only) plays the verifier's dilemma the cheap way: it signs accept for every
replica of a job whose replicas all revealed one digest, without fetching or re-executing anything, and
checks only disputes. It is what planted cheats (verifier canaries, `veritrain node run --plant`) exist to
catch: its accept on a planted unanimous forgery contradicts the unit's truth, and that signature slashes it.
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from verifier.fetching import Blame
from verifier.refereeing import RefereeDuty
from veritrain.agentkit import (
    HTTP_TIMEOUT_S,
    AgentCommonConfig,
    AgentPlumbing,
    BlobPlane,
    add_common_agent_arguments,
    aggregate_inputs_of,
    chain_patiently,
    decode_state,
    folded_start_of,
    hex32,
    preload_datasets,
    register_patiently,
    resolve_common,
    run_agent,
    setup_logging,
    stake_by_permit,
    tick_forever,
    unhex32,
    unit_spec_of,
    unit_start_of,
)
from veritrain.api_client import MarketRefused
from veritrain.chain.appeal_watch import VerdictWatch
from veritrain.errors import AgentError, VeritrainError

if TYPE_CHECKING:
    from verifier.core import Submission, ToleranceTable, VerifierPolicy
    from veritrain.messages import RoundAuditJob, VerificationJobView
    from veritrain.pol import State, Transcript, UnitSpec

logger = logging.getLogger("veritrain.verifier")

POLL_INTERVAL_S = 0.5
HTTP_CONFLICT = 409  # the job was decided by other verifiers' signatures already
RETRY_BASE_S = 1.0
RETRY_MAX_S = 30.0
VERDICT_TTL_S = 600
REFEREE_POLL_S = 5.0  # a referee scans the chain for panel seats this often, not on every job pull


@dataclass(frozen=True, kw_only=True)
class VerifierConfig(AgentCommonConfig):
    tolerances: Path | None = None
    referee: bool = False
    lazy: bool = False  # demos and tests only: accept a unanimous job without re-executing it


OUTCOME_CODES = {"accept": 0, "fault": 1, "fraud": 2}  # JobMarket's per-replica outcome numbering
ROUND_AUDIT_REASON = "round_audit"  # a unit's check inside a roster's round audit (market/round_audits.py)


class ReplicaEvidence:
    """A replica's checkpoints, fetched over libp2p on demand (only those the core re-executes)."""

    def __init__(self, blobs: BlobPlane, peer_addr: str, transcript: Transcript) -> None:
        self._blobs = blobs
        self._peer_addr = peer_addr
        self._digests = dict(zip(transcript.checkpoint_steps, transcript.checkpoint_digests, strict=True))

    def checkpoint(self, step: int) -> State:
        digest = self._digests.get(step)
        if digest is None:
            raise AgentError(f"the transcript names no checkpoint at step {step}")
        return decode_state(self._blobs.fetch(self._peer_addr, digest.hex()))


def audit_of(job: VerificationJobView) -> tuple[bool, VerifierPolicy | None]:
    """How to re-execute a job's unit: (audited, segment policy; None is the core's default 1 + 1).

    A unit the chain drew, or an appealed one (a referee's panel seat), is audited even when its replicas
    agree. A canary whose answer is not the known
    one (market/canary.py) is audited on every segment: the market knows that result is wrong on its
    hardware class, so no cheat may hide in a segment an audit did not draw."""
    from verifier.core import VerifierPolicy
    from veritrain.messages import CANARY_REASON

    if job.reason == CANARY_REASON:
        return True, VerifierPolicy(random_segments=job.steps)
    return job.reason in ("spot_check", "appeal", ROUND_AUDIT_REASON), None


def unanimous(job: VerificationJobView) -> bool:
    """Whether every replica of the job revealed, and all the same digest (what a lazy verifier trusts)."""
    digests = {replica.result_digest for replica in job.replicas}
    return len(digests) == 1 and None not in digests


def load_tolerances(recipe: str, path: Path | None = None) -> ToleranceTable:
    """A recipe's calibrated tolerance table: the committed one (verifier.calibrate) or an operator's."""
    from verifier.calibrate import load_tolerances as load_calibrated

    return load_calibrated(recipe, path)


class VerifierAgent(AgentPlumbing):
    """One verifier: register, stake, poll jobs, verify, sign."""

    def __init__(self, config: VerifierConfig) -> None:
        from veritrain.api_client import MarketClient

        super().__init__(config)
        self.config = config
        if config.lazy:
            logger.warning("*** LAZY MODE: this verifier accepts unanimous units without re-executing ***")
        self.market = MarketClient(config.market_url, timeout=HTTP_TIMEOUT_S)
        self.done_dir = config.data_dir / "verdicts"
        self._failures: dict[int, int] = {}
        self._retry_at: dict[int, float] = {}
        self.blame = Blame()
        # the units we signed: a verdict that contradicts our signature is appealed (chain.appeal_watch)
        self.watch = VerdictWatch(self.chain, self.account, config.data_dir / "appeals.json")
        self.referee = (
            RefereeDuty(self.chain, self.account, config.data_dir / "referee.json", self.judge)
            if config.referee
            else None
        )
        self._referee_at = 0.0
        self._stop = threading.Event()

    def start(self) -> None:
        from veritrain.device import measure_device

        self.start_metrics()
        self.device = measure_device("cpu")
        self.p2p_addr = self.blobs.start()
        preload_datasets()
        chain_patiently(self.ensure_stake)  # before registering: the market reads our stake then
        if self.referee is not None:
            chain_patiently(self.referee.join_pool)
        self.register()
        logger.info("verifier %s ready, bonded %d", self.address, self.chain.stake_of(self.address).bonded)

    def ensure_stake(self) -> None:
        """Bond the wanted stake by permit unless it is bonded already (default: every token we hold)."""
        wanted = (
            self.config.stake if self.config.stake is not None else self.chain.token_balance(self.address)
        )
        bonded = self.chain.stake_of(self.address).bonded
        if wanted > bonded:
            stake_by_permit(self.chain, self.account, wanted - bonded)

    def stop(self) -> None:
        self._stop.set()
        self.blobs.stop()
        self.market.close()
        self.metrics.close()

    def register(self) -> None:
        from veritrain.messages import AgentRole

        register_patiently(
            lambda: self.market.register(self.signed_registration(AgentRole.VERIFIER, self.device))
        )

    def run_forever(self) -> None:
        tick_forever(self.tick, self._stop, self.metrics.heartbeats, POLL_INTERVAL_S)

    def tick(self) -> None:
        from veritrain.messages import Heartbeat, sign_message

        message = Heartbeat(agent=self.address, nonce=self.clock.next_nonce(), timestamp=self.clock.now())
        signed = sign_message(message, self.account.key, self.deployment.chain_id)
        reply = self.market.verification_jobs(signed)
        self.keep_custody(self.market, reply.custody)
        now = time.monotonic()
        for job in reply.jobs:
            if (self.done_dir / f"{job.job_id}.json").exists() or self._retry_at.get(job.job_id, 0.0) > now:
                continue
            try:
                self.verify(job)
            except MarketRefused as err:
                if err.status != HTTP_CONFLICT:
                    raise
                logger.info("job %d already decided: %s", job.job_id, err)
                self.mark_done(job.job_id, {"skipped": str(err)})
            except VeritrainError as err:
                failures = self._failures.get(job.job_id, 0) + 1
                self._failures[job.job_id] = failures
                delay = min(RETRY_MAX_S, RETRY_BASE_S * 2 ** (failures - 1))
                self._retry_at[job.job_id] = now + delay
                logger.error("job %d: %s: %s (retry in %.0fs)", job.job_id, type(err).__name__, err, delay)
        self.audit_rounds()
        self.watch.tick()
        if self.referee is not None and now >= self._referee_at:
            self._referee_at = now + REFEREE_POLL_S
            self.referee.tick()

    def audit_rounds(self) -> None:
        """The round audits our rosters owe (market/round_audits.py), each answered once (remembered across
        restarts): signed when every audited unit re-executes as accepted and what we sign is the chain's
        (verifier/round_audit.py), else refused with why; one the market or the chain cannot serve now is
        tried again at a later tick."""
        from veritrain.messages import Heartbeat, sign_message

        message = Heartbeat(agent=self.address, nonce=self.clock.next_nonce(), timestamp=self.clock.now())
        reply = self.market.round_audits(sign_message(message, self.account.key, self.deployment.chain_id))
        for job in reply.audits:
            name = f"audit-{job.chain_order_id}-{job.round_index}"
            if (self.done_dir / f"{name}.json").exists():
                continue
            try:
                self.mark_done(name, self.audit_round(job))
            except (VeritrainError, httpx.HTTPError) as err:
                logger.warning("round audit %s: %s: %s (again next tick)", name, type(err).__name__, err)

    def audit_round(self, job: RoundAuditJob) -> dict[str, Any]:
        """Check, re-execute and answer one round audit; returns what was answered."""
        from verifier.round_audit import RoundAuditRefused, signed_audit
        from veritrain.messages import RoundAuditRefusal, sign_message

        try:
            submission = signed_audit(self.chain, self.account, job, self.decide)
        except RoundAuditRefused as err:
            logger.warning("round %d of order %d refused: %s", job.round_index, job.order_id, err)
            refusal = RoundAuditRefusal(
                agent=self.address,
                nonce=self.clock.next_nonce(),
                timestamp=self.clock.now(),
                order_id=job.order_id,
                round_index=job.round_index,
                reason=str(err)[:512],
            )
            self.market.round_audit_refusal(sign_message(refusal, self.account.key, self.deployment.chain_id))
            return {"refused": str(err)}
        self.market.round_audit(submission)
        logger.info(
            "round %d of order %d audited: units %#x signed", job.round_index, job.order_id, job.units
        )
        return {"signed": submission.records, "units": job.units}

    def judge(self, chain_unit_id: int) -> tuple[int, ...] | None:
        """A seated referee's re-execution of `chain_unit_id`, from the evidence the market serves; None
        (try again later) when the market or a replica's blobs cannot serve it now."""
        from veritrain.messages import EvidenceRequest, sign_message

        message = EvidenceRequest(
            agent=self.address,
            nonce=self.clock.next_nonce(),
            timestamp=self.clock.now(),
            chain_unit_id=chain_unit_id,
        )
        try:
            job = self.market.evidence(sign_message(message, self.account.key, self.deployment.chain_id))
            outcomes, _ = self.decide(job)
        except (VeritrainError, httpx.HTTPError) as err:
            logger.warning("appeal of unit %d: no evidence to judge yet: %s", chain_unit_id, err)
            return None
        return outcomes

    # --- one job -------------------------------------------------------------------------------------

    def submissions(self, job: VerificationJobView, spec: UnitSpec) -> list[Submission]:
        """One core Submission per replica, in assignment order: what a replica itself fails to serve is a
        fault; a fetch that got no answer makes the verifier abstain for now (verifier.fetching)."""
        from verifier.fetching import collect_submissions

        return collect_submissions(
            self.blobs,
            job,
            self.blame,
            lambda addr, transcript: ReplicaEvidence(self.blobs, addr, transcript),
        )

    def verify(self, job: VerificationJobView) -> None:
        """Decide accept/fault/fraud per replica with the verifier core, sign and submit the verdict."""
        outcomes, reasons = self.decide(job)
        self.submit(job, outcomes, reasons)

    def decide(self, job: VerificationJobView) -> tuple[tuple[int, ...], str]:
        """The outcome per replica and the reasons (JSON), from our own checks of the unit's evidence."""
        from veritrain.messages import UnitKind

        if self.config.lazy and unanimous(job):
            logger.warning("*** LAZY: job %d (unit %s) accepted unchecked ***", job.job_id, job.chain_unit_id)
            return tuple(OUTCOME_CODES["accept"] for _ in job.replicas), json.dumps({"path": "lazy"})
        if job.kind == UnitKind.AGGREGATE:
            return self.decide_aggregate(job)
        return self.decide_training(job)

    def decide_training(self, job: VerificationJobView) -> tuple[tuple[int, ...], str]:
        """A training unit: re-execute what the verifier core asks for (all of a drawn or appealed unit's
        segments it samples, the disputed ones otherwise)."""
        from verifier.core import UnitRequest, verify_unit
        from veritrain.datasets import load_dataset
        from veritrain.pol import data_order_commitment, train_steps

        started = time.monotonic()
        tolerances = load_tolerances(job.recipe, self.config.tolerances)
        spec = unit_spec_of(job)
        recipe = spec.recipe_config()
        dataset = load_dataset(recipe.dataset, unhex32(job.dataset_digest))
        audited, policy = audit_of(job)
        folded = folded_start_of(job, self.blobs) if job.folds else None  # the outer step, recomputed
        request = UnitRequest(
            spec=spec,
            start_state=unit_start_of(job, self.blobs) if folded is None else folded.start_state,
            data_order_commitment=data_order_commitment(recipe, dataset, spec),
            randomness=unhex32(job.randomness),
            spot_checked=audited,
            chain_unit_id=job.chain_unit_id,
            fold=None if folded is None else folded.fold,
        )

        def reexecute(state: Mapping[str, Any], start_step: int, end_step: int) -> tuple[State, list[float]]:
            return train_steps(recipe, dataset, dict(state), spec, start_step, end_step)

        decision = verify_unit(request, self.submissions(job, spec), reexecute, tolerances, policy)
        outcomes = tuple(OUTCOME_CODES[replica.verdict.value] for replica in decision.replicas)
        reasons = json.dumps(
            {
                "path": decision.path,
                "replicas": [[r.provider, r.verdict.value, r.reason] for r in decision.replicas],
            },
            sort_keys=True,
            separators=(",", ":"),
        )
        elapsed = time.monotonic() - started
        self.metrics.record_unit("verified", elapsed, decision.reexecuted_steps * recipe.tokens_per_step)
        for replica in decision.replicas:
            self.metrics.verdicts.labels(replica.verdict.value).inc()
        logger.info(
            "job %d (unit %s, %s): %s path, outcomes %s, %d steps re-executed in %.1fs",
            job.job_id,
            job.chain_unit_id,
            job.reason,
            decision.path,
            outcomes,
            decision.reexecuted_steps,
            elapsed,
        )
        for line in decision.log:
            logger.info("job %d: %s", job.job_id, line)
        return outcomes, reasons

    def decide_aggregate(self, job: VerificationJobView) -> tuple[tuple[int, ...], str]:
        """An aggregate unit is checked by recomputing it from the blobs (verifier.core.judge_aggregate),
        which also checks the inputs commitment that the v1 contract does not compute itself."""
        from verifier.core import judge_aggregate

        started = time.monotonic()
        revealed = [
            (r.provider, None if r.result_digest is None else unhex32(r.result_digest)) for r in job.replicas
        ]
        expected, verdicts = judge_aggregate(aggregate_inputs_of(job, self.blobs), revealed)
        reasons = json.dumps(
            {
                "path": "aggregate",
                "expected": hex32(expected),
                "replicas": [[v.provider, v.verdict.value, v.reason] for v in verdicts],
            },
            sort_keys=True,
            separators=(",", ":"),
        )
        outcomes = tuple(OUTCOME_CODES[v.verdict.value] for v in verdicts)
        for verdict in verdicts:
            self.metrics.verdicts.labels(verdict.verdict.value).inc()
        logger.info(
            "job %d (aggregate unit %s, %s): outcomes %s, recomputed in %.1fs",
            job.job_id,
            job.chain_unit_id,
            job.reason,
            outcomes,
            time.monotonic() - started,
        )
        return outcomes, reasons

    def submit(self, job: VerificationJobView, outcomes: tuple[int, ...], reasons: str) -> None:
        """Sign the contract's outcome-only Verdict; the market keeps the reasons' hash as a record and
        relays the signature once a majority of the unit's verifiers agree on the outcomes."""
        from eth_utils import keccak

        from veritrain.messages import ReplicaOutcome, VerdictSubmission

        if job.chain_unit_id is None:
            raise AgentError(f"job {job.job_id} has no on-chain unit yet")
        reasons_hash = "0x" + keccak(text=reasons).hex()
        signed = self.chain.sign_verdict(
            self.account, job.chain_unit_id, outcomes, self.chain.deadline(VERDICT_TTL_S)
        )
        submission = VerdictSubmission(
            job_id=job.job_id,
            verifier=self.address,
            outcomes=tuple(ReplicaOutcome(outcome) for outcome in outcomes),
            reasons_hash=reasons_hash,
            deadline=signed.deadline,
            signature="0x" + signed.signature.hex(),
        )
        self.market.verdict(submission)
        if not (self.config.lazy and unanimous(job)):  # a lazy accept vouches for nothing it checked
            self.watch.signed(job.chain_unit_id, outcomes)
        self.mark_done(job.job_id, {"outcomes": outcomes, "reasons": json.loads(reasons)})

    def mark_done(self, job_id: int | str, record: dict[str, Any]) -> None:
        """Remember a finished job across restarts, so a verdict is never signed twice."""
        self.done_dir.mkdir(parents=True, exist_ok=True)
        (self.done_dir / f"{job_id}.json").write_text(json.dumps(record, sort_keys=True))


def configure(parser: argparse.ArgumentParser) -> None:
    add_common_agent_arguments(parser)
    parser.add_argument(
        "--tolerances",
        type=Path,
        default=None,
        help="tolerance table JSON (default: the committed calibration)",
    )
    parser.add_argument(
        "--referee",
        action="store_true",
        help="also join VerdictAppeals' referee pool (locks its referee stake) and vote on the appeal "
        "panels the chain seats this verifier on, after re-executing the unit",
    )
    parser.add_argument(
        "--lazy",
        action="store_true",
        help="DEMO/TEST ONLY: accept every unit whose replicas agree without re-executing it (a lazy "
        "verifier, which planted cheats catch)",
    )


def run(args: argparse.Namespace) -> int:
    common: dict[str, Any] = resolve_common(args)
    setup_logging(common["name"])
    import torch

    torch.set_num_threads(max(1, common["threads"]))
    config = VerifierConfig(tolerances=args.tolerances, referee=args.referee, lazy=args.lazy, **common)
    return run_agent(lambda: VerifierAgent(config))
