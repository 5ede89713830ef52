"""Read the contracts' state straight from storage, a whole step's fields in one round trip.

Why: the invariant machine inspects ~100 fields after every step (nonces excepted: their packing
changes with gas work, and every signed action checks them anyway); through one eth_call per view that
cost more than the transaction itself. Slots and offsets come from solc's storage layout of the
sources (scripts/compile-mutant.js prints it), looked up by variable and member name, so the reader
follows the contracts as they change. The words come from `Chain.storage_words`, fetched for every slot
read so far in the example at the first read after a transaction, so a step usually costs one round trip.
`cross_check()` compares every reader with the public view it mirrors; the machine runs it at the end of
every example, so a layout that does not match the deployed bytecode fails loudly instead of silently
reading the wrong slot.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eth_utils import keccak

from tests.chain.invariants_harness import Chain, HarnessError


@dataclass(frozen=True)
class Field:
    """Where one value lives: slot relative to its container, byte offset in the slot, size in bytes."""

    slot: int
    offset: int
    size: int

    def read(self, word: int) -> int:
        return (word >> (8 * self.offset)) & ((1 << (8 * self.size)) - 1)


class ContractLayout:
    """solc's `storageLayout` of one contract, queried by variable and struct member names."""

    def __init__(self, contract: str, layout: Mapping[str, Any]) -> None:
        self.contract = contract
        self._types: Mapping[str, Any] = layout["types"] or {}
        self._vars = {entry["label"]: entry for entry in layout["storage"]}

    def _var(self, label: str) -> Mapping[str, Any]:
        try:
            return self._vars[label]
        except KeyError:
            raise HarnessError(
                f"{self.contract} has no storage variable {label!r}; layout changed?"
            ) from None

    def slot(self, label: str) -> int:
        return int(self._var(label)["slot"])

    def value_type(self, label: str, depth: int = 1) -> str:
        """The type stored under a variable (for a mapping, its value type; `depth` 2: a mapping of
        mappings' inner value type)."""
        kind = str(self._var(label)["type"])
        for _ in range(depth):
            if kind.startswith("t_mapping"):
                kind = str(self._types[kind]["value"])
        return kind

    def member(self, struct_type: str, name: str) -> Field:
        for member in self._types[struct_type]["members"]:
            if member["label"] == name:
                size = int(self._types[member["type"]]["numberOfBytes"])
                return Field(int(member["slot"]), int(member["offset"]), size)
        raise HarnessError(f"{self.contract}: struct {struct_type} has no member {name!r}; layout changed?")

    def members(self, label: str, names: tuple[str, ...]) -> tuple[Field, ...]:
        struct_type = self.value_type(label)
        return tuple(self.member(struct_type, name) for name in names)


def _key(value: int | str) -> bytes:
    if isinstance(value, str):
        return bytes(12) + bytes.fromhex(value[2:])
    return value.to_bytes(32, "big")


@functools.lru_cache(maxsize=4096)
def mapping_slot(key: int | str, base: int) -> int:
    """Solidity's slot of `mapping[key]` declared at slot `base`."""
    return int.from_bytes(keccak(_key(key) + base.to_bytes(32, "big")), "big")


# getRoster's Roster tuple, in declaration order (the view returns it unnamed through Chain.view)
ROSTER_VIEW_FIELDS = (
    "partiesHash",
    "unitsPerRound",
    "requiredStreak",
    "rounds",
    "committed",
    "pendingBlock",
    "pendingSince",
    "replicas",
    "closed",
    "setAsideUnits",
    "openSetAside",
    "auditsPending",
    "faultMarks",
)
STAKE_FIELDS = ("bonded", "locked", "unbonding", "thawAt")
ACCOUNT_FIELDS = ("credit", "valid", "fault", "fraud", "consecutiveValid")
ORDER_FIELDS = ("balance", "delivered", "openUnits", "closed", "minReplicas", "trustedStreak")
UNIT_FIELDS = ("state", "committedMask", "revealedMask", "drawn", "commitDeadline", "revealDeadline")
ROSTER_FIELDS = (
    "requiredStreak",
    "committed",
    "pendingBlock",
    "pendingSince",
    "closed",
    "setAsideUnits",
    "openSetAside",
    "auditsPending",
    "faultMarks",
)


class StorageReader:
    """Typed fields of VeriToken, StakeManager and JobMarket at the chain head (words read at an older
    head are forgotten)."""

    def __init__(self, chain: Chain, layouts: Mapping[str, Mapping[str, Any]]) -> None:
        self.chain = chain
        token = ContractLayout("VeriToken", layouts["VeriToken"])
        stakes = ContractLayout("StakeManager", layouts["StakeManager"])
        market = ContractLayout("JobMarket", layouts["JobMarket"])
        self._token_address = chain.token.address
        self._stakes_address = chain.stakes.address
        self._market_address = chain.market.address
        self._balances = token.slot("_balances")
        self._sm_accounts = stakes.slot("_accounts")
        self._sm_fields = stakes.members("_accounts", STAKE_FIELDS)
        self._sm_total = stakes.slot("_totalStaked")
        self._jm_totals = market.slot("_totals")
        self._jm_total_fields = tuple(
            market.member(market.value_type("_totals"), n) for n in ("escrow", "credits")
        )
        self._jm_accounts = market.slot("_accounts")
        self._jm_account_fields = market.members("_accounts", ACCOUNT_FIELDS)
        self._jm_orders = market.slot("_orders")
        self._jm_order_fields = market.members("_orders", ORDER_FIELDS)
        self._jm_units = market.slot("_units")
        self._jm_unit_fields = market.members("_units", UNIT_FIELDS)
        self._jm_held = market.slot("_held")
        self._jm_rosters = market.slot("_rosters")
        self._jm_roster_fields = market.members("_rosters", ROSTER_FIELDS)
        self._jm_set_aside_slots = market.slot("_setAsideSlots")
        self._jm_roster_locks = market.slot("_rosterLocks")
        self._jm_round_hashes = market.slot("_roundHashes")
        self._jm_roster_audits = market.slot("_rosterAudits")
        lock_type = market.value_type("_rosterLocks", depth=2)
        self._jm_roster_lock_fields = tuple(market.member(lock_type, n) for n in ("held", "released"))
        self._words: dict[tuple[str, int], int] = {}
        self._head = chain.head
        # Every (contract, slot) read so far, in first-read order: the next step reads mostly the same ones.
        self._read: dict[tuple[str, int], None] = {}

    def _word(self, contract: str, slot: int) -> int:
        if self._head != self.chain.head:
            self._words, self._head = {}, self.chain.head
        key = (contract, slot)
        word = self._words.get(key)
        if word is None:
            self._read[key] = None
            self._words.update(self.chain.storage_words([k for k in self._read if k not in self._words]))
            word = self._words[key]
        return word

    def _struct(self, contract: str, base: int, fields: tuple[Field, ...]) -> tuple[int, ...]:
        words: dict[int, int] = {}
        values = []
        for f in fields:
            if f.slot not in words:
                words[f.slot] = self._word(contract, base + f.slot)
            values.append(f.read(words[f.slot]))
        return tuple(values)

    def token_balance(self, account: str) -> int:
        return self._word(self._token_address, mapping_slot(account, self._balances))

    def stake_of(self, account: str) -> tuple[int, int, int, int]:
        """(bonded, locked, unbonding, thawAt), like StakeManager.stakeOf."""
        bonded, locked, unbonding, thaw_at = self._struct(
            self._stakes_address, mapping_slot(account, self._sm_accounts), self._sm_fields
        )
        return bonded, locked, unbonding, thaw_at

    def total_staked(self) -> int:
        return self._word(self._stakes_address, self._sm_total)

    def totals(self) -> tuple[int, int]:
        """(totalEscrow, totalCredits)."""
        escrow, credits = self._struct(self._market_address, self._jm_totals, self._jm_total_fields)
        return escrow, credits

    def account(self, account: str) -> tuple[int, ...]:
        """(credit, valid, fault, fraud, consecutiveValid)."""
        return self._struct(
            self._market_address, mapping_slot(account, self._jm_accounts), self._jm_account_fields
        )

    def order(self, order_id: int) -> dict[str, int]:
        values = self._struct(
            self._market_address, mapping_slot(order_id, self._jm_orders), self._jm_order_fields
        )
        return dict(zip(ORDER_FIELDS, values, strict=True))

    def unit(self, unit_id: int) -> dict[str, int]:
        values = self._struct(
            self._market_address, mapping_slot(unit_id, self._jm_units), self._jm_unit_fields
        )
        return dict(zip(UNIT_FIELDS, values, strict=True))

    def held(self, unit_id: int) -> int:
        """JobMarket's `_held[unitId]`: the replicas a verdict called fraud (bits 0..7) and its signers'
        positions (bits 8..15) until settleHeld; 0 when nothing is held. No view mirrors it: the model
        checks it after every step."""
        return self._word(self._market_address, mapping_slot(unit_id, self._jm_held))

    def roster(self, order_id: int) -> dict[str, int]:
        """JobMarket's `_rosters[orderId]` (ROSTER_FIELDS), as getRoster returns them."""
        values = self._struct(
            self._market_address, mapping_slot(order_id, self._jm_rosters), self._jm_roster_fields
        )
        return dict(zip(ROSTER_FIELDS, values, strict=True))

    def set_aside_slots(self, order_id: int, provider_index: int) -> int:
        """`_setAsideSlots[orderId][providerIndex]`: the provider's slots in set-aside units. No view."""
        base = mapping_slot(order_id, self._jm_set_aside_slots)
        return self._word(self._market_address, mapping_slot(provider_index, base))

    def round_hash(self, order_id: int) -> bytes:
        """`_roundHashes[orderId]`: the committed round's chained commitments and/or the pending chain."""
        return self._word(self._market_address, mapping_slot(order_id, self._jm_round_hashes)).to_bytes(
            32, "big"
        )

    def audit_key(self, order_id: int) -> bytes:
        """`_rosterAudits[orderId].key`: keccak(verifiers hash, posted chain); 0 without verifiers."""
        return self._word(self._market_address, mapping_slot(order_id, self._jm_roster_audits)).to_bytes(
            32, "big"
        )

    def roster_lock(self, order_id: int, provider: str) -> tuple[int, int]:
        """`_rosterLocks[orderId][provider]`: (held, released). No view."""
        base = mapping_slot(provider, mapping_slot(order_id, self._jm_roster_locks))
        held, released = self._struct(self._market_address, base, self._jm_roster_lock_fields)
        return held, released

    def cross_check(
        self,
        accounts: list[str],
        order_ids: list[int],
        unit_ids: list[int],
        roster_ids: Sequence[int] = (),
    ) -> list[str]:
        """Differences between these readers and the contracts' public views (empty when the layout holds)."""
        chain = self.chain
        problems: list[str] = []

        def compare(what: str, ours: Any, theirs: Any) -> None:
            if ours != theirs:
                problems.append(f"{what}: storage {ours} != view {theirs}")

        compare("totalStaked", self.total_staked(), chain.view(chain.stakes, "totalStaked"))
        escrow_and_credits = (
            chain.view(chain.market, "totalEscrow"),
            chain.view(chain.market, "totalCredits"),
        )
        compare("totals", self.totals(), escrow_and_credits)
        for account in accounts:
            compare(
                f"balanceOf {account}",
                self.token_balance(account),
                chain.view(chain.token, "balanceOf", account),
            )
            compare(
                f"stakeOf {account}",
                self.stake_of(account),
                tuple(chain.view(chain.stakes, "stakeOf", account)),
            )
            credit, *reputation = self.account(account)
            compare(f"credits {account}", credit, chain.view(chain.market, "credits", account))
            compare(
                f"reputation {account}",
                tuple(reputation),
                tuple(chain.view(chain.market, "reputationOf", account)),
            )
        for order_id in order_ids:
            order = chain.view_struct(chain.market, "getOrder", order_id)
            compare(
                f"order {order_id}", self.order(order_id), {name: int(order[name]) for name in ORDER_FIELDS}
            )
        for unit_id in unit_ids:
            unit = chain.view_struct(chain.market, "getUnit", unit_id)
            compare(f"unit {unit_id}", self.unit(unit_id), {name: int(unit[name]) for name in UNIT_FIELDS})
        for order_id in roster_ids:
            roster = dict(
                zip(ROSTER_VIEW_FIELDS, chain.view(chain.market, "getRoster", order_id)[0], strict=True)
            )
            compare(
                f"roster {order_id}",
                self.roster(order_id),
                {name: int(roster[name]) for name in ROSTER_FIELDS},
            )
        return problems
