"""A provider's side of the round path (JobMarketRounds): its roster slots' openings and verdicts, from the
chain alone.

Why: the market keeps a slot's opening off chain until the step that reveals its round, so a market that
leaves it out (or loses it) could wait for the round's reveal window to end and give the slot as withheld:
the unit set aside with the slot unopened, the verdict a fault, the provider `withholdPenalty` poorer and
unpaid for work it did. The contract lets the provider publish its opening itself (`publishOpening`)
while the round is pending; a step then takes the slot's result from the chain. So the watcher remembers
every slot its agent opened (a JSON file, across restarts) and, when the round is still pending on chain
in the last `margin_s` of its reveal window, publishes the opening with the round's commitments read from
the calldata of the step that committed it and the roster's pending audit chain from its events
(`ChainClient.audit_records`), checked against the roster's round hash before anything is sent: nothing
the market says is trusted. That costs the provider gas (ETH, apart), as an appeal does, only when its
round is still unrevealed that late.

Once the round is revealed, a slot whose unit the step set aside (`UnitSetAside`) is an ordinary unit on
the per-unit path: its unit id goes to the agent's `VerdictWatch`, which appeals a verdict calling the
provider's honest replica fraud, as for any unit it revealed.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from eth_account.signers.local import LocalAccount

from veritrain.chain import eip712
from veritrain.chain.appeal_watch import VerdictWatch
from veritrain.chain.client import ChainClient, Reveal, RosterInfo
from veritrain.chain.errors import ChainError, ContractReverted
from veritrain.chain.round_audit import round_hash

logger = logging.getLogger(__name__)


@dataclass
class OpenedSlot:
    """One roster slot this provider opened (to the market): enough to publish it on chain."""

    order_id: int  # the chain's order id
    round_index: int
    unit: int
    result_digest: str
    salt: str
    honest: bool = True  # computed honestly: a verdict calling it fraud is appealed
    published: bool = False

    @property
    def key(self) -> str:
        return f"{self.order_id}:{self.round_index}:{self.unit}"


class SlotWatch:
    """The roster slots this provider opened, until each one's round is revealed (its set-aside unit handed
    to `verdicts`) or can no longer be."""

    def __init__(
        self,
        chain: ChainClient,
        account: LocalAccount,
        path: Path,
        verdicts: VerdictWatch,
        *,
        margin_s: int | None = None,
    ) -> None:
        self.chain = chain
        self.account = account
        self.path = path
        self.verdicts = verdicts
        window = chain.params.reveal_window
        # publish in the window's last quarter: late enough that a market stepping promptly makes it moot,
        # early enough to land before the first block in which a step may give the slot as withheld
        self.margin_s = window // 4 if margin_s is None else margin_s
        saved = json.loads(path.read_text()) if path.exists() else []
        self.slots: dict[str, OpenedSlot] = {s.key: s for s in (OpenedSlot(**item) for item in saved)}

    def opened(
        self, order_id: int, round_index: int, unit: int, result_digest: str, salt: str, *, honest: bool
    ) -> None:
        """Remember a slot's opening (before it goes to the market: a market that refuses it is what this
        guards against). The same slot again keeps what was remembered."""
        slot = OpenedSlot(order_id, round_index, unit, result_digest, salt, honest)
        self.slots.setdefault(slot.key, slot)
        self._save()

    def tick(self) -> list[str]:
        """One look at every remembered slot; returns the keys of the slots published in this tick."""
        published: list[str] = []
        now = self.chain.pending_time() if self.slots else 0
        for key in sorted(self.slots):
            slot = self.slots[key]
            try:
                done = self._step(slot, now, published)
            except ContractReverted as err:  # e.g. a step revealed the round meanwhile: seen next tick
                logger.warning("slot %s: publishing its opening was refused: %s", key, err)
                done = False
            except ChainError as err:  # node down, a transaction not mined: the same step next tick
                logger.warning("slot %s: %s", key, err)
                done = False
            if done:
                del self.slots[key]
        self._save()
        return published

    def _step(self, slot: OpenedSlot, now: int, published: list[str]) -> bool:
        """Move one slot on (`now`: the pending block's time); True when nothing is left to do for it."""
        info = self.chain.get_roster(slot.order_id)
        if info.committed <= slot.round_index and not info.closed:
            # its round is not committed on chain yet; after the order's deadline it never will be
            return now > self.chain.get_order(slot.order_id).deadline
        if info.pending_block != 0 and info.committed - 1 == slot.round_index and not info.closed:
            publish_from = info.pending_since + self.chain.params.reveal_window - self.margin_s
            if not slot.published and now >= publish_from:
                self._publish(slot, info)
                slot.published = True
                published.append(slot.key)
            return False
        if slot.honest:  # revealed (or closed with it pending): a set-aside unit of ours settles per unit
            unit_id = self.chain.set_aside_unit(slot.order_id, slot.round_index, slot.unit)
            if unit_id is not None:
                self.verdicts.revealed(unit_id)
                logger.info("slot %s was set aside as unit %d: watching its verdict", slot.key, unit_id)
        return True

    def _publish(self, slot: OpenedSlot, info: RosterInfo) -> None:
        """Publish the slot's opening, with the round's commitments and the pending audit chain from the
        chain, once they hash to the roster's round hash."""
        chain = self.chain
        roster = chain.opened_roster(slot.order_id)
        index = next(
            (
                slot.unit * roster.replicas + r
                for r in range(roster.replicas)
                if roster.provider_of(slot.unit, r) == self.account.address
            ),
            None,
        )
        if index is None:
            raise ChainError(f"{self.account.address} holds no slot of unit {slot.unit} of {slot.order_id}")
        commitments = chain.round_commitments(slot.order_id, slot.round_index)
        records = chain.audit_records(slot.order_id)
        pending = eip712.audit_chains([r.as_tuple() for r in records])[1]
        if round_hash(slot.order_id, slot.round_index, commitments, pending) != info.pending_round_hash:
            raise ChainError(
                f"round {slot.round_index} of order {slot.order_id}: its commitments read from "
                "the chain do not hash to the roster's round hash"
            )
        opening = Reveal(
            self.account.address,
            eip712.as_bytes32(slot.result_digest, "result_digest"),
            eip712.as_bytes32(slot.salt, "salt"),
        )
        chain.publish_opening(
            slot.order_id, roster, index, opening, commitments, audit_records=records, sender=self.account
        )
        logger.info("slot %s: published its opening on chain (the round was still pending)", slot.key)

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps([asdict(s) for s in sorted(self.slots.values(), key=lambda s: s.key)]))
        tmp.replace(self.path)
