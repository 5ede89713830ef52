"""Chain sync: apply JobMarket and StakeManager events since the cursor, confirm the outbox intents they
prove landed (whoever sent them), and re-read the chain facts of every account an event touched."""

from __future__ import annotations

import json
from typing import Any

from eth_utils import to_checksum_address
from sqlmodel import Session

from market.assignments import Assignments
from market.context import Lifecycle, MarketContext, row_id
from market.domain.states import ReplicaState, UnitState
from market.outbox import SETTLE_HELD, SLASH_VERIFIER
from market.ports import ChainEvent
from market.registry import AgentRegistry
from market.rosters import ROSTER_EVENTS, RosterBook
from market.store import UnitRow
from veritrain.errors import MarketError
from veritrain.messages import ReplicaOutcome

# Events that change an account's free stake (by the name of the account argument) ...
STAKE_EVENTS = {
    "Staked": "account",
    "UnstakeRequested": "account",
    "StakeWithdrawn": "account",
    "StakeSlashed": "account",
    "ReplicaSlashed": "provider",
}
# ... and unit events that lock or release collateral and write reputation for every replica's provider
# (HeldSettled: the held fraud replicas' collateral released, their stake slashed and fraud counted).
SETTLED_EVENTS = frozenset({"UnitFinalized", "VerdictRecorded", "UnitExpired"})
UNIT_SETTLEMENT_EVENTS = SETTLED_EVENTS | {"UnitAssigned", "HeldSettled"}


class ChainSync(Lifecycle):
    def __init__(
        self,
        ctx: MarketContext,
        assignments: Assignments,
        agents: AgentRegistry,
        rosters: RosterBook | None = None,
    ) -> None:
        super().__init__(ctx)
        self.assignments = assignments
        self.agents = agents
        self.rosters = rosters or RosterBook(ctx)

    def sync_chain_events(self, max_blocks: int = 2000) -> int:
        """Apply JobMarket events since the cursor up to ``confirmations`` blocks below the head; confirms
        outbox entries someone else may have sent."""
        if self.chain is None:
            raise MarketError("the market has no chain configured")
        head = self.chain.block_number() - self.config.confirmations
        now = self.clock()
        with self.store.transaction() as session:
            cursor = self.store.cursor(session)
            if cursor.next_block > head:
                return 0
            to_block = min(head, cursor.next_block + max_blocks - 1)
            events = self.chain.events(cursor.next_block, to_block)
            touched: set[str] = set()
            for chain_event in events:
                if chain_event.name in ROSTER_EVENTS:  # the round path's (market/rosters.py)
                    touched |= self.rosters.apply_event(session, chain_event, now)
                    continue
                touched |= self._accounts_touched(session, chain_event.name, chain_event.args)
                self._apply_event(session, chain_event, now)
            cursor.next_block = to_block + 1
            session.add(cursor)
        self.agents.refresh_chain_facts(touched)
        if any(e.name in SETTLED_EVENTS for e in events):  # a unit settled: its round may close
            self.triggers.advance()
        if any(e.name in ("VerdictRecorded", "AppealDecided") or e.name in ROSTER_EVENTS for e in events):
            self.triggers.settle()  # evidence may be queued, or a roster's next action
        return len(events)

    def _accounts_touched(self, session: Session, name: str, args: dict[str, Any]) -> set[str]:
        """Accounts whose free stake or reputation an event changed (matching must see the new values)."""
        if name in STAKE_EVENTS:
            return {to_checksum_address(args[STAKE_EVENTS[name]])}
        if name not in UNIT_SETTLEMENT_EVENTS:
            return set()
        unit = (
            self.store.unit_by_key(session, _hex32(args["unitKey"]))
            if name == "UnitAssigned"
            else self.store.unit_by_chain_id(session, int(args["unitId"]))
        )
        if unit is None:
            return set()
        return {r.provider for r in self.ctx.live_replicas(session, unit)}

    def _apply_event(self, session: Session, event: ChainEvent, now: int) -> None:
        name, args = event.name, event.args
        if name == "Staked":  # the account's stake grew: draws seeded before this block do not count it
            agent = self.store.find_agent(session, to_checksum_address(args["account"]))
            if agent is not None:
                agent.stake_block = max(agent.stake_block or 0, event.block_number)
                session.add(agent)
            return
        if name == "UnitAssigned":
            unit = self.store.unit_by_key(session, _hex32(args["unitKey"]))
            if unit is None:
                return
            unit.chain_unit_id = int(args["unitId"])
            if unit.state == UnitState.ASSIGNING.value:
                self.assignments.on_assigned(unit, now)
            if "commitDeadline" in args:  # the chain's own deadline beats our estimate
                unit.commit_deadline = int(args["commitDeadline"])
            self._confirm(session, row_id(unit), "assign", now)
            session.add(unit)
            return
        unit_id = args.get("unitId")
        unit = self.store.unit_by_chain_id(session, int(unit_id)) if unit_id is not None else None
        if unit is None:
            return
        if name in SETTLED_EVENTS:  # what follows the unit (a retry, the next round) is drawn from this block
            unit.settled_block = event.block_number
        if name in ("ReplicaCommitted", "ReplicaRevealed"):
            # A worker may crash after the transaction landed but before recording it; its retry then
            # reverts (nonce used / already revealed), so the chain event is what confirms the intent.
            # The party may also have acted straight on chain: the replica catches up with the chain.
            provider = to_checksum_address(args["provider"])
            kind = "commit" if name == "ReplicaCommitted" else "reveal"
            self._confirm(session, row_id(unit), f"{kind}:{provider}", now)
            if self._record_replica_event(session, unit, provider, name, args):
                self.assignments.on_revealed_on_chain(session, unit, _hex32(args["resultDigest"]), now)
            return
        if name == "UnitFinalized":
            self._confirm(session, row_id(unit), "finalize", now)
            self.assignments.settle_unit(
                session, unit, [ReplicaOutcome.ACCEPT] * len(self.ctx.live_replicas(session, unit)), now
            )
        elif name == "VerdictRecorded" and "outcomes" in args:
            self._confirm(session, row_id(unit), "verdict", now)
            outcomes = [int(o) for o in args["outcomes"]]
            self.assignments.settle_unit(session, unit, [ReplicaOutcome(o) for o in outcomes], now)
            self._settle_held_fraud(session, unit, outcomes, now)
            self._report_contradicting_verifiers(session, unit, outcomes, now)
        elif name == "AppealDecided" and "outcomes" in args:
            # the panel fixed the unit's truth: evidence against every collected signature that differs
            self._report_contradicting_verifiers(session, unit, [int(o) for o in args["outcomes"]], now)
            return
        elif name == "HeldSettled":  # by our relay, another's, or an appeal's resolve
            self._confirm(session, row_id(unit), SETTLE_HELD, now)
            return
        elif name == "VerifierSlashed":
            verifier = to_checksum_address(args["verifier"])
            self._confirm(session, row_id(unit), f"{SLASH_VERIFIER}:{verifier}", now)
            job = self.store.job_for_unit(session, row_id(unit))
            for signed in self.store.verdicts_of(session, row_id(job)) if job is not None else ():
                if signed.verifier == verifier:
                    signed.slashed = int(args["amount"])
                    session.add(signed)
            return
        elif name == "UnitExpired":
            self._confirm(session, row_id(unit), "expire", now)
            self.assignments.fail_unit(session, unit, now)
        session.add(unit)

    def _settle_held_fraud(self, session: Session, unit: UnitRow, outcomes: list[int], now: int) -> None:
        """Queue the settlement of a verdict's fraud replicas: the chain holds them (no slash, no bounty)
        until the unit's truth is fixed, then settles them by the verdict when asked (the outbox waits out
        the appeal window). Nothing to hold without a fraud outcome."""
        if unit.chain_unit_id is None or ReplicaOutcome.FRAUD not in outcomes:
            return
        payload = {"unit_id": unit.chain_unit_id, "outcomes": outcomes}
        self.store.enqueue(session, row_id(unit), SETTLE_HELD, payload, now)

    def _report_contradicting_verifiers(
        self, session: Session, unit: UnitRow, outcomes: list[int], now: int
    ) -> None:
        """Queue the evidence against every assigned verifier whose signed outcomes differ from ``outcomes``
        (the verdict the chain settled, or an appeal panel's decision): its own signature slashes it once the
        unit's truth is fixed (the outbox waits out the appeal window; the bounty goes to the market's
        sender). The (unit, action) key makes a repeated event queue nothing new; evidence queued against
        the verdict that a panel then overturned is refused by the chain and ends reverted."""
        job = self.store.job_for_unit(session, row_id(unit))
        if job is None or unit.chain_unit_id is None:
            return
        for signed in self.store.verdicts_of(session, row_id(job)):
            signed_outcomes = json.loads(signed.outcomes_json)
            if signed_outcomes == outcomes:
                continue
            payload = {
                "unit_id": unit.chain_unit_id,
                "outcomes": signed_outcomes,
                "verifier": signed.verifier,
                "deadline": signed.deadline,
                "signature": signed.signature,
            }
            self.store.enqueue(session, row_id(unit), f"{SLASH_VERIFIER}:{signed.verifier}", payload, now)

    def _record_replica_event(
        self, session: Session, unit: UnitRow, provider: str, name: str, args: dict[str, Any]
    ) -> bool:
        """The replica's commitment or revealed digest as the chain holds it (the market may not have it).
        True when this is a reveal the market had not taken itself."""
        unrelayed_reveal = False
        replica = self.store.replica(session, row_id(unit), provider)
        if name == "ReplicaCommitted":
            replica.commitment = _hex32(args["commitment"])
            if replica.state == ReplicaState.SIGNED.value:
                replica.state = ReplicaState.COMMITTED.value
        else:
            digest = _hex32(args["resultDigest"])
            if replica.result_digest != digest:  # parts reported for another digest are not its own
                replica.state_digest = replica.transcript_root = None
                replica.round_state_digest = replica.inputs_commitment = None
            replica.result_digest = digest
            if replica.state == ReplicaState.COMMITTED.value:
                replica.state = ReplicaState.REVEALED.value
                unrelayed_reveal = True
        session.add(replica)
        return unrelayed_reveal

    def _confirm(self, session: Session, unit_id: int, action: str, now: int) -> None:
        entry = self.store.outbox_entry(session, unit_id, action)
        if entry is not None and entry.state != "confirmed":
            entry.state = "confirmed"
            entry.updated_at = now
            session.add(entry)


def _hex32(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        return "0x" + bytes(value).hex()
    return str(value).lower()
