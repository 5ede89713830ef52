"""A party's side of VerdictAppeals: appeal a verdict that contradicts what this party vouches for.

Why: a verdict nobody appeals becomes the unit's truth once its appeal window has passed. Then a
verifier's own signature over other outcomes slashes it (`verifierSlash`), so an honest minority that a
colluding majority outvoted must appeal to keep its stake; and a replica the verdict called fraud is
slashed and unpaid (JobMarket holds it until then), so an honest provider framed by its verifiers (all of
them, with no honest minority to appeal) must appeal for itself. The watcher remembers every unit the
party vouches for (in a JSON file, across restarts) and on each tick moves each one step: appeal a
contradicting verdict while the window is open, draw the panel, end the appeal (`resolve` once the panel
decided, `lapse` when it missed its deadline, which returns the bond). The appellant's bond is lost when
the panel confirms the verdict, so only a party sure of its claim should make one: a provider vouches
only for a result it computed honestly. Voting as a referee: verifier.refereeing.

A provider's unit may also be left unsettled: until its verdict deadline only the operator finalizes a
unanimous unit nobody drew (JobMarket), and an operator that never does would keep the provider's pay. From
the verdict deadline the watcher finalizes such a unit itself (the chain refuses to expire it).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

from eth_account.signers.local import LocalAccount

from veritrain.chain.client import AppealState, ChainClient, Outcome, UnitInfo, UnitState
from veritrain.chain.eip712 import outcomes_hash
from veritrain.chain.errors import ChainError, ContractReverted

logger = logging.getLogger(__name__)

# Reverts after which the watcher tries the same step again RETRY_AFTER_S of chain time later (a block
# later, more referees in the pool), not on every tick: each try is a transaction.
RETRY_LATER = frozenset({"DrawTooEarly", "PanelUndrawable"})
RETRY_AFTER_S = 60


# A unit's claim: the outcomes a verifier signed, OWN_REPLICA (a provider's: its replica is no fraud), or
# PLANTED (a planted cheat's: its replica is no accept).
Claim = list[int] | str | None
OWN_REPLICA: Claim = None
PLANTED: Claim = "planted"


class VerdictWatch:
    """Units this party vouches for, until each is settled without contradicting its claim or its appeal
    has ended."""

    def __init__(self, chain: ChainClient, account: LocalAccount, path: Path) -> None:
        self.chain = chain
        self.account = account
        self.path = path
        saved = json.loads(path.read_text()) if path.exists() else {}
        self.units: dict[int, Claim] = {
            int(k): v if v is None or isinstance(v, str) else [int(o) for o in v] for k, v in saved.items()
        }
        self._retry_at: dict[int, int] = {}  # chain time before which a unit's refused step waits

    def signed(self, unit_id: int, outcomes: Sequence[int]) -> None:
        """Remember the outcomes this verifier signed for `unit_id`."""
        self.units[unit_id] = [int(o) for o in outcomes]
        self._save()

    def revealed(self, unit_id: int) -> None:
        """Remember that this provider revealed a result of `unit_id` it computed honestly: a verdict
        calling its replica fraud is appealed."""
        self.units[unit_id] = OWN_REPLICA
        self._save()

    def planted(self, unit_id: int) -> None:
        """Remember that this party revealed a result of `unit_id` it forged on purpose (the operator's
        verifier canary): a verdict that accepts its replica is appealed."""
        self.units[unit_id] = PLANTED
        self._save()

    def tick(self) -> list[int]:
        """One step for every remembered unit; returns the units appealed in this tick."""
        appealed: list[int] = []
        now = self.chain.pending_time() if self.units else 0
        for unit_id in sorted(self.units):
            if self._retry_at.get(unit_id, 0) > now:
                continue
            try:
                done = self._step(unit_id, now, appealed)
            except ContractReverted as err:
                if err.name in RETRY_LATER:
                    self._retry_at[unit_id] = now + RETRY_AFTER_S
                else:
                    logger.warning("unit %d: appeal step refused: %s", unit_id, err)
                done = False
            except ChainError as err:  # node down, a transaction not mined: the same step next tick
                logger.warning("unit %d: appeal step failed: %s", unit_id, err)
                done = False
            if done:
                del self.units[unit_id]
                self._retry_at.pop(unit_id, None)
        self._save()
        return appealed

    def _step(self, unit_id: int, now: int, appealed: list[int]) -> bool:
        """Move one unit's appeal on by one action (`now`: the tick's pending-block time); True when nothing
        is left to do for it."""
        chain = self.chain
        unit = chain.get_unit(unit_id)
        if unit.state in (UnitState.COMMITTING, UnitState.REVEALING):
            if self.units[unit_id] is OWN_REPLICA and self._left_unfinalized(unit, now):
                chain.finalize(unit_id, sender=self.account)
                logger.info("unit %d: finalized it ourselves, nobody did by its verdict deadline", unit_id)
                return True
            return False
        if unit.state != UnitState.VERDICTED:
            return True  # finalized or expired: no verdict contradicts us
        if not self._contradicted(unit_id, unit.replicas):
            return True
        appeal = chain.get_appeal(unit_id)
        if appeal.state == AppealState.NONE:
            closes = unit.verdict_deadline + chain.deployment.appeal_params.appeal_window
            if now > closes:
                logger.warning("unit %d: the verdict contradicts our claim, appeal window closed", unit_id)
                return True
            chain.appeal(unit_id, self.account)
            appealed.append(unit_id)
            logger.info("unit %d: appealed a verdict that contradicts our claim", unit_id)
            return False
        if appeal.appellant != self.account.address or appeal.state != AppealState.PENDING:
            return True  # another's appeal decides it, or ours has ended
        if appeal.decided == bytes(32):
            if now > appeal.vote_deadline:
                chain.lapse_appeal(unit_id, sender=self.account)
                return True
            if not appeal.panel:
                chain.draw_panel(unit_id, sender=self.account)
            return False
        verdict = chain.unit_events("VerdictRecorded", unit_id)[0].args["outcomes"]
        decided = chain.unit_events("AppealDecided", unit_id)[0].args["outcomes"]
        chain.resolve_appeal(unit_id, verdict, decided, sender=self.account)
        return True

    def _left_unfinalized(self, unit: UnitInfo, now: int) -> bool:
        """Whether `unit` is unanimous, not drawn and past its verdict deadline: anyone may finalize it."""
        full = (1 << unit.replicas) - 1
        if unit.drawn or unit.revealed_mask != full or now <= unit.verdict_deadline:
            return False
        digests = {self.chain.replica(unit.unit_id, i).commitment_or_digest for i in range(unit.replicas)}
        return len(digests) == 1

    def _contradicted(self, unit_id: int, replicas: int) -> bool:
        """Whether the verdict that settled `unit_id` contradicts our claim on it."""
        claim = self.units[unit_id]
        if isinstance(claim, list):
            return self.chain.verdict_hash(unit_id) != outcomes_hash(claim)
        verdict = self.chain.unit_events("VerdictRecorded", unit_id)[0].args["outcomes"]
        ours = [i for i in range(replicas) if self.chain.replica(unit_id, i).provider == self.account.address]
        refuted = Outcome.ACCEPT if claim == PLANTED else Outcome.FRAUD
        return any(verdict[i] == refuted for i in ours)

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({str(k): v for k, v in sorted(self.units.items())}))
        tmp.replace(self.path)
