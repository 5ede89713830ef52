"""The referee's side of VerdictAppeals: sit in the pool, vote on every appeal panel the chain seats us on.

Why: an appeal is decided only by a majority of its drawn panel; with nobody voting, every appeal lapses
and a colluding verifier majority keeps what it settled. The contract, not the market, draws panels, so
the referee finds its seats in the chain's `PanelDrawn` events, re-executes the unit from the evidence
the market serves (`judge`, the verifier agent's own checks) and signs the outcomes it found. It then
ends a decided appeal itself (`resolve`) when nobody else has, since a confirmed appeal's bond reaches the
referees only then. Seats, votes and the scanned block survive a restart in a JSON file, so a vote is
never signed for other outcomes than the first.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from eth_account.signers.local import LocalAccount

from veritrain.chain.client import AppealState, ChainClient
from veritrain.chain.errors import ChainError, ContractReverted

logger = logging.getLogger(__name__)

# Reverts after which the next tick sees the appeal moved on (our vote in, or the panel decided) and acts
# on that; any other revert ends the seat with an error (nothing a retry would change).
MOVED_ON = frozenset({"AlreadyVoted", "AlreadyDecided"})

Judge = Callable[[int], Sequence[int] | None]
"""Re-executes a chain unit and returns its per-replica outcomes, or None when it cannot decide yet."""


class RefereeDuty:
    """The appeals this referee is seated on, from the panel's draw until the appeal has ended."""

    def __init__(self, chain: ChainClient, account: LocalAccount, path: Path, judge: Judge) -> None:
        self.chain = chain
        self.account = account
        self.path = path
        self.judge = judge
        saved = json.loads(path.read_text()) if path.exists() else {}
        self.next_block: int = int(saved.get("next_block", chain.deployment.block))
        # seat -> the outcomes we found (None until judged): a resent vote signs the same outcomes
        self.seats: dict[int, list[int] | None] = {int(k): v for k, v in saved.get("seats", {}).items()}

    def join_pool(self) -> bool:
        """Enter the referee pool unless already in it; False when the free stake cannot cover it."""
        if self.chain.in_referee_pool(self.account):
            return True
        needed = self.chain.deployment.appeal_params.referee_stake
        free = self.chain.stake_of(self.account.address).free
        if free < needed:
            logger.error("cannot join the referee pool: %d free stake, %d needed", free, needed)
            return False
        self.chain.join_referee_pool(self.account)
        logger.info("joined the referee pool (%d locked)", needed)
        return True

    def tick(self) -> list[int]:
        """Find new seats, vote where we have not, end decided or lapsed appeals; returns the units voted on
        in this tick."""
        head = self.chain.w3.eth.block_number
        if head >= self.next_block:
            for event in self.chain.events(self.next_block, head):
                if event.name == "PanelDrawn" and self.account.address in event.args["panel"]:
                    self.seats.setdefault(int(event.args["unitId"]), None)
            self.next_block = head + 1
        voted: list[int] = []
        for unit_id in sorted(self.seats):
            try:
                done = self._step(unit_id, voted)
            except ContractReverted as err:
                done = err.name not in MOVED_ON
                logger.log(logging.ERROR if done else logging.INFO, "unit %d: referee step: %s", unit_id, err)
            except ChainError as err:  # node down, a transaction not mined: the same step next tick
                logger.warning("unit %d: referee step failed: %s", unit_id, err)
                done = False
            if done:
                del self.seats[unit_id]
        self._save()
        return voted

    def _step(self, unit_id: int, voted: list[int]) -> bool:
        """Vote on, or end, one seated appeal; True when nothing is left to do for it."""
        chain = self.chain
        appeal = chain.get_appeal(unit_id)
        if appeal.state != AppealState.PENDING:
            return True
        if appeal.decided != bytes(32):
            verdict = chain.unit_events("VerdictRecorded", unit_id)[0].args["outcomes"]
            decided = chain.unit_events("AppealDecided", unit_id)[0].args["outcomes"]
            chain.resolve_appeal(unit_id, verdict, decided, sender=self.account)
            logger.info("unit %d: resolved the decided appeal", unit_id)
            return True
        if chain.pending_time() > appeal.vote_deadline:
            chain.lapse_appeal(unit_id, sender=self.account)
            logger.info("unit %d: the panel did not decide in time; lapsed the appeal", unit_id)
            return True
        if appeal.votes[appeal.panel.index(self.account.address)] != bytes(32):
            return False  # our vote is in: wait for the others
        outcomes = self.seats[unit_id]
        if outcomes is None:
            found = self.judge(unit_id)
            if found is None:
                return False
            outcomes = self.seats[unit_id] = [int(o) for o in found]
            self._save()
        signed = chain.sign_referee_vote(self.account, unit_id, outcomes, appeal.vote_deadline)
        chain.vote(unit_id, outcomes, signed, sender=self.account)
        voted.append(unit_id)
        logger.info("unit %d: voted %s as a seated referee", unit_id, outcomes)
        return False

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        seats = {str(k): v for k, v in sorted(self.seats.items())}
        tmp.write_text(json.dumps({"next_block": self.next_block, "seats": seats}))
        tmp.replace(self.path)
