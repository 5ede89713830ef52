"""The settlement outbox: intents written in the same transaction as the state change that needs them,
sent to the chain one claim at a time (idempotent), and applied to the market once they landed."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlmodel import Session

from market.assignments import Assignments
from market.canary import VERIFY
from market.context import Lifecycle, MarketContext, row_id
from market.domain.states import UnitState
from market.ports import RevealForm, SignedAccept, SignedCommit, SignedVerdict
from market.registry import AgentRegistry
from market.store import OutboxRow, UnitRow
from veritrain.backoff import backoff_delay
from veritrain.errors import MarketError
from veritrain.messages import ReplicaOutcome

# A failed send is retried after 1, 2, 4 … s, at most every 5 min, never given up: each unit still ends,
# by settlement or by its expiry, and a short RPC outage must not strand one in ASSIGNING or FINALIZING.
OUTBOX_BACKOFF_BASE_S = 1
OUTBOX_BACKOFF_MAX_S = 300
# A relay that waits for a unit's truth (TRUTH_RELAYS) asks again at least this often: each try is a free
# read (no transaction), and a slash or a held settlement should land soon after the appeal window closes.
TRUTH_WAIT_MAX_S = 15
OUTBOX_LEASE_S = 60
# Unit states on chain (SettlementPort.unit_state) after which nothing more can be sent for the unit.
CHAIN_SETTLED_STATES = frozenset({"finalized", "verdicted", "expired"})
SETTLES_AS = {"finalize": "finalized", "verdict": "verdicted", "expire": "expired"}
# Outbox actions that end a unit: its round may close (or a retry open) right away.
SETTLING_ACTIONS = frozenset({"finalize", "verdict", "expire"})
# `settle_held`: a verdict's fraud replicas are held on chain (collateral locked, no slash) until the unit's
# truth is fixed, so an appeal can still clear them; this relays VerdictAppeals.settleVerdict, which then
# slashes them and pays the verdict's signers the bounty. Confirmed by `HeldSettled`, whoever sent it.
SETTLE_HELD = "settle_held"
# Outbox actions that lock (assign) or release and slash (the settling ones, the held fraud) providers' stake.
STAKE_CHANGING_ACTIONS = SETTLING_ACTIONS | {"assign", SETTLE_HELD}
# `slash_verifier:<address>`: relay a verifier's own signature that contradicts the unit's truth (the
# verdict, or the appeal panel's decision: VerdictAppeals).
SLASH_VERIFIER = "slash_verifier"
# Relays that need the unit's truth fixed (VerdictAppeals). Refused for TRUTH_WAIT_ERRORS they wait (backing
# off): the unit's appeal window is open or its appeal undecided. Any other refusal once the unit is verdicted
# is final.
TRUTH_RELAYS = frozenset({SLASH_VERIFIER, SETTLE_HELD})
TRUTH_WAIT_ERRORS = frozenset({"TruthNotFixed"})
# A slash relay refused with these: someone slashed the verifier already (done); with any other the evidence
# does not hold (outcomes match the truth, wrong signer): reverted.
SLASH_DONE_ERRORS = frozenset({"VerifierAlreadySlashed"})
# Replicas' intents relayed together, one batch per unit (`commit:<provider>`, `reveal:<provider>`).
BATCHED_KINDS = frozenset({"commit", "reveal"})
# A batch refused for one of these was refused for its unit (window, state), not for one entry: every entry
# shares that fate. Any other refusal names one entry (a bad signature, a replica someone already relayed):
# the entries are then relayed one by one, so that a bad one blocks none of the others.
UNIT_LEVEL_ERRORS = frozenset(
    {
        "InvalidUnitState",
        "UnitAlreadySettled",
        "CommitWindowClosed",
        "RevealWindowNotOpen",
        "RevealTooEarly",
        "RevealWindowClosed",
    }
)
# An assign refused for these can never land (the providers' Accept signatures are past their deadline, or
# a provider of a reduced adaptive unit lost its streak since the market last read its reputation):
# retrying it would strand the unit in ASSIGNING for good, so the unit fails and its order retries it.
ASSIGN_FINAL_ERRORS = frozenset({"SignatureExpired", "ProviderNotTrusted"})


@dataclass
class OutboxResult:
    entry_id: int
    state: str
    sent: bool
    detail: str = ""


def _named_by(
    exc: Exception, batch: list[tuple[int, str, dict[str, Any]]]
) -> tuple[int, str, dict[str, Any]] | None:
    """The entry a batch's revert names (AlreadyCommitted, RevealMismatch, InvalidSigner ... carry the
    provider), if any."""
    arguments = getattr(exc, "arguments", {})
    named = {str(arguments.get(key, "")).lower() for key in ("provider", "account", "expected")}
    return next((entry for entry in batch if entry[2]["provider"].lower() in named), None)


def _joins_batch(entry: OutboxRow, now: int) -> bool:
    """A sibling goes along in its unit's batch if it waits (for the others, held) or is due again."""
    return entry.state == "pending" or (entry.state == "retrying" and entry.next_attempt_at <= now)


def backoff_s(attempts: int, cap: int = OUTBOX_BACKOFF_MAX_S) -> int:
    """Seconds to wait after the ``attempts``-th failed send: doubling from the base, capped."""
    return int(backoff_delay(attempts, base=OUTBOX_BACKOFF_BASE_S, cap=cap))


class SettlementOutbox(Lifecycle):
    def __init__(self, ctx: MarketContext, assignments: Assignments, agents: AgentRegistry) -> None:
        super().__init__(ctx)
        self.assignments = assignments
        self.agents = agents

    def pending_outbox(self, limit: int = 100) -> list[int]:
        """Entries to send now (those backing off after a failure wait for their time)."""
        now = self.clock()
        with self.store.transaction() as session:
            due = self.store.outbox_in(session, ["pending", "sending", "retrying"], limit, due_by=now)
            return [row_id(row) for row in due]

    def send_outbox_entry(self, entry_id: int) -> OutboxResult:
        """Send one settlement intent at most once per claim; safe to run twice or concurrently.

        Claim (pending → sending, row-locked), send, then record. A second run sees ``sending`` with a
        live lease, or ``sent``/``confirmed``, and does nothing. A revert saying the unit is already
        settled means someone did it: the intent is confirmed, not retried. A replica's commit or reveal
        takes the unit's other waiting commits or reveals along: one claim, one batch transaction.
        """
        if self.chain is None:
            raise MarketError("the market has no chain configured")
        now = self.clock()
        with self.store.transaction() as session:
            entry = self.store.get_outbox(session, entry_id)
            kind = entry.action.split(":", 1)[0]
            if kind in BATCHED_KINDS:  # lock the unit's whole batch in id order: runs never deadlock
                group = self.store.outbox_of_kind(session, entry.unit_id, kind, for_update=True)
                entry = next(e for e in group if row_id(e) == entry_id)
            else:
                group = [self.store.get_outbox(session, entry_id, for_update=True)]
                entry = group[0]
            if entry.state in ("sent", "confirmed", "reverted"):
                return OutboxResult(entry_id, entry.state, False, "already done")
            if entry.state == "sending" and now - entry.updated_at < OUTBOX_LEASE_S:
                return OutboxResult(entry_id, entry.state, False, "claimed by another run")
            if entry.state != "sending" and entry.next_attempt_at > now:  # a batch it was in failed
                return OutboxResult(entry_id, entry.state, False, f"waiting until {entry.next_attempt_at}")
            if not self._prerequisites_sent(session, entry):
                return OutboxResult(entry_id, entry.state, False, "waiting for earlier actions of the unit")
            claimed = [entry] + [e for e in group if e is not entry and _joins_batch(e, now)]
            for row in claimed:
                row.state = "sending"
                row.attempts += 1
                row.updated_at = now
                session.add(row)
            batch = [(row_id(row), row.action, json.loads(row.payload_json)) for row in claimed]
            unit_id = entry.unit_id
        if kind in BATCHED_KINDS:
            return self._relay_batch(unit_id, kind, batch)[entry_id]
        return self._relay(*batch[0])

    def _relay(self, entry_id: int, action: str, payload: dict[str, Any]) -> OutboxResult:
        """Send one claimed intent and record what the chain did with it."""
        from veritrain.chain.errors import ContractReverted

        try:
            tx_or_unit = self._send(action, payload)
        except ContractReverted as exc:
            return self._after_revert(entry_id, action, payload, exc)
        except Exception as exc:  # RPC down, timeout: retry after a backoff
            return self._record_send(entry_id, "failed", None, f"{type(exc).__name__}: {exc}")
        return self._record_send(entry_id, "sent", tx_or_unit, "")

    def _relay_batch(
        self, unit_id: int, kind: str, batch: list[tuple[int, str, dict[str, Any]]]
    ) -> dict[int, OutboxResult]:
        """Send claimed commits (or reveals) of one unit in one transaction; each entry's result.

        A refusal of the unit applies to each entry as if sent alone; a refusal naming one entry applies to
        that entry and the others go again as a batch; any other refusal splits the batch into single
        sends (so a bad entry blocks none of the others). A reveal batch that finalized the unit settles
        its finalize intent too (recorded first, so nobody sends that finalize, which would only revert)."""
        from veritrain.chain.errors import ContractReverted

        try:
            tx_hash, finalized = self._send_batch(kind, [payload for _, _, payload in batch])
        except ContractReverted as exc:
            if len(batch) == 1 or exc.name in UNIT_LEVEL_ERRORS:
                return {entry_id: self._after_revert(entry_id, a, p, exc) for entry_id, a, p in batch}
            culprit = _named_by(exc, batch)
            if culprit is None:  # say, an expired signature: whose is not in the error
                return {
                    entry_id: result
                    for single in batch
                    for entry_id, result in self._relay_batch(unit_id, kind, [single]).items()
                }
            rest = [entry for entry in batch if entry is not culprit]
            return {culprit[0]: self._after_revert(*culprit, exc), **self._relay_batch(unit_id, kind, rest)}
        except Exception as exc:  # RPC down, timeout: retry after a backoff
            error = f"{type(exc).__name__}: {exc}"
            return {entry_id: self._record_send(entry_id, "failed", None, error) for entry_id, _, _ in batch}
        if finalized:
            self._record_finalized_by_reveals(unit_id, tx_hash)
        return {entry_id: self._record_send(entry_id, "sent", tx_hash, "") for entry_id, _, _ in batch}

    def _send_batch(self, kind: str, payloads: list[dict[str, Any]]) -> tuple[str, bool]:
        """One commitBatch or revealBatch of one unit's replicas: (transaction hash, finalized)."""
        chain = self.chain
        assert chain is not None
        unit_id = int(payloads[0]["unit_id"])
        if kind == "commit":
            commits = [
                SignedCommit(p["provider"], p["commitment"], p["deadline"], p["signature"]) for p in payloads
            ]
            return chain.commit_batch(unit_id, commits), False
        reveals = [RevealForm(p["provider"], p["result_digest"], p["salt"]) for p in payloads]
        finalized, tx_hash = chain.reveal_batch(unit_id, reveals)
        return tx_hash, finalized

    def _record_finalized_by_reveals(self, unit_id: int, tx_hash: str) -> None:
        """The reveals finalized the unit: its waiting finalize intent is done by their transaction."""
        with self.store.transaction() as session:
            entry = self.store.outbox_entry(session, unit_id, "finalize")
            if entry is None or entry.state not in ("pending", "retrying"):
                return  # none yet (the chain sync applies the finalize) or someone is on it
            finalize_id = row_id(entry)
        self._record_send(finalize_id, "sent", tx_hash, "")

    def _after_revert(
        self, entry_id: int, action: str, payload: dict[str, Any], exc: Exception
    ) -> OutboxResult:
        """A revert is never a success: re-read the unit on chain and apply what the chain did.

        Why: a revert such as UnitAlreadySettled only says somebody settled the unit, not how (a buyer may
        expire it the moment its verdict deadline passes, paying nobody). A unit still open on chain
        makes the intent a failure to retry."""
        assert self.chain is not None
        error = f"{type(exc).__name__}: {exc}"
        if action == "finalize" and getattr(exc, "name", "") == "UnitUnderVerification":
            return self._record_drawn(entry_id, error)
        if action == "assign" and getattr(exc, "name", "") in ASSIGN_FINAL_ERRORS:
            result = self._record_unassignable(entry_id, error)
            # a provider's streak may have ended since the pool read it: the next attempt must see that
            self.agents.refresh_chain_facts(set(payload["providers"]))
            return result
        try:
            chain_state = self.chain.unit_state(int(payload["unit_id"])) if "unit_id" in payload else "none"
        except Exception as read_error:  # RPC down: retry the whole intent later
            return self._record_send(entry_id, "failed", None, f"{error}; re-read failed: {read_error}")
        if chain_state not in CHAIN_SETTLED_STATES:  # refused while the unit is open: retry, blocking nothing
            return self._record_send(entry_id, "retrying", None, error)
        name, kind = getattr(exc, "name", ""), action.split(":", 1)[0]
        if kind in TRUTH_RELAYS and name in TRUTH_WAIT_ERRORS:
            return self._record_send(entry_id, "retrying", None, error, wait_cap=TRUTH_WAIT_MAX_S)
        if kind in TRUTH_RELAYS:
            # judged against the fixed truth, a refusal now is final and the unit unchanged. A held
            # settlement someone else made never reverts ours (it is a no-op then): the sync's HeldSettled
            # confirms the entry, whatever this records.
            done = name in SLASH_DONE_ERRORS
            return self._record_send(
                entry_id, "confirmed" if done else "reverted", None, f"{error}; unit is {chain_state}"
            )
        # the chain did what this intent does (someone relayed it first): done; else superseded
        done = SETTLES_AS.get(kind) == chain_state
        return self._record_send(
            entry_id,
            "confirmed" if done else "reverted",
            None,
            f"{error}; unit is {chain_state}",
            chain_state,
        )

    def _record_superseded(
        self, entry_id: int, error: str, apply: Callable[[Session, UnitRow, int], None]
    ) -> OutboxResult:
        """The revert says the intent can never land: record it reverted and `apply` what that means for
        its unit, in one transaction; the unit's order may move on."""
        now = self.clock()
        with self.store.transaction() as session:
            entry = self.store.get_outbox(session, entry_id, for_update=True)
            entry.state = "reverted"
            entry.last_error = error
            entry.updated_at = now
            session.add(entry)
            apply(session, self.store.get_unit(session, entry.unit_id, for_update=True), now)
        self.triggers.advance()
        return OutboxResult(entry_id, "reverted", False, error)

    def _record_drawn(self, entry_id: int, error: str) -> OutboxResult:
        """The chain drew the unit for a spot check at its first reveal, so it refused the finalize: the
        intent is superseded and verifiers decide the unit. Why not ask first: that would cost a read per
        unit for what the revert says anyway."""
        error = f"{error}; drawn for a spot check on chain: settles by verdict"
        return self._record_superseded(entry_id, error, self.assignments.on_drawn)

    def _record_unassignable(self, entry_id: int, error: str) -> OutboxResult:
        """The assign can never land (found by the chaos bench: an assign delayed past the Accept deadline
        was retried forever and its order never finished): the unit fails, off chain, and is run again."""
        error = f"{error}; the unit fails off chain and runs again as a new attempt"
        return self._record_superseded(entry_id, error, self.assignments.on_unassignable)

    def _prerequisites_sent(self, session: Session, entry: OutboxRow) -> bool:
        """A unit's actions go out in order: assign, commits, reveals, then finalize/verdict (the replicas'
        commits, or reveals, among themselves in one batch)."""
        if entry.action == "assign":
            return True
        kind = entry.action.split(":", 1)[0]
        earlier = self.store.outbox_before(session, entry.unit_id, row_id(entry), ["pending", "sending"])
        return not any(e.action.split(":", 1)[0] != kind or kind not in BATCHED_KINDS for e in earlier)

    def _send(self, action: str, payload: dict[str, Any]) -> str:
        chain = self.chain
        assert chain is not None
        kind = action.split(":", 1)[0]
        if kind == "assign":
            accepts = [SignedAccept(**a) for a in payload["accepts"]]
            unit_id = chain.assign(
                payload["order_id"], payload["unit_key"], payload["providers"], payload["verifiers"], accepts
            )
            return str(unit_id)
        if kind == "finalize":
            return chain.finalize(payload["unit_id"])
        if kind == VERIFY:
            return chain.request_verification(payload["unit_id"])
        if kind == "verdict":
            verdicts = [SignedVerdict(**v) for v in payload["verdicts"]]
            return chain.submit_verdict(payload["unit_id"], payload["outcomes"], verdicts)
        if kind == "expire":
            return chain.expire_unit(payload["unit_id"])
        if kind == SETTLE_HELD:
            return chain.settle_verdict(payload["unit_id"], payload["outcomes"])
        if kind == SLASH_VERIFIER:
            evidence = SignedVerdict(payload["verifier"], payload["deadline"], payload["signature"])
            return chain.slash_contradicting_verifier(payload["unit_id"], payload["outcomes"], evidence)
        raise MarketError(f"unknown settlement action {action!r}")

    def _record_send(
        self,
        entry_id: int,
        outcome: str,
        result: str | None,
        error: str,
        chain_state: str = "",
        wait_cap: int = OUTBOX_BACKOFF_MAX_S,
    ) -> OutboxResult:
        """Record a send: ``sent`` applies the intent; ``confirmed``/``reverted`` apply ``chain_state``, what
        the chain settled; ``failed`` (no answer) and ``retrying`` (the contract refused it for now) wait
        out a backoff. Only ``pending`` holds back the unit's later intents: one the chain refused must not
        block, say, the expiry that ends the unit."""
        now = self.clock()
        with self.store.transaction() as session:
            entry = self.store.get_outbox(session, entry_id, for_update=True)
            if outcome in ("failed", "retrying") and entry.state != "sending":
                # the chain sync confirmed it while this send was failing (say, a timeout after it landed)
                return OutboxResult(entry_id, entry.state, False, error)
            entry.updated_at = now
            entry.last_error = error or None
            if outcome in ("failed", "retrying"):
                entry.state = "pending" if outcome == "failed" else "retrying"
                entry.next_attempt_at = now + backoff_s(entry.attempts, wait_cap)
            else:
                entry.state = "confirmed" if entry.state == "confirmed" else outcome
                entry.tx_hash = result if result and result.startswith("0x") else entry.tx_hash
                unit = self.store.get_unit(session, entry.unit_id, for_update=True)
                if chain_state:
                    self._apply_chain_settlement(session, unit, chain_state, now)
                else:
                    self._apply_settlement(session, entry, unit, result, now)
                    if self.chain is not None and entry.action in SETTLING_ACTIONS and result:
                        # what follows the unit is drawn from this block (market.orders), as the sync does
                        unit.settled_block = self.chain.tx_block(result)
                session.add(unit)
            session.add(entry)
            recorded = OutboxResult(entry_id, entry.state, outcome == "sent", error)
            kind = entry.action.split(":", 1)[0]
            settled = bool(chain_state) or (outcome == "sent" and kind in SETTLING_ACTIONS)
            landed = settled or (outcome == "sent" and kind in ("assign", SETTLE_HELD))
            # later intents of the unit wait for this one (assign, commits, reveals, then the settlement)
            unblocked = outcome != "failed" and any(
                e.unit_id == entry.unit_id and row_id(e) > entry_id
                for e in self.store.outbox_in(session, ["pending"], limit=1000)
            )
            providers = (
                {r.provider for r in self.store.replicas_of(session, entry.unit_id)} if landed else set()
            )
        # the chain already shows the new stake and reputation: matching must not wait for the event sync
        self.agents.refresh_chain_facts(providers)
        if settled:
            self.triggers.advance()
        if unblocked:
            self.triggers.settle()
        return recorded

    def _apply_settlement(
        self, session: Session, entry: OutboxRow, unit: UnitRow, result: str | None, now: int
    ) -> None:
        """The market-side effect of an intent that is now on chain."""
        kind = entry.action.split(":", 1)[0]
        if kind == "assign" and unit.state == UnitState.ASSIGNING.value:
            if result is not None and result.isdigit():
                unit.chain_unit_id = int(result)
            self.assignments.on_assigned(unit, now)
        elif kind == "finalize":
            self.assignments.settle_unit(
                session, unit, [ReplicaOutcome.ACCEPT] * len(self.ctx.live_replicas(session, unit)), now
            )
        elif kind == "verdict":
            outcomes = [ReplicaOutcome(o) for o in json.loads(entry.payload_json)["outcomes"]]
            self.assignments.settle_unit(session, unit, outcomes, now)
            job = self.store.job_for_unit(session, row_id(unit))
            if job is not None:
                job.state = "relayed"
                session.add(job)
        elif kind == "expire":
            self.assignments.fail_unit(session, unit, now)

    def _apply_chain_settlement(self, session: Session, unit: UnitRow, chain_state: str, now: int) -> None:
        """The unit's settlement as the chain holds it, re-read after a revert. A verdict's outcomes are
        in its event only, so the chain sync applies those."""
        if chain_state == "finalized":
            self.assignments.settle_unit(
                session, unit, [ReplicaOutcome.ACCEPT] * len(self.ctx.live_replicas(session, unit)), now
            )
        elif chain_state == "expired":
            self.assignments.fail_unit(session, unit, now)
