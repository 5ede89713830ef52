"""The roster outbox: the round path's intents (`open`, `step:<r>`, `close`, queued by market/rosters.py)
sent to the chain one claim at a time, as the unit outbox (market/outbox.py) sends a unit's.

Each send first reads the roster on chain (a free call): an action the chain already shows done (by this
market before a crash, or by anyone: steps and the close are permissionless) is confirmed, never sent
again. A revert is never a success: the roster is read again and the action is confirmed only if the chain
shows it done. Past the chain's pending audit records (market/rosters.py `_past_pending`): `post:<n>` posts
a quorum over them in a step of its own, `aside:<round>` takes the records the market holds no quorum over
off the pending chain (`setAsidePending`). A close waits, unsent, while records are pending or the last
posting's challenge window is open; a step refused for `RoundUnitNeedsVerdict` (a unit the market did
not predict set aside) goes again with verifiers; an open refused for an expired or untrusted Accept fails
its roster; any other refusal or an RPC error is retried after a backoff.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from market.context import Lifecycle, MarketContext, row_id
from market.domain.rosters import CLOSE_ACTION, OPEN_ACTION, action_landed
from market.outbox import OUTBOX_LEASE_S, OutboxResult, backoff_s
from market.ports import (
    RevealForm,
    RosterChainState,
    RosterPort,
    SignedAccept,
    SignedAudit,
    SignedRoundWork,
)
from market.rosters import ASIDE_PREFIX, POST_PREFIX, RosterBook, roster_of, roster_port
from market.round_audits import pending_records, posting_closes_at
from market.seed_blocks import SeedBlocks
from market.store import RosterRow
from veritrain.chain.client import Roster
from veritrain.chain.eip712 import round_unit_id
from veritrain.errors import MarketError

# An open refused for these can never land as it is (an Accept past its deadline or with a spent nonce, a
# provider whose streak or free stake no longer holds): the roster is redrawn without the providers the
# revert names (or whose Accept expired), or, when it names none, the order falls back to the per-unit path.
OPEN_FINAL_ERRORS = frozenset(
    {
        "SignatureExpired",
        "ProviderNotTrusted",
        "InvalidSigner",
        "RosterExists",
        "AcceptNonceUsed",
        "InsufficientFreeStake",
    }
)
# the argument of each such revert that names the party at fault (a provider, or a verifier of the roster)
CULPRIT_ARGUMENT = {
    "ProviderNotTrusted": "provider",
    "InvalidSigner": "expected",
    "AcceptNonceUsed": "provider",
    "InsufficientFreeStake": "account",
}
NEEDS_VERIFIERS = "RoundUnitNeedsVerdict"
NOT_CLOSABLE_YET = "RosterNotClosable"


class RosterOutbox(Lifecycle):
    def __init__(self, ctx: MarketContext, rosters: RosterBook) -> None:
        super().__init__(ctx)
        self.rosters = rosters

    def run(self) -> int:
        """One pass of the round path (the worker's tick): draw the rosters waiting for providers, queue
        each roster's next action, send what is due; how many sends landed. Nothing on a chain that does not
        serve the round path (a test double)."""
        if not isinstance(self.chain, RosterPort):
            return 0
        self.rosters.draw_pending()
        self.rosters.plan()
        return sum(1 for action_id in self.pending() if self.send(action_id).sent)

    def pending(self, limit: int = 100) -> list[int]:
        """Roster actions to send now (those backing off wait for their time)."""
        with self.store.transaction() as session:
            return [row_id(row) for row in self.store.roster_actions_due(session, self.clock(), limit)]

    def send(self, action_id: int) -> OutboxResult:
        """Send one roster action at most once per claim; safe to run twice or concurrently."""
        port = roster_port(self.chain)
        now = self.clock()
        with self.store.transaction() as session:
            entry = self.store.get_roster_action(session, action_id, for_update=True)
            if entry.state in ("sent", "confirmed", "reverted"):
                return OutboxResult(action_id, entry.state, False, "already done")
            if entry.state == "sending" and now - entry.updated_at < OUTBOX_LEASE_S:
                return OutboxResult(action_id, entry.state, False, "claimed by another run")
            if entry.state != "sending" and entry.next_attempt_at > now:
                return OutboxResult(action_id, entry.state, False, f"waiting until {entry.next_attempt_at}")
            entry.state, entry.attempts, entry.updated_at = "sending", entry.attempts + 1, now
            session.add(entry)
            row = self.store.get_roster(session, entry.roster_id)
            action, payload = entry.action, json.loads(entry.payload_json)
        roster = roster_of(row)
        try:
            before = port.roster_state(row.chain_order_id)
        except Exception as exc:  # RPC down: retry later
            return self._record(action_id, "failed", f"roster read failed: {type(exc).__name__}: {exc}")
        done = self._done(action, row, before)
        if done is not None:
            return self._record(
                action_id, done, "the chain shows it done" if done == "confirmed" else "", before
            )
        if action == CLOSE_ACTION and before.open_set_aside:
            return self._record(
                action_id, "retrying", f"{before.open_set_aside} set-aside unit(s) still open"
            )
        if action == CLOSE_ACTION and before.audits_pending:  # a post or a way out goes first (RosterBook)
            return self._record(action_id, "retrying", "round audit records still pending")
        if action == CLOSE_ACTION and row.verifiers_json not in (None, "", "[]"):
            # the chain refuses the close until the last posting's challenge window has passed: wait for it
            # rather than send a close that reverts
            assert self.chain is not None
            records = port.audit_records(row.chain_order_id)
            closes_at = posting_closes_at(records, self.chain.terms().verdict_window_s)
            if now <= closes_at:
                return self._record(
                    action_id,
                    "retrying",
                    "an audit posting's challenge window is open",
                    retry_at=closes_at + 1,
                )
        from veritrain.chain.errors import ContractReverted

        try:
            tx_hash = self._send(action, row, roster, payload, before, action_id)
        except ContractReverted as exc:
            return self._after_revert(action_id, action, row, exc)
        except Exception as exc:  # RPC down, timeout: retry after a backoff
            return self._record(action_id, "failed", f"{type(exc).__name__}: {exc}")
        try:
            after: RosterChainState | None = port.roster_state(row.chain_order_id)
        except Exception:  # the sync's events bring the same facts
            after = None
        return self._record(action_id, "sent", "", after, tx_hash)

    def _done(self, action: str, row: RosterRow, chain: RosterChainState) -> str | None:
        """ "confirmed" when the chain shows `action` done, "reverted" when it shows it can no longer be (an
        other roster opened for the order), else None."""
        if action == OPEN_ACTION:
            if not chain.exists:
                return None
            # the chain records the parties' key; the Accept's (row.roster_key) covers the verifiers too
            parties = "0x" + replace(roster_of(row), verifiers=()).key.hex()
            return "confirmed" if chain.key.lower() == parties else "reverted"
        if action == CLOSE_ACTION:
            return "confirmed" if chain.closed else None
        if action.startswith((POST_PREFIX, ASIDE_PREFIX)) and (chain.closed or not chain.audits_pending):
            return "confirmed"
        if action.startswith(POST_PREFIX):
            return None
        if action.startswith(ASIDE_PREFIX):
            records = roster_port(self.chain).audit_records(row.chain_order_id)
            pending = {round_index for round_index, _ in pending_records(records)}
            return None if int(action.removeprefix(ASIDE_PREFIX)) in pending else "confirmed"
        if chain.exists and action_landed(action, row.rounds, chain.committed, chain.pending_block != 0):
            return "confirmed"
        if chain.closed:  # closed with the round pending (RosterBook._closable_at_deadline): it cannot land
            return "reverted"
        return None

    def _send(
        self,
        action: str,
        row: RosterRow,
        roster: Roster,
        payload: dict[str, Any],
        chain: RosterChainState,
        action_id: int,
    ) -> str:
        port = roster_port(self.chain)
        if action == OPEN_ACTION:
            accepts = [
                SignedAccept(a["provider"], a["nonce"], a["deadline"], a["signature"])
                for a in payload["accepts"]
            ]
            return port.open_roster(row.chain_order_id, roster, accepts)
        if action == CLOSE_ACTION:
            return port.close_roster(row.chain_order_id, roster)
        if action.startswith(ASIDE_PREFIX):
            return self._take_pending(row, roster, int(action.removeprefix(ASIDE_PREFIX)), action_id)
        if action.startswith(POST_PREFIX):  # a step that only posts: a quorum over every pending record
            quorum = self.rosters.audits.posting(row, port.pending_audits(row.chain_order_id))
            return port.step_round(row.chain_order_id, roster, [], 0, None, [], 0, quorum)
        # someone else may have revealed the round already (steps are permissionless): then only commit
        reveal = payload.get("reveal")
        revealing = reveal is not None and chain.pending_block != 0 and chain.committed - 1 == int(reveal)
        # a withheld slot's entry carries its commitment (the chain reads a published opening itself)
        openings = [
            RevealForm(o["provider"], o["withheld"], "0x" + "00" * 32)
            if "withheld" in o
            else RevealForm(o["provider"], o["result_digest"], o["salt"])
            for o in (payload.get("openings", []) if revealing else [])
        ]
        withheld = sum(
            1 << i for i, o in enumerate(payload.get("openings", [])) if "withheld" in o and revealing
        )
        work = (
            SignedRoundWork(tuple(payload["commitments"]), tuple(payload["signatures"]))
            if payload.get("commitments")
            else None
        )
        verifiers: list[str] = []
        audits: list[SignedAudit] = []
        if revealing:
            # the revealed round's audited units stay pending (their audit is signed over the chain's pending
            # audit chain); the last step, or one that sets units aside, posts what is pending after it
            pending = port.pending_audits(row.chain_order_id)
            audited, after = self.rosters.audits.signed_units(row, int(payload["reveal"]), pending)
            verifiers = self._verifiers(row, roster, payload, chain, action_id, audited)
            if int(after, 16) != 0 and (payload.get("commit") is None or verifiers):
                audits = self.rosters.audits.posting(row, after)
        return port.step_round(
            row.chain_order_id, roster, openings, int(payload["deadline"]), work, verifiers, withheld, audits
        )

    def _verifiers(
        self,
        row: RosterRow,
        roster: Roster,
        payload: dict[str, Any],
        chain: RosterChainState,
        action_id: int,
        audited: int = 0,
    ) -> list[str]:
        """The verifiers the revealing step carries: none when no unit will be set aside (predicted from the
        chain's own inputs: the commit block's hash, its rate, the providers' streaks; the `audited` units
        stay pending), else the draw's; a step the chain refused for a unit needing a verdict carries them
        anyway. Recorded in the action, so that the set-aside units' verifiers are known when their events
        arrive."""
        round_index = int(payload["reveal"])
        block_hash = self.rosters.seed_hash(chain.pending_block)
        # a withheld slot counts as opened only with an opening published on chain (the sync saw it)
        values: list[str | None] = [o["result_digest"] for o in payload["openings"]]
        reasons = self.rosters.predict(roster, row.chain_order_id, round_index, chain, block_hash, values)
        reasons = {unit: reason for unit, reason in reasons.items() if not audited >> unit & 1}
        if not reasons and not payload.get("force_verifiers"):
            return []
        seed_key = f"0x{round_unit_id(row.chain_order_id, round_index, 0):064x}"
        verifiers = self.rosters.choose_verifiers(roster, (chain.pending_block, block_hash), seed_key)
        self._remember(
            action_id,
            verifiers=verifiers,
            reasons={str(unit): reason.value for unit, reason in reasons.items()},
        )
        return verifiers

    def _take_pending(self, row: RosterRow, roster: Roster, round_index: int, action_id: int) -> str:
        """`setAsidePending` of round `round_index`'s pending record and every record after it (the signed
        chain before it stays pending, for a posting): with verifiers, drawn as for a step's set-aside
        units, so that their units settle by verdict (a forgery slashed, honest replicas paid); without, only
        when none can take them and the order's deadline + verdictWindow has passed (anyone may then drop
        them unpaid; the roster can close and the budget and collateral come back)."""
        assert self.chain is not None
        port = roster_port(self.chain)
        rounds = [r for r, _ in pending_records(port.audit_records(row.chain_order_id))]
        taken = rounds[rounds.index(round_index) :]
        seed_key = f"0x{round_unit_id(row.chain_order_id, round_index, 0):064x}"
        try:
            # seeded by the roster's own seed block (the order's posting), not by when this runs
            seed = SeedBlocks(self.chain).at(row.selection_block)
            verifiers = self.rosters.choose_verifiers(roster, seed, seed_key)
        except MarketError:
            with self.store.transaction() as session:
                deadline = self.store.get_order(session, row.order_id).deadline
            if self.clock() <= deadline + self.chain.terms().verdict_window_s:
                raise  # retried: a verifier may come back before the drop is allowed
            verifiers = []
        self._remember(action_id, verifiers=verifiers, rounds=taken)
        return port.set_aside_pending(row.chain_order_id, roster, len(taken), verifiers)

    def _remember(self, action_id: int, **fields: Any) -> None:
        """Store `fields` in the action's payload (what its events need to know: the verifiers it sent)."""
        with self.store.transaction() as session:
            entry = self.store.get_roster_action(session, action_id, for_update=True)
            stored = json.loads(entry.payload_json)
            stored.update(fields)
            entry.payload_json = json.dumps(stored, sort_keys=True)
            session.add(entry)

    def _after_revert(self, action_id: int, action: str, row: RosterRow, exc: Exception) -> OutboxResult:
        """Re-read the roster: confirmed only if the chain shows the action done, else retried (with
        verifiers for a step that needs them), or reverted for an open that can never land."""
        error = f"{type(exc).__name__}: {exc}"
        name = getattr(exc, "name", "")
        try:
            chain = roster_port(self.chain).roster_state(row.chain_order_id)
        except Exception as read_error:
            return self._record(action_id, "failed", f"{error}; re-read failed: {read_error}")
        done = self._done(action, row, chain)
        if done is not None:
            return self._record(action_id, done, error, chain)
        if action == OPEN_ACTION and name in OPEN_FINAL_ERRORS:
            self._after_failed_open(row, exc, error)
            return self._record(action_id, "reverted", error, chain)
        if name == NEEDS_VERIFIERS:
            self._remember(action_id, force_verifiers=True)
        retry_at = None
        if name == NOT_CLOSABLE_YET:  # an audit posting's challenge window (or the deadline): try again then
            retry_at = int(getattr(exc, "arguments", {}).get("closableAfter", 0)) + 1
        return self._record(action_id, "retrying", error, chain, retry_at=retry_at)

    def _after_failed_open(self, row: RosterRow, exc: Exception, error: str) -> None:
        """Redraw the roster without the parties that made its open fail for good (the revert's named
        provider or verifier, or the providers whose Accept expired), or fall back to the per-unit path when
        none is named."""
        now = self.clock()
        name = getattr(exc, "name", "")
        arguments: dict[str, Any] = getattr(exc, "arguments", {})
        with self.store.transaction() as session:
            roster_row = self.store.get_roster(session, row_id(row), for_update=True)
            drawn = roster_of(roster_row)
            parties = {p.lower(): p for p in (*drawn.providers, *drawn.verifiers)}
            if name == "SignatureExpired":
                culprits = {
                    a.provider
                    for a in self.store.roster_accepts(session, row_id(roster_row))
                    if a.deadline <= now
                }
            else:
                named = str(arguments.get(CULPRIT_ARGUMENT.get(name, ""), "")).lower()
                culprits = {parties[named]} if named in parties else set()
            if culprits:
                self.rosters.redraw(session, roster_row, culprits, f"open failed: {error}", now)
            else:
                self.rosters.fall_back(session, roster_row, f"open failed: {error}", now)

    def _record(
        self,
        action_id: int,
        outcome: str,
        error: str,
        chain: RosterChainState | None = None,
        tx_hash: str | None = None,
        *,
        retry_at: int | None = None,
    ) -> OutboxResult:
        """Record a send's outcome (failed and retrying back off) and adopt the chain's roster, if read."""
        now = self.clock()
        with self.store.transaction() as session:
            entry = self.store.get_roster_action(session, action_id, for_update=True)
            if outcome in ("failed", "retrying") and entry.state != "sending":
                return OutboxResult(action_id, entry.state, False, error)  # the sync confirmed it meanwhile
            entry.updated_at = now
            entry.last_error = error or None
            if outcome in ("failed", "retrying"):
                entry.state = "pending" if outcome == "failed" else "retrying"
                entry.next_attempt_at = now + backoff_s(entry.attempts)
                if retry_at is not None:  # the chain said when: not sooner, nor later
                    entry.next_attempt_at = max(retry_at, now + 1)
            else:
                entry.state = "confirmed" if entry.state == "confirmed" else outcome
                entry.tx_hash = tx_hash or entry.tx_hash
            session.add(entry)
            if chain is not None:
                row = self.store.get_roster(session, entry.roster_id, for_update=True)
                self.rosters.reconcile(session, row, chain, now)
            result = OutboxResult(action_id, entry.state, outcome == "sent", error)
        if outcome in ("sent", "confirmed"):
            self.triggers.settle()
        return result
