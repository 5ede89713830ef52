"""Reference model of VeriToken + StakeManager + JobMarket + VerdictAppeals, in plain Python, for the
invariant machine.

Why a second implementation: the state machine compares the contracts against it after every step, so
a contract that pays, locks, slashes or reverts differently from the written rules (contract_spec.md and
the NatSpec of contracts/*.sol) shows up at the first step where they part. Each action first decides
whether the contracts must revert and with which typed error (in the contracts' own check order); only
when no revert is expected does it apply its effects. Addresses are the actors' addresses; money is int.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from eth_utils import keccak

from tests.chain.invariants_harness import AppealParams, MarketParams
from veritrain.chain.eip712 import audit_chain, commitment, digests_hash, outcomes_hash, round_unit_id

BPS = 10_000
PPM = 1_000_000
ACCEPT, FAULT, FRAUD = 0, 1, 2
OPERATOR_ROLE = keccak(text="OPERATOR_ROLE")


class UnitState(IntEnum):
    NONE = 0
    COMMITTING = 1
    REVEALING = 2
    FINALIZED = 3
    VERDICTED = 4
    EXPIRED = 5


SETTLED_STATES = frozenset({UnitState.FINALIZED, UnitState.VERDICTED, UnitState.EXPIRED})
# The unit state machine: stored state may only move along these edges (or stay).
LEGAL_TRANSITIONS: dict[UnitState, frozenset[UnitState]] = {
    UnitState.NONE: frozenset({UnitState.COMMITTING}),
    UnitState.COMMITTING: frozenset({UnitState.REVEALING, UnitState.VERDICTED, UnitState.EXPIRED}),
    UnitState.REVEALING: frozenset({UnitState.FINALIZED, UnitState.VERDICTED, UnitState.EXPIRED}),
    UnitState.FINALIZED: frozenset(),
    UnitState.VERDICTED: frozenset(),
    UnitState.EXPIRED: frozenset(),
}


class AppealState(IntEnum):
    NONE = 0
    PENDING = 1
    CONFIRMED = 2
    OVERTURNED = 3
    LAPSED = 4


# bytes32(0): JobMarket.verdictHashOf of a unit no verdict settled.
NO_HASH = b"\x00" * 32
# VerdictAppeals.drawPanel tries this many pool entries per seat before it gives up.
DRAW_TRIES_PER_SEAT = 16


def bits(mask: int) -> list[int]:
    """The set bit positions of `mask`, lowest first."""
    return [i for i in range(mask.bit_length()) if mask >> i & 1]


@dataclass(frozen=True)
class Expected:
    """A revert the model predicts: the Solidity error name and the arguments it must carry."""

    name: str
    args: tuple[Any, ...] = ()


@dataclass
class StakeAccount:
    bonded: int = 0
    locked: int = 0
    unbonding: int = 0
    thaw_at: int = 0


@dataclass
class Reputation:
    valid: int = 0
    fault: int = 0
    fraud: int = 0
    consecutive: int = 0


@dataclass
class Order:
    order_id: int
    buyer: str
    units: int
    replicas: int
    price: int
    fee: int
    deadline: int
    escrow0: int
    balance: int
    delivered: int = 0
    open_units: int = 0
    closed: bool = False
    min_replicas: int = 0  # 0: a fixed order (= replicas)
    trusted_streak: int = 0

    def cost_of(self, replicas: int) -> int:
        """What a unit of `replicas` providers reserves (an adaptive unit may have fewer than the most)."""
        return replicas * self.price + self.fee


@dataclass
class Replica:
    provider: str
    commitment: bytes | None = None
    digest: bytes | None = None  # set once revealed


@dataclass
class Unit:
    unit_id: int
    order_id: int
    replicas: list[Replica]
    verifiers: list[str]
    commit_deadline: int
    reveal_deadline: int
    state: UnitState = UnitState.COMMITTING
    drawn: bool = False
    verdict: tuple[int, ...] | None = None  # the outcomes that settled it (the referee for slashing)
    seed_block: int = 0  # block of the last commit; the draw is decided at the first reveal
    # The replicas the verdict called fraud, held (collateral locked, price in escrow, nobody slashed)
    # until the unit's truth is fixed on VerdictAppeals (settle_held); 0 once settled or when none.
    held: int = 0
    held_signers: tuple[str, ...] = ()  # the verdict's signers, in assignment order: the bounty's payees
    held_since: int = 0  # when the verdict that holds them was recorded (the hold's appeal window opens)
    # A round-path unit set aside for a verdict (JobMarketRounds): its providers' collateral is the roster's,
    # so settling it releases only its verifiers' (and one slot of the roster's lock before each slash).
    rostered: bool = False
    # A unit set aside by challengeAudit: the roster verifiers who signed the posting that paid it (JobMarket
    # `_auditSigners`, in roster index order), and whether slashRoundAudit slashed them (at most once).
    audit_signers: tuple[str, ...] = ()
    audit_slashed: bool = False

    @property
    def all_committed(self) -> bool:
        return all(r.commitment is not None for r in self.replicas)

    @property
    def all_revealed(self) -> bool:
        return all(r.digest is not None for r in self.replicas)

    @property
    def unanimous(self) -> bool:
        """Every replica revealed, all the same digest."""
        return self.all_revealed and len({r.digest for r in self.replicas}) == 1

    @property
    def finalizable(self) -> bool:
        """Unanimous and not drawn: settled by `finalize` (never expired)."""
        return self.unanimous and not self.drawn

    @property
    def any_revealed(self) -> bool:
        return any(r.digest is not None for r in self.replicas)

    def index_of(self, provider: str) -> int | None:
        for index, replica in enumerate(self.replicas):
            if replica.provider == provider:
                return index
        return None

    @property
    def held_word(self) -> int:
        """JobMarket's `_held[unitId]`: held replicas in bits 0..7, the signers' positions in bits 8..15,
        the verdict's timestamp from bit 16."""
        if not self.held:
            return 0
        signers = sum(1 << i for i, v in enumerate(self.verifiers) if v in self.held_signers)
        return self.held | signers << 8 | self.held_since << 16


@dataclass
class RosterState:
    """A round-path order's roster (JobMarket `_rosters`, plus what its storage keeps per provider)."""

    order_id: int
    providers: list[str]
    slots: list[int]  # provider index of replica slot i = unit * replicas + replica
    replicas: int
    units_per_round: int
    rounds: int
    required_streak: int
    fault_marks: list[int]  # per provider: (fault + fraud) mod 256 at open
    committed: int = 0
    pending_block: int = 0
    pending_since: int = 0
    commitments: list[bytes] = field(default_factory=list)  # the pending round's, per slot
    closed: bool = False
    set_aside_units: int = 0
    open_set_aside: int = 0
    set_aside_slots: dict[int, int] = field(default_factory=dict)  # provider index -> set-aside slots
    lock_held: dict[str, int] = field(default_factory=dict)  # RosterLock.held (written at a set-aside)
    lock_released: dict[str, int] = field(default_factory=dict)  # RosterLock.released (before slashes)
    verifiers: list[str] = field(
        default_factory=list
    )  # the roster's verifiers (round audits); none: no audits
    # Audit records as the contract chains them (AuditRecord (info, digestsHash)): round records pending a
    # posting after the last posting's record; each posting's digestsHash is the pending chain it covered.
    audit_records: list[tuple[int, bytes]] = field(default_factory=list)
    dropped_slots: dict[int, int] = field(default_factory=dict)  # provider index -> slots dropped unpaid
    audit_released: int = 0  # RosterAudits.released: verifiers whose collateral a slashRoundAudit released
    revealed: dict[int, tuple[list[bytes], list[bytes]]] = field(
        default_factory=dict
    )  # round -> (commitments
    # per slot, replica 0's value per unit): what a record's units are set aside with

    @property
    def uses(self) -> list[int]:
        """Replica slots of one round per provider."""
        return [self.slots.count(p) for p in range(len(self.providers))]

    @property
    def units(self) -> int:
        return self.units_per_round * self.rounds

    @property
    def settled_rounds(self) -> int:
        """Rounds committed and revealed (a pending one is not)."""
        return self.committed - (1 if self.pending_block else 0)

    def provider_of(self, slot: int) -> str:
        return self.providers[self.slots[slot]]

    @property
    def pending_records(self) -> list[tuple[int, bytes]]:
        """The round records no posting covers yet (the roster's pending chain)."""
        last = max((i + 1 for i, (info, _) in enumerate(self.audit_records) if info >> 255), default=0)
        return self.audit_records[last:]

    @property
    def last_posting_time(self) -> int:
        """The time of the roster's last posting (0: none): the close waits verdictWindow after it."""
        postings = [info for info, _ in self.audit_records if info >> 255]
        return (postings[-1] >> 72) & (2**40 - 1) if postings else 0


@dataclass
class Appeal:
    """A unit's appeal on VerdictAppeals. `votes[seat]` is the outcomes hash the referee voted (None: not
    yet); `decided` the outcomes a panel majority voted."""

    appellant: str
    vote_deadline: int
    seed_block: int
    pool_size: int
    state: AppealState = AppealState.PENDING
    panel: list[str] = field(default_factory=list)
    votes: list[bytes | None] = field(default_factory=list)
    decided: tuple[int, ...] | None = None


@dataclass
class Model:
    """Everything the contracts hold, as the written rules say it should be."""

    params: MarketParams
    token_holder_sm: str
    token_holder_jm: str
    token_holder_va: str = ""  # VerdictAppeals: slashes pass through it within one transaction
    appeal_params: AppealParams = field(default_factory=AppealParams)
    tokens: dict[str, int] = field(default_factory=dict)
    stakes: dict[str, StakeAccount] = field(default_factory=dict)
    credits: dict[str, int] = field(default_factory=dict)
    reputation: dict[str, Reputation] = field(default_factory=dict)
    sm_nonces: dict[str, int] = field(default_factory=dict)
    jm_nonces: dict[str, int] = field(default_factory=dict)
    accept_nonces_used: set[tuple[str, int]] = field(default_factory=set)
    orders: dict[int, Order] = field(default_factory=dict)
    units: dict[int, Unit] = field(default_factory=dict)
    rosters: dict[int, RosterState] = field(default_factory=dict)
    published: dict[tuple[int, int, int], bytes] = field(default_factory=dict)  # (order, round, slot)
    appeals: dict[int, Appeal] = field(default_factory=dict)
    pool: list[list[Any]] = field(default_factory=list)  # [referee, block it left (0: still in)]
    entry_of: dict[str, int] = field(default_factory=dict)  # 1 + its active pool entry's index
    # The chain's block clock, which no contract rule decides: the number of the block the next
    # transaction lands in, and a mined block's hash (the spot-check seed).
    pending_block: Callable[[], int] = lambda: 0
    block_hash: Callable[[int], bytes] = lambda number: b"\x00" * 32

    # ---- small helpers ----

    def stake_of(self, account: str) -> StakeAccount:
        return self.stakes.setdefault(account, StakeAccount())

    def rep(self, account: str) -> Reputation:
        return self.reputation.setdefault(account, Reputation())

    def _move(self, source: str, target: str, amount: int) -> None:
        self.tokens[source] = self.tokens.get(source, 0) - amount
        self.tokens[target] = self.tokens.get(target, 0) + amount

    def _credit(self, account: str, amount: int) -> None:
        self.credits[account] = self.credits.get(account, 0) + amount

    def _pay_credit(self, account: str) -> None:
        """A close pays `account` its whole credit (JobMarketBase._payCredit; the model's token takes every
        transfer)."""
        amount = self.credits.get(account, 0)
        if amount:
            self.credits[account] = 0
            self._move(self.token_holder_jm, account, amount)

    def total_staked(self) -> int:
        return sum(s.bonded + s.unbonding for s in self.stakes.values())

    def total_credits(self) -> int:
        return sum(self.credits.values())

    def total_escrow(self) -> int:
        """Order balances, the full cost of every open unit (what finalize/verdict/expire draw on) and the
        prices of held replicas (what settle_held draws on)."""
        escrow = sum(o.balance for o in self.orders.values())
        for unit in self.units.values():
            if unit.state not in SETTLED_STATES:
                escrow += self.orders[unit.order_id].cost_of(len(unit.replicas))
            escrow += len(bits(unit.held)) * self.orders[unit.order_id].price
        for roster in self.rosters.values():  # the budget of every roster unit not set aside, until close
            if not roster.closed:
                order = self.orders[roster.order_id]
                escrow += (roster.units - roster.set_aside_units) * order.cost_of(roster.replicas)
        return escrow

    def held_prices(self, order_id: int) -> int:
        """The prices of the order's held replicas: escrow that stays after the order closes."""
        order = self.orders[order_id]
        return sum(len(bits(u.held)) * order.price for u in self.units.values() if u.order_id == order_id)

    # ---- StakeManager ----

    def stake(self, account: str, amount: int, now: int) -> Expected | None:
        if amount == 0:
            return Expected("ZeroAmount")
        self._move(account, self.token_holder_sm, amount)
        self.stake_of(account).bonded += amount
        return None

    def request_unstake(self, account: str, amount: int, now: int) -> Expected | None:
        acc = self.stake_of(account)
        if amount == 0:
            return Expected("ZeroAmount")
        free = acc.bonded - acc.locked
        if amount > free:
            return Expected("InsufficientFreeStake", (account, free, amount))
        acc.bonded -= amount
        acc.unbonding += amount
        acc.thaw_at = now + self.params.unbonding_period
        return None

    def withdraw_stake(self, account: str, now: int) -> Expected | None:
        acc = self.stake_of(account)
        if acc.unbonding == 0:
            return Expected("NothingToWithdraw", (account,))
        if now < acc.thaw_at:
            return Expected("StakeStillThawing", (account, acc.thaw_at))
        self._move(self.token_holder_sm, account, acc.unbonding)
        acc.unbonding = 0
        acc.thaw_at = 0
        return None

    def slash(self, account: str, amount: int, recipient: str) -> int:
        """StakeManager.slash: bonded first, then unbonding; locked never exceeds bonded afterwards."""
        acc = self.stake_of(account)
        from_bonded = min(amount, acc.bonded)
        acc.bonded -= from_bonded
        acc.locked = min(acc.locked, acc.bonded)
        from_unbonding = min(amount - from_bonded, acc.unbonding)
        acc.unbonding -= from_unbonding
        slashed = from_bonded + from_unbonding
        self._move(self.token_holder_sm, recipient, slashed)
        return slashed

    @staticmethod
    def _order_taking_units_error(order_id: int, order: Order | None, now: int) -> Expected | None:
        """What `assign` and `openRoster` check first, in the contract's order: the order exists, is open
        and before its deadline."""
        if order is None:
            return Expected("UnknownOrder", (order_id,))
        if order.closed:
            return Expected("OrderNotOpen", (order_id,))
        if now > order.deadline:
            return Expected("OrderExpired", (order_id, order.deadline))
        return None

    def _unlock(self, account: str, amount: int | None = None) -> None:
        """StakeManager.unlock (saturating); a provider's collateral by default."""
        acc = self.stake_of(account)
        acc.locked = max(0, acc.locked - (self.params.provider_collateral if amount is None else amount))

    def _lock(self, account: str, amount: int) -> Expected | None:
        """StakeManager.lock: only free stake."""
        acc = self.stake_of(account)
        if amount > acc.bonded - acc.locked:
            return Expected("InsufficientFreeStake", (account, acc.bonded - acc.locked, amount))
        acc.locked += amount
        return None

    def _unlock_replica(self, unit: Unit, provider: str, slashing: bool) -> None:
        """JobMarket._unlockProvider: a per-unit replica's collateral is released; a set-aside one's is its
        roster's, released at close, except one slot of the roster's lock before a slash (while any is
        left)."""
        if not unit.rostered:
            self._unlock(provider)
            return
        if not slashing:
            return
        roster = self.rosters[unit.order_id]
        released = roster.lock_released.get(provider, 0)
        if released + self.params.provider_collateral > roster.lock_held.get(provider, 0):
            return
        roster.lock_released[provider] = released + self.params.provider_collateral
        self._unlock(provider)

    def _close_set_aside(self, unit: Unit) -> None:
        """A set-aside unit settled for good: its roster may close once none is left."""
        if unit.rostered:
            self.rosters[unit.order_id].open_set_aside -= 1

    def _release_verifiers(self, unit: Unit) -> None:
        for verifier in unit.verifiers:
            acc = self.stake_of(verifier)
            acc.locked = max(0, acc.locked - self.params.verifier_collateral)

    # ---- JobMarket: orders ----

    def post_order(
        self, buyer: str, units: int, replicas: int, price: int, fee: int, deadline: int, now: int
    ) -> Expected | None:
        if units == 0:
            return Expected("ZeroUnits")
        if not 1 <= replicas <= 5:
            return Expected("InvalidReplicaCount", (replicas,))
        if deadline <= now:
            return Expected("InvalidDeadline", (deadline, now))
        escrow = units * (replicas * price + fee)
        order_id = len(self.orders) + 1
        self.orders[order_id] = Order(order_id, buyer, units, replicas, price, fee, deadline, escrow, escrow)
        self._move(buyer, self.token_holder_jm, escrow)
        return None

    def post_adaptive_order(
        self,
        buyer: str,
        units: int,
        min_replicas: int,
        max_replicas: int,
        streak: int,
        price: int,
        fee: int,
        deadline: int,
        now: int,
    ) -> Expected | None:
        if min_replicas == 0 or min_replicas > max_replicas:
            return Expected("InvalidReplicaBounds", (min_replicas, max_replicas))
        error = self.post_order(buyer, units, max_replicas, price, fee, deadline, now)
        if error is None:
            order = self.orders[len(self.orders)]
            order.min_replicas, order.trusted_streak = min_replicas, streak
        return error

    def close_order(self, order_id: int, caller: str, now: int) -> Expected | None:
        order = self.orders.get(order_id)
        if order is None:
            return Expected("UnknownOrder", (order_id,))
        if order.closed:
            return Expected("OrderNotOpen", (order_id,))
        if caller != order.buyer and now <= order.deadline:
            return Expected("OrderNotClosable", (order_id, order.deadline))
        if order.open_units:
            return Expected("UnitsStillOpen", (order_id, order.open_units))
        self._credit(order.buyer, order.balance)
        order.balance = 0
        order.closed = True
        self._pay_credit(order.buyer)
        return None

    # ---- JobMarket: assignment ----

    def assign(
        self,
        order_id: int,
        providers: Sequence[str],
        verifiers: Sequence[str],
        accept_nonces: Sequence[int],
        now: int,
    ) -> Expected | None:
        """`accept_nonces` are the unordered nonces the providers' signatures carry (deadlines are always
        valid)."""
        order = self.orders.get(order_id)
        refused = self._order_taking_units_error(order_id, order, now)
        if refused is not None or order is None:
            return refused
        if not (order.min_replicas or order.replicas) <= len(providers) <= order.replicas:
            return Expected("ProviderCountMismatch", (order.replicas, len(providers)))
        cost = order.cost_of(len(providers))
        streak = order.trusted_streak if len(providers) < order.replicas else 0
        minimum = self.params.min_verifiers
        if not minimum <= len(verifiers) <= 5:
            return Expected("InvalidVerifierCount", (len(verifiers), minimum, 5))
        if order.delivered + order.open_units >= order.units or cost > order.balance:
            return Expected("NoUnitBudget", (order_id,))
        # Providers: duplicates, streak and nonce of each, then all locks (lockBatch; signatures are always
        # made by the right key here).
        for i, provider in enumerate(providers):
            if provider in providers[:i]:
                return Expected("DuplicateParty", (provider,))
            if self.reputation.get(provider, Reputation()).consecutive < streak:
                return Expected("ProviderNotTrusted", (provider, streak))
            if (provider, accept_nonces[i]) in self.accept_nonces_used:
                return Expected("AcceptNonceUsed", (provider, accept_nonces[i]))
        for provider in providers:
            acc = self.stake_of(provider)
            if self.params.provider_collateral > acc.bonded - acc.locked:
                free = acc.bonded - acc.locked
                return Expected("InsufficientFreeStake", (provider, free, self.params.provider_collateral))
        for i, verifier in enumerate(verifiers):
            if verifier in providers or verifier in verifiers[:i]:
                return Expected("DuplicateParty", (verifier,))
        for verifier in verifiers:
            acc = self.stake_of(verifier)
            if self.params.verifier_collateral > acc.bonded - acc.locked:
                return Expected(
                    "InsufficientFreeStake",
                    (verifier, acc.bonded - acc.locked, self.params.verifier_collateral),
                )
        order.balance -= cost
        order.open_units += 1
        for provider, nonce in zip(providers, accept_nonces, strict=True):
            self.accept_nonces_used.add((provider, nonce))
            self.stake_of(provider).locked += self.params.provider_collateral
        for verifier in verifiers:
            self.stake_of(verifier).locked += self.params.verifier_collateral
        unit_id = len(self.units) + 1
        commit_deadline = now + self.params.commit_window
        # probation: a provider below the streak (reset by any fault or fraud) draws the unit at once
        probation = any(
            self.reputation.get(p, Reputation()).consecutive < self.params.probation_streak for p in providers
        )
        self.units[unit_id] = Unit(
            unit_id,
            order_id,
            [Replica(p) for p in providers],
            list(verifiers),
            commit_deadline,
            commit_deadline + self.params.reveal_window,
            drawn=probation,
        )
        return None

    # ---- JobMarket: commit / reveal ----

    def _open_error(self, unit_id: int) -> Expected | None:
        unit = self.units.get(unit_id)
        if unit is None:
            return Expected("InvalidUnitState", (unit_id, 0))
        if unit.state in SETTLED_STATES:
            return Expected("UnitAlreadySettled", (unit_id,))
        return None

    def commit(
        self, unit_id: int, provider: str, commitment: bytes, sig_nonce: int | None, now: int
    ) -> Expected | None:
        """`sig_nonce` is the nonce of a commitWithSig signature (None for a plain commit by the provider)."""
        if sig_nonce is not None:
            expected_nonce = self.jm_nonces.get(provider, 0)
            if sig_nonce != expected_nonce:
                return Expected("InvalidNonce", (provider, expected_nonce, sig_nonce))
        error = self._open_error(unit_id)
        if error:
            return error
        unit = self.units[unit_id]
        if now > unit.commit_deadline:
            return Expected("CommitWindowClosed", (unit_id, unit.commit_deadline))
        index = unit.index_of(provider)
        if index is None:
            return Expected("NotAssignedProvider", (unit_id, provider))
        if unit.replicas[index].commitment is not None:
            return Expected("AlreadyCommitted", (unit_id, provider))
        if sig_nonce is not None:
            self.jm_nonces[provider] = sig_nonce + 1
        unit.replicas[index].commitment = commitment
        if unit.all_committed:
            unit.state = UnitState.REVEALING
            unit.seed_block = self.pending_block()
        return None

    def reveal(self, unit_id: int, provider: str, digest: bytes, matches: bool, now: int) -> Expected | None:
        """`matches`: whether (digest, salt) hash to the stored commitment (the machine knows the salts)."""
        error = self._open_error(unit_id)
        if error:
            return error
        unit = self.units[unit_id]
        if unit.state == UnitState.COMMITTING and now <= unit.commit_deadline:
            return Expected("RevealWindowNotOpen", (unit_id, unit.commit_deadline))
        if now > unit.reveal_deadline:
            return Expected("RevealWindowClosed", (unit_id, unit.reveal_deadline))
        block = self.pending_block()
        deciding = unit.seed_block != 0 and not unit.any_revealed
        if deciding and block <= unit.seed_block:
            return Expected("RevealTooEarly", (unit_id, unit.seed_block))
        index = unit.index_of(provider)
        if index is None:
            return Expected("NotAssignedProvider", (unit_id, provider))
        replica = unit.replicas[index]
        if replica.commitment is None:
            return Expected("NotCommitted", (unit_id, provider))
        if replica.digest is not None:
            return Expected("AlreadyRevealed", (unit_id, provider))
        if not matches:
            return Expected("RevealMismatch", (unit_id, provider))
        if deciding and not unit.drawn:
            unit.drawn = self._drawn(unit, block)
        replica.digest = digest
        return None

    def _drawn(self, unit: Unit, block: int) -> bool:
        """The spot-check draw at `block`: a seed hash older than 256 blocks is gone and counts as drawn."""
        if block - unit.seed_block > 256:
            return True
        rate = self.params.solo_spot_check_ppm if len(unit.replicas) == 1 else self.params.spot_check_ppm
        seed = self.block_hash(unit.seed_block) + unit.unit_id.to_bytes(32, "big")
        return int.from_bytes(keccak(seed), "big") % PPM < rate

    def request_verification(self, unit_id: int) -> Expected | None:
        error = self._open_error(unit_id)
        if error:
            return error
        self.units[unit_id].drawn = True
        return None

    # ---- JobMarket: settlement ----

    def _pay_accepted(self, provider: str, price: int) -> None:
        self._credit(provider, price)
        rep = self.rep(provider)
        rep.valid += 1
        rep.consecutive += 1

    def _record_fault(self, provider: str) -> None:
        rep = self.rep(provider)
        rep.fault += 1
        rep.consecutive = 0

    def _record_fraud(self, provider: str) -> None:
        rep = self.rep(provider)
        rep.fraud += 1
        rep.consecutive = 0

    def finalize(self, unit_id: int, by_operator: bool, now: int) -> Expected | None:
        error = self._open_error(unit_id)
        if error:
            return error
        unit = self.units[unit_id]
        if unit.drawn:
            return Expected("UnitUnderVerification", (unit_id,))
        if not unit.all_revealed:
            return Expected("RevealsIncomplete", (unit_id,))
        if not unit.unanimous:
            return Expected("NotUnanimous", (unit_id,))
        verdict_deadline = unit.reveal_deadline + self.params.verdict_window
        if not by_operator and now <= verdict_deadline:  # the operator checks canaries' answers first
            return Expected("FinalizeReserved", (unit_id, verdict_deadline))
        unit.state = UnitState.FINALIZED
        order = self.orders[unit.order_id]
        for replica in unit.replicas:
            self._pay_accepted(replica.provider, order.price)
            self._unlock(replica.provider)
        self._release_verifiers(unit)
        order.balance += order.fee
        order.delivered += 1
        order.open_units -= 1
        return None

    def verdict_window_error(self, unit: Unit, now: int) -> Expected | None:
        if not unit.all_revealed and now <= unit.reveal_deadline:
            return Expected("VerdictWindowNotOpen", (unit.unit_id, unit.reveal_deadline))
        verdict_deadline = unit.reveal_deadline + self.params.verdict_window
        if now > verdict_deadline:
            return Expected("VerdictWindowClosed", (unit.unit_id, verdict_deadline))
        return None

    def submit_verdict(
        self,
        unit_id: int,
        outcomes: Sequence[int],
        signers: Sequence[str],
        now: int,
    ) -> Expected | None:
        error = self._open_error(unit_id)
        if error:
            return error
        unit = self.units[unit_id]
        error = self.verdict_window_error(unit, now)
        if error:
            return error
        if len(outcomes) != len(unit.replicas):
            return Expected("OutcomeCountMismatch", (len(unit.replicas), len(outcomes)))
        for i, outcome in enumerate(outcomes):
            if outcome > FRAUD or (outcome != FAULT and unit.replicas[i].digest is None):
                return Expected("InvalidOutcome", (i, outcome))
        seen: set[str] = set()
        for signer in signers:
            if signer not in unit.verifiers:
                return Expected("NotAssignedVerifier", (unit_id, signer))
            if signer in seen:
                return Expected("DuplicateParty", (signer,))
            seen.add(signer)
        quorum = len(unit.verifiers) // 2 + 1  # a majority of the unit's assigned verifiers
        if len(signers) < quorum:
            return Expected("QuorumNotReached", (unit_id, len(signers), quorum))
        unit.state = UnitState.VERDICTED
        unit.verdict = tuple(outcomes)
        self._release_verifiers(unit)
        order = self.orders[unit.order_id]
        paid = penalties = 0
        for index, (replica, outcome) in enumerate(zip(unit.replicas, outcomes, strict=True)):
            if outcome == FRAUD:  # held: no slash, no bounty, collateral locked, price in escrow; counted
                unit.held |= 1 << index  # (the accusation: matching declines it at once), streak ends
                self._record_fraud(replica.provider)
                continue
            withheld = replica.commitment is not None and replica.digest is None
            self._unlock_replica(unit, replica.provider, outcome == FAULT and withheld)
            if outcome == ACCEPT:
                self._pay_accepted(replica.provider, order.price)
                paid += 1
            else:
                self._record_fault(replica.provider)
                if withheld:
                    penalties += self._withheld(replica.provider)
        if unit.held:
            unit.held_signers = tuple(v for v in unit.verifiers if v in signers)
            unit.held_since = now
        else:  # else when its held fraud settles
            self._close_set_aside(unit)
        verifier_pay = order.fee + penalties * self.params.bounty_bps // BPS
        share = verifier_pay // len(signers)
        for signer in signers:
            self._credit(signer, share)
        to_buyer = penalties + order.fee - share * len(signers)
        if to_buyer:
            self._credit(order.buyer, to_buyer)
        order.balance += (len(unit.replicas) - paid - len(bits(unit.held))) * order.price
        if paid:
            order.delivered += 1
        order.open_units -= 1
        return None

    def expire(self, unit_id: int, now: int) -> Expected | None:
        error = self._open_error(unit_id)
        if error:
            return error
        unit = self.units[unit_id]
        verdict_deadline = unit.reveal_deadline + self.params.verdict_window
        if now <= verdict_deadline:
            return Expected("UnitNotExpired", (unit_id, verdict_deadline))
        if unit.finalizable:
            return Expected("UnitFinalizable", (unit_id,))  # its providers finalize it themselves
        unit.state = UnitState.EXPIRED
        order = self.orders[unit.order_id]
        for replica in unit.replicas:
            withheld = replica.commitment is not None and replica.digest is None
            self._unlock_replica(unit, replica.provider, withheld)
            if replica.digest is None:
                self._record_fault(replica.provider)
                if replica.commitment is not None:
                    self._credit(order.buyer, self._withheld(replica.provider))
        self._release_verifiers(unit)
        order.balance += order.cost_of(len(unit.replicas))
        order.open_units -= 1
        self._close_set_aside(unit)
        return None

    def _withheld(self, provider: str) -> int:
        """Slashes the withhold penalty of a replica that committed and never revealed, into JobMarket."""
        return self.slash(provider, self.params.withhold_penalty, self.token_holder_jm)

    def settle_held(self, unit_id: int, verdict: Sequence[int], truth: Sequence[int], caller: str) -> int:
        """JobMarket.settleHeld (only VerdictAppeals calls it, with the unit's verdict, which it checked, and
        a truth of one outcome per replica): each held replica is released and settled by `truth`; a truth
        that overturns the verdict also slashes the fraud the verdict missed (_slash_missed). Returns what
        was slashed to the caller."""
        unit = self.units[unit_id]
        stands = tuple(truth) == unit.verdict
        to_caller = self._settle_held(unit, truth, caller) if unit.held else 0
        if not stands:
            to_caller += self._slash_missed(unit, verdict, truth, caller)
        return to_caller

    def _slash_missed(self, unit: Unit, verdict: Sequence[int], truth: Sequence[int], caller: str) -> int:
        """JobMarketVerdicts._slashMissed: every replica the truth calls fraud and the overturned verdict did
        not is slashed to the caller, its fraud counted and its streak ended. Its collateral was released
        by the verdict (per-unit) or is its roster's: while the roster is open, one slot of the roster's
        lock is released first (as before any slash of a set-aside replica); a closed roster released it."""
        roster = self.rosters.get(unit.order_id) if unit.rostered else None
        slashed = 0
        for index, (said, fixed) in enumerate(zip(verdict, truth, strict=True)):
            if fixed != FRAUD or said == FRAUD:
                continue
            provider = unit.replicas[index].provider
            if roster is not None and not roster.closed:
                self._unlock_replica(unit, provider, True)
            self._record_fraud(provider)
            slashed += self.slash(provider, self.params.slash_amount, caller)
        return slashed

    def _settle_held(self, unit: Unit, truth: Sequence[int], caller: str) -> int:
        """settleHeld's held replicas, settled by `truth`; returns what was slashed to the caller."""
        held = unit.held
        unit.held = 0
        stands = tuple(truth) == unit.verdict
        slash_to = self.token_holder_jm if stands else caller
        order = self.orders[unit.order_id]
        paid = slashed = 0
        for index in range(len(truth)):
            if not held >> index & 1:
                continue
            provider = unit.replicas[index].provider
            self._unlock_replica(unit, provider, truth[index] == FRAUD)
            if truth[index] != FRAUD:  # acquitted: the fraud counted at the accusation is taken back
                self.rep(provider).fraud -= 1
            if truth[index] == ACCEPT:
                self._pay_accepted(provider, order.price)
                paid += 1
            elif truth[index] == FAULT:  # a held replica revealed: no withhold penalty
                self._record_fault(provider)
            else:  # confirmed: a streak built since the accusation ends too
                self.rep(provider).consecutive = 0
                slashed += self.slash(provider, self.params.slash_amount, slash_to)
        self._close_set_aside(unit)
        refunds = (len(bits(held)) - paid) * order.price
        to_caller = bounty = 0
        if stands:  # the bounty to the verdict's signers, the rest to the buyer
            share = slashed * self.params.bounty_bps // BPS // len(unit.held_signers)
            for signer in unit.held_signers:
                self._credit(signer, share)
            bounty = share * len(unit.held_signers)
        else:  # overturned: the caller pays the deciding referees
            to_caller, slashed = slashed, 0
        self._credit(order.buyer, refunds + slashed - bounty)
        return to_caller

    # ---- JobMarketRounds: the round path ----

    def _slots_error(
        self, providers: Sequence[str], slots: Sequence[int], replicas: int, count: int
    ) -> Expected | None:
        """JobMarketRounds._slotsPerProvider's layout checks."""
        n = count * replicas
        if not providers or len(providers) > 32 or n > 51 or len(slots) > n:
            return Expected("InvalidLayout", (n,))
        for i, p in enumerate(slots):
            if p >= len(providers) or p in slots[i - i % replicas : i]:
                return Expected("InvalidLayout", (i,))
        if any(p not in slots for p in range(len(providers))):
            return Expected("InvalidLayout", (n,))
        return None

    def open_roster(
        self,
        order_id: int,
        providers: Sequence[str],
        slots: Sequence[int],
        replicas: int,
        units_per_round: int,
        rounds: int,
        accept_nonces: Sequence[int],
        now: int,
        verifiers: Sequence[str] = (),
    ) -> Expected | None:
        """JobMarketRounds.openRoster by the operator (every Accept signed by its provider, over the key with
        `verifiers`: the roster's, each locking verifierCollateral until the close)."""
        order = self.orders.get(order_id)
        refused = self._order_taking_units_error(order_id, order, now)
        if refused is not None or order is None:
            return refused
        if order_id in self.rosters:
            return Expected("RosterExists", (order_id,))
        if not (order.min_replicas or order.replicas) <= replicas <= order.replicas:
            return Expected("InvalidReplicaCount", (replicas,))
        if units_per_round == 0 or rounds == 0:
            return Expected("ZeroUnits")
        units = units_per_round * rounds
        cost = units * order.cost_of(replicas)
        if order.delivered + order.open_units + units > order.units or cost > order.balance:
            return Expected("NoUnitBudget", (order_id,))
        error = self._slots_error(providers, slots, replicas, units_per_round)
        if error:
            return error
        uses = [list(slots).count(p) for p in range(len(providers))]
        required = order.trusted_streak if replicas < order.replicas else 0
        collateral = self.params.provider_collateral
        if verifiers:
            refused = self._verifiers_error(providers, verifiers)
            if refused is not None:
                return refused
        for p, provider in enumerate(providers):
            if provider in providers[:p]:
                return Expected("DuplicateParty", (provider,))
            if self.rep(provider).consecutive < required:
                return Expected("ProviderNotTrusted", (provider, required))
            if (provider, accept_nonces[p]) in self.accept_nonces_used:
                return Expected("AcceptNonceUsed", (provider, accept_nonces[p]))
            acc = self.stake_of(provider)
            if uses[p] * collateral > acc.bonded - acc.locked:
                return Expected(
                    "InsufficientFreeStake", (provider, acc.bonded - acc.locked, uses[p] * collateral)
                )
        for verifier in verifiers:
            self.stake_of(verifier).locked += self.params.verifier_collateral
        for p, provider in enumerate(providers):
            self.accept_nonces_used.add((provider, accept_nonces[p]))
            self.stake_of(provider).locked += uses[p] * collateral
        order.balance -= cost
        order.open_units += units
        marks = [(self.rep(p).fault + self.rep(p).fraud) & 0xFF for p in providers]
        self.rosters[order_id] = RosterState(
            order_id,
            list(providers),
            list(slots),
            replicas,
            units_per_round,
            rounds,
            max(required, self.params.probation_streak),
            marks,
            verifiers=list(verifiers),
        )
        return None

    def _verifiers_error(self, providers: Sequence[str], verifiers: Sequence[str]) -> Expected | None:
        """JobMarket's _checkVerifierCount, _checkVerifiers (none a provider, no two alike) and lockBatch."""
        minimum = self.params.min_verifiers
        if not minimum <= len(verifiers) <= 5:
            return Expected("InvalidVerifierCount", (len(verifiers), minimum, 5))
        for i, verifier in enumerate(verifiers):
            if verifier in providers or verifier in verifiers[:i]:
                return Expected("DuplicateParty", (verifier,))
        for verifier in verifiers:
            acc = self.stake_of(verifier)
            if self.params.verifier_collateral > acc.bonded - acc.locked:
                free = acc.bonded - acc.locked
                return Expected("InsufficientFreeStake", (verifier, free, self.params.verifier_collateral))
        return None

    def _open_roster(self, order_id: int, key_ok: bool) -> RosterState | Expected:
        roster = self.rosters.get(order_id)
        if roster is None or roster.closed:
            return Expected("RosterNotOpen", (order_id,))
        if not key_ok:
            return Expected("RosterMismatch", (order_id,))
        return roster

    def _round_drawn(self, unit_id: int, replicas: int, seed_block: int, block: int) -> bool:
        """The round path's draw of one unit: from the hash of the block that committed its round (gone
        after 256 blocks: drawn)."""
        if block - seed_block > 256:
            return True
        rate = self.params.solo_spot_check_ppm if replicas == 1 else self.params.spot_check_ppm
        seed = self.block_hash(seed_block) + unit_id.to_bytes(32, "big")
        return int.from_bytes(keccak(seed), "big") % PPM < rate

    def step_round(
        self,
        order_id: int,
        key_ok: bool,
        openings: Sequence[tuple[bytes, bytes]],
        withheld: int,
        verifiers: Sequence[str],
        by_operator: bool,
        works: Sequence[tuple[bytes, str]],
        deadline: int,
        now: int,
        post: bool = False,
        signers: int | None = None,
    ) -> tuple[Expected | None, list[int]]:
        """JobMarketRounds.stepRound: reveals the pending round (openings per slot: (digest, salt), or for a
        withheld slot (its commitment, anything)) and commits the next (works per slot: (commitment, the
        address that signed it)). On a roster with verifiers the revealed round's units drawn by the seed
        alone (unanimous, no provider below the streak) are left pending, not set aside, unless the step has
        `verifiers` and does not post; `post`: the roster verifiers of the mask `signers` (None: every one)
        sign the pending chain, which the step then posts (a majority, or QuorumNotReached). Returns the
        expected revert, or None and the units (of the revealed round) set aside."""
        found = self._open_roster(order_id, key_ok)
        if isinstance(found, Expected):
            return found, []
        roster, order = found, self.orders[order_id]
        k, n = roster.replicas, roster.units_per_round
        block = self.pending_block()
        set_aside: list[tuple[int, bool, list[bytes], int]] = []  # (unit, drawn, values, unrevealed mask)
        record: tuple[int, bytes] | None = None  # the revealed round's record, when it leaves units pending
        digests: list[bytes] = []  # replica 0's value of each unit of the revealed round
        if roster.pending_block:
            if len(openings) != n * k:
                return Expected("EntryCountMismatch", (n * k, len(openings))), []
            if block <= roster.pending_block:
                return Expected("RoundRevealTooEarly", (order_id, roster.pending_block)), []
            round_ = roster.committed - 1
            if withheld:
                if withheld >> len(openings):
                    return Expected("InvalidLayout", (len(openings),)), []
                window_end = roster.pending_since + self.params.reveal_window
                if now <= window_end:
                    return Expected("RoundRevealWindowOpen", (order_id, window_end)), []
            weak = {
                p
                for p, provider in enumerate(roster.providers)
                if roster.required_streak and self.rep(provider).consecutive < roster.required_streak
            }
            matches = True
            auditable = 0  # bit u: drawn by the seed alone, unanimous, no provider below the streak
            for unit in range(n):
                unit_id = round_unit_id(order_id, round_, unit)
                drawn = self._round_drawn(unit_id, k, roster.pending_block, block)
                by_seed = drawn
                split = False
                values: list[bytes] = []
                unrevealed = 0
                for r in range(k):
                    slot = unit * k + r
                    digest, salt = openings[slot]
                    provider = roster.provider_of(slot)
                    if withheld >> slot & 1:
                        matches &= digest == roster.commitments[slot]
                        value = self.published.get((order_id, round_, slot), digest)
                        if value == digest:
                            split, unrevealed = True, unrevealed | 1 << r
                    else:
                        matches &= commitment(digest, salt, provider, unit_id) == roster.commitments[slot]
                        value = digest
                    split |= bool(values) and value != values[0]
                    values.append(value)
                    by_seed &= roster.slots[slot] not in weak
                    drawn |= roster.slots[slot] in weak
                digests.append(values[0])
                if by_seed and not split:
                    auditable |= 1 << unit
                if drawn or split:
                    set_aside.append((unit, not split, values, unrevealed))
            if not matches:
                return Expected("RoundHashMismatch", (order_id, round_)), []
            if auditable and (roster.pending_records or roster.verifiers) and (post or not verifiers):
                set_aside = [entry for entry in set_aside if not auditable >> entry[0] & 1]
                record = (auditable | round_ << 176, digests_hash(digests))
            vc = self.params.verifier_collateral
            for j, (unit, drawn, _, _) in enumerate(set_aside):
                if not by_operator or not self.params.min_verifiers <= len(verifiers) <= 5:
                    return Expected("RoundUnitNeedsVerdict", (order_id, round_, unit, drawn)), []
                unit_providers = [roster.provider_of(unit * k + r) for r in range(k)]
                for i, verifier in enumerate(verifiers):
                    if verifier in unit_providers or verifier in verifiers[:i]:
                        return Expected("DuplicateParty", (verifier,)), []
                for verifier in verifiers:
                    acc = self.stake_of(verifier)
                    free = acc.bonded - acc.locked - j * vc
                    if vc > free:
                        return Expected("InsufficientFreeStake", (verifier, free, vc)), []
        elif not works and not post:
            return Expected("EmptyBatch"), []
        if post and not (roster.verifiers and (roster.pending_records or record)):
            return Expected("AuditorsMismatch", (order_id,)), []
        signer_mask = (1 << len(roster.verifiers)) - 1 if signers is None else signers
        if post and len(bits(signer_mask)) < len(roster.verifiers) // 2 + 1:
            required = len(roster.verifiers) // 2 + 1
            return Expected("QuorumNotReached", (order_id, len(bits(signer_mask)), required)), []
        if works:
            if roster.committed == roster.rounds:
                return Expected("NoRoundToStep", (order_id, roster.committed)), []
            if now > order.deadline:
                return Expected("OrderExpired", (order_id, order.deadline)), []
            if now > deadline:
                return Expected("SignatureExpired", (deadline, now)), []
            if len(works) != n * k:
                return Expected("EntryCountMismatch", (n * k, len(works))), []
            # one RoundCommit per roster provider over its slots' commitments, checked in roster order
            for p, provider in enumerate(roster.providers):
                signer = next(s for (_, s), holder in zip(works, roster.slots, strict=True) if holder == p)
                if signer != provider:
                    return Expected("InvalidSigner", (provider, signer)), []
        if record is not None:
            roster.audit_records.append(record)
            roster.revealed[roster.committed - 1] = (list(roster.commitments), digests)
        if roster.pending_block:
            self._set_aside(roster, set_aside, verifiers, now)
            roster.pending_block = roster.pending_since = 0
            roster.commitments = []
        if post:
            covered = audit_chain(roster.pending_records)
            roster.audit_records.append(((1 << 255) | signer_mask << 64 | now << 72, covered))
        if works:
            roster.commitments = [c for c, _ in works]
            roster.pending_block, roster.pending_since = block, now
            roster.committed += 1
        return None, [unit for unit, _, _, _ in set_aside]

    def _set_aside(
        self,
        roster: RosterState,
        units: Sequence[tuple[int, bool, list[bytes], int]],
        verifiers: Sequence[str],
        now: int,
        commitments: Sequence[bytes] | None = None,
    ) -> None:
        """Each unit becomes an ordinary unit: Revealing, every replica committed, drawn, its verdict window
        open from now; its slots are paid by its settlement, not by the roster. `commitments`: its round's
        (the pending round's when not given)."""
        k, collateral = roster.replicas, self.params.provider_collateral
        commitments = roster.commitments if commitments is None else commitments
        uses = roster.uses
        for unit, _, values, unrevealed in units:
            replicas = []
            for r in range(k):
                slot = unit * k + r
                provider = roster.provider_of(slot)
                index = roster.slots[slot]
                revealed = not unrevealed >> r & 1
                replicas.append(Replica(provider, commitments[slot], values[r] if revealed else None))
                roster.set_aside_slots[index] = roster.set_aside_slots.get(index, 0) + 1
                roster.lock_held[provider] = uses[index] * collateral
            for verifier in verifiers:
                self.stake_of(verifier).locked += self.params.verifier_collateral
            unit_id = len(self.units) + 1
            self.units[unit_id] = Unit(
                unit_id,
                roster.order_id,
                replicas,
                list(verifiers),
                now - 1,
                now - 1,
                state=UnitState.REVEALING,
                drawn=True,
                rostered=True,
            )
            roster.set_aside_units += 1
            roster.open_set_aside += 1

    def set_aside_pending(
        self, order_id: int, count: int, verifiers: Sequence[str], caller: str, by_operator: bool, now: int
    ) -> tuple[Expected | None, list[tuple[int, int]]]:
        """JobMarketRoundAudits.setAsidePending with the roster's last `count` pending records (their true
        digests and the committed round's commitments): with `verifiers` (the operator's) their units are set
        aside as a step sets one aside, every replica revealing the record's digest; without (anyone, after
        the deadline + verdictWindow) they are dropped unpaid (their slots never paid, their budget back to
        the order). Returns the expected revert, or None and the set-aside units' (round, unit)."""
        found = self._open_roster(order_id, True)
        if isinstance(found, Expected):
            return found, []
        roster, order = found, self.orders[order_id]
        pending = roster.pending_records
        if not pending or count > len(pending):
            return Expected("AuditMismatch", (order_id, roster.committed)), []
        taken = pending[len(pending) - count :]
        units = [(info >> 176 & 0xFFFFFFFF, u) for info, _ in taken for u in bits(info & (2**64 - 1))]
        if verifiers:
            if not by_operator:
                return Expected("AccessControlUnauthorizedAccount", (caller, OPERATOR_ROLE)), []
            minimum = self.params.min_verifiers
            if not minimum <= len(verifiers) <= 5:
                return Expected("InvalidVerifierCount", (len(verifiers), minimum, 5)), []
            k, vc = roster.replicas, self.params.verifier_collateral
            for j, (_, unit) in enumerate(units):
                unit_providers = [roster.provider_of(unit * k + r) for r in range(k)]
                for i, verifier in enumerate(verifiers):
                    if verifier in unit_providers or verifier in verifiers[:i]:
                        return Expected("DuplicateParty", (verifier,)), []
                for verifier in verifiers:
                    acc = self.stake_of(verifier)
                    free = acc.bonded - acc.locked - j * vc
                    if vc > free:
                        return Expected("InsufficientFreeStake", (verifier, free, vc)), []
        elif now <= order.deadline + self.params.verdict_window:
            return Expected("RosterNotClosable", (order_id, order.deadline + self.params.verdict_window)), []
        del roster.audit_records[len(roster.audit_records) - count :]
        for round_, unit in units:
            if verifiers:
                commitments, digests = roster.revealed[round_]
                values = [digests[unit]] * roster.replicas
                self._set_aside(roster, [(unit, True, values, 0)], verifiers, now, commitments)
                continue
            for r in range(roster.replicas):
                index = roster.slots[unit * roster.replicas + r]
                roster.set_aside_slots[index] = roster.set_aside_slots.get(index, 0) + 1
                roster.dropped_slots[index] = roster.dropped_slots.get(index, 0) + 1
            roster.set_aside_units += 1
            order.balance += order.cost_of(roster.replicas)
            order.open_units -= 1
        return None, units if verifiers else []

    def challenge_audit(
        self,
        order_id: int,
        index: int,
        end: int,
        unit: int,
        verifiers: Sequence[str],
        caller: str,
        by_operator: bool,
        now: int,
    ) -> tuple[Expected | None, int | None]:
        """JobMarketRoundAudits.challengeAudit (operator) of unit `unit` of the round record
        `audit_records[index]`, the call carrying the roster's records up to `end` (exclusive; a posting's
        record is the last): the unit is set aside with `verifiers` (none of whom signed the posting that
        covered it) as a step sets one aside, every replica revealing the record's digest, its record marks
        it challenged (the close neither pays its slots nor counts it to the posting's signers), and the
        posting's signers are kept for slashRoundAudit. Returns the expected revert, or None and the unit
        id."""
        if not by_operator:
            return Expected("AccessControlUnauthorizedAccount", (caller, OPERATOR_ROLE)), None
        found = self._open_roster(order_id, True)
        if isinstance(found, Expected):
            return found, None
        roster = found
        if index >= end:
            return Expected("AuditMismatch", (order_id, 0)), None
        info, digests_of_round = roster.audit_records[index]
        round_ = info >> 176 & 0xFFFFFFFF
        if info >> 255:
            return Expected("AuditMismatch", (order_id, round_)), None
        posting = next(info for info, _ in roster.audit_records[index:end] if info >> 255)
        until = (posting >> 72 & (2**40 - 1)) + self.params.verdict_window
        if now > until:
            return Expected("AuditChallengeClosed", (order_id, round_, until)), None
        if not info >> unit & 1 or info >> (112 + unit) & 1:
            return Expected("NotAudited", (order_id, round_, unit)), None
        minimum = self.params.min_verifiers
        if not minimum <= len(verifiers) <= 5:
            return Expected("InvalidVerifierCount", (len(verifiers), minimum, 5)), None
        signers = [roster.verifiers[i] for i in bits(posting >> 64 & 0xFF) if i < len(roster.verifiers)]
        for signer in signers:
            if signer in verifiers:
                return Expected("DuplicateParty", (signer,)), None
        k = roster.replicas
        unit_providers = [roster.provider_of(unit * k + r) for r in range(k)]
        for i, verifier in enumerate(verifiers):
            if verifier in unit_providers or verifier in verifiers[:i]:
                return Expected("DuplicateParty", (verifier,)), None
        vc = self.params.verifier_collateral
        for verifier in verifiers:
            acc = self.stake_of(verifier)
            if vc > acc.bonded - acc.locked:
                return Expected("InsufficientFreeStake", (verifier, acc.bonded - acc.locked, vc)), None
        commitments, digests = roster.revealed[round_]
        unit_id = len(self.units) + 1
        self._set_aside(roster, [(unit, True, [digests[unit]] * k, 0)], verifiers, now, commitments)
        self.units[unit_id].audit_signers = tuple(signers)
        roster.audit_records[index] = (info | 1 << (112 + unit), digests_of_round)
        return None, unit_id

    def truth_of(self, unit_id: int, now: int) -> bytes | Expected:
        """VerdictAppeals.truthOf: a decided appeal's outcomes, else the verdict once nobody can appeal it."""
        appeal = self.appeals.get(unit_id)
        state = self.appeal_state(unit_id)
        if appeal is not None and state in (AppealState.CONFIRMED, AppealState.OVERTURNED):
            return outcomes_hash(appeal.decided or ())
        if state == AppealState.LAPSED:
            return Expected("AppealLapsed", (unit_id,))
        if state == AppealState.PENDING:
            return Expected("TruthNotFixed", (unit_id,))
        unit = self.units.get(unit_id)
        if unit is None or unit.state != UnitState.VERDICTED:
            return Expected("NoVerdict", (unit_id,))
        if now <= self.appeal_closes(unit):
            return Expected("TruthNotFixed", (unit_id,))
        return self.verdict_hash(unit_id)

    def slash_round_audit(self, unit_id: int, truth: Sequence[int], caller: str, now: int) -> Expected | None:
        """VerdictAppeals.slashRoundAudit (anyone): once the unit's truth is fixed and calls a replica fraud,
        each signer of the challenged round audit that paid it loses `verifierSlash` (after JobMarket's
        releaseAuditSigners freed its roster collateral while the roster is open): the bounty to the caller,
        the rest to the buyer; once per signer and unit."""
        truth_hash = self.truth_of(unit_id, now)
        if isinstance(truth_hash, Expected):
            return truth_hash
        if outcomes_hash(truth) != truth_hash:
            return Expected("OutcomesMismatch", (unit_id, truth_hash, outcomes_hash(truth)))
        if FRAUD not in truth:
            return Expected("AuditNotContradicted", (unit_id,))
        unit = self.units[unit_id]
        if not unit.audit_signers or unit.audit_slashed:
            return Expected("VerifierAlreadySlashed", (unit_id, "0x" + "00" * 20))
        self.release_audit_signers(unit)
        unit.audit_slashed = True
        va = self.token_holder_va
        slashed = sum(self.slash(s, self.appeal_params.verifier_slash, va) for s in unit.audit_signers)
        bounty = slashed * self.appeal_params.bounty_bps // BPS
        if bounty:
            self._move(va, caller, bounty)
        if slashed != bounty:
            self._move(va, self.orders[unit.order_id].buyer, slashed - bounty)
        return None

    def release_audit_signers(self, unit: Unit) -> None:
        """JobMarketRoundAudits.releaseAuditSigners: each signer's roster collateral, once per roster
        verifier, while the roster is open."""
        roster = self.rosters[unit.order_id]
        if not unit.audit_signers or roster.closed:
            return
        mask = sum(1 << roster.verifiers.index(s) for s in unit.audit_signers)
        fresh = mask & ~roster.audit_released
        roster.audit_released |= fresh
        for i in bits(fresh):
            self._unlock(roster.verifiers[i], self.params.verifier_collateral)

    def publish_opening(
        self,
        order_id: int,
        key_ok: bool,
        slot: int,
        digest: bytes,
        salt: bytes,
        commitments: Sequence[bytes],
    ) -> Expected | None:
        """JobMarketRounds.publishOpening (permissionless): one slot's opening of the pending round."""
        found = self._open_roster(order_id, key_ok)
        if isinstance(found, Expected):
            return found
        roster = found
        if not roster.pending_block:
            return Expected("NoRoundToStep", (order_id, roster.committed))
        n = roster.units_per_round * roster.replicas
        if len(commitments) != n:
            return Expected("EntryCountMismatch", (n, len(commitments)))
        if slot >= n:
            return Expected("InvalidLayout", (slot,))
        round_ = roster.committed - 1
        if list(commitments) != roster.commitments:
            return Expected("RoundHashMismatch", (order_id, round_))
        provider = roster.provider_of(slot)
        unit_id = round_unit_id(order_id, round_, slot // roster.replicas)
        if commitment(digest, salt, provider, unit_id) != commitments[slot]:
            return Expected("RevealMismatch", (unit_id, provider))
        self.published[(order_id, round_, slot)] = digest
        return None

    def close_roster(self, order_id: int, key_ok: bool, now: int) -> Expected | None:
        """JobMarketRounds.closeRoster (anyone): pays every slot of every revealed round but set-aside
        units', counts them valid (a streak only for a provider with no fault or fraud since the roster
        opened), releases the roster's collateral not released before slashes, returns the rest; then pays
        each provider and roster verifier its whole credit."""
        found = self._open_roster(order_id, key_ok)
        if isinstance(found, Expected):
            return found
        roster, order = found, self.orders[order_id]
        if roster.committed != roster.rounds or roster.pending_block:
            closable = order.deadline
            if roster.pending_block:
                closable = max(closable, roster.pending_since + self.params.reveal_window)
            if now <= closable:
                return Expected("RosterNotClosable", (order_id, closable))
        if roster.pending_records:
            return Expected("AuditsPending", (order_id,))
        if roster.last_posting_time and now <= roster.last_posting_time + self.params.verdict_window:
            return Expected(
                "RosterNotClosable", (order_id, roster.last_posting_time + self.params.verdict_window)
            )
        if roster.open_set_aside:
            return Expected("UnitsStillOpen", (order_id, roster.open_set_aside))
        audit_fees = 0
        if roster.verifiers:  # each signer: fee / verifiers per unit its postings covered
            share, units_since = order.fee // len(roster.verifiers), 0
            for info, _ in roster.audit_records:
                if not info >> 255:
                    units_since += len(bits(info & (2**64 - 1) & ~(info >> 112)))  # challenged: not
                    continue
                for i, verifier in enumerate(roster.verifiers):
                    if info >> (64 + i) & 1 and units_since * share:
                        self._credit(verifier, units_since * share)
                        audit_fees += units_since * share
                units_since = 0
            for i, verifier in enumerate(roster.verifiers):  # but those a slashRoundAudit released
                if not roster.audit_released >> i & 1:
                    self._unlock(verifier, self.params.verifier_collateral)
        settled = roster.settled_rounds
        paid = 0
        for p, (provider, uses) in enumerate(zip(roster.providers, roster.uses, strict=True)):
            count = uses * settled - roster.set_aside_slots.get(p, 0)
            if count:
                self._credit(provider, count * order.price)
                rep = self.rep(provider)
                rep.valid += count
                if (rep.fault + rep.fraud) & 0xFF == roster.fault_marks[p]:
                    rep.consecutive += count
                paid += count * order.price
            release = uses * self.params.provider_collateral - roster.lock_released.get(provider, 0)
            self._unlock(provider, release)
        units = roster.units - roster.set_aside_units
        order.balance += units * order.cost_of(roster.replicas) - paid - audit_fees
        order.delivered += roster.units_per_round * settled - roster.set_aside_units
        order.open_units -= units
        roster.closed = True
        for party in [*roster.providers, *roster.verifiers]:  # paid at close: nothing left to withdraw
            self._pay_credit(party)
        return None

    # ---- VerdictAppeals ----

    def verdict_hash(self, unit_id: int) -> bytes:
        """JobMarket.verdictHashOf."""
        unit = self.units.get(unit_id)
        return outcomes_hash(unit.verdict) if unit is not None and unit.verdict is not None else NO_HASH

    def appeal_state(self, unit_id: int) -> AppealState:
        appeal = self.appeals.get(unit_id)
        return AppealState.NONE if appeal is None else appeal.state

    def appeal_closes(self, unit: Unit) -> int:
        """The last instant an appeal of `unit` may be filed (its verdict deadline + the appeal window)."""
        return unit.reveal_deadline + self.params.verdict_window + self.appeal_params.appeal_window

    def hold_ends(self, unit: Unit) -> int:
        """The last instant settleVerdict refuses an unappealed hold: the appeal window from the verdict."""
        return (unit.held_since if unit.held else 0) + self.appeal_params.appeal_window

    def _pending(self, unit_id: int) -> Appeal | Expected:
        appeal = self.appeals.get(unit_id)
        if appeal is None or appeal.state != AppealState.PENDING:
            return Expected("NoPendingAppeal", (unit_id,))
        return appeal

    def join_pool(self, account: str) -> Expected | None:
        if account in self.entry_of:
            return Expected("AlreadyInPool", (account,))
        error = self._lock(account, self.appeal_params.referee_stake)
        if error:
            return error
        self.pool.append([account, 0])
        self.entry_of[account] = len(self.pool)
        return None

    def leave_pool(self, account: str) -> Expected | None:
        entry = self.entry_of.pop(account, 0)
        if not entry:
            return Expected("NotInPool", (account,))
        self.pool[entry - 1][1] = self.pending_block()
        self._unlock(account, self.appeal_params.referee_stake)
        return None

    def appeal(self, unit_id: int, appellant: str, now: int) -> Expected | None:
        unit = self.units.get(unit_id)
        if unit is None or unit.state != UnitState.VERDICTED:
            return Expected("NoVerdict", (unit_id,))
        closes = self.appeal_closes(unit)
        if now > closes:
            return Expected("AppealWindowClosed", (unit_id, closes))
        if unit_id in self.appeals:
            return Expected("AlreadyAppealed", (unit_id,))
        error = self._lock(appellant, self.appeal_params.appeal_bond)
        if error:
            return error
        vote_deadline = now + self.appeal_params.vote_window
        self.appeals[unit_id] = Appeal(appellant, vote_deadline, self.pending_block(), len(self.pool))
        return None

    def draw_panel(self, unit_id: int, now: int) -> Expected | None:
        appeal = self._pending(unit_id)
        if isinstance(appeal, Expected):
            return appeal
        if appeal.panel:
            return Expected("PanelAlreadyDrawn", (unit_id,))
        if now > appeal.vote_deadline:
            return Expected("VoteWindowClosed", (unit_id, appeal.vote_deadline))
        block = self.pending_block()
        if block <= appeal.seed_block:
            return Expected("DrawTooEarly", (unit_id, appeal.seed_block))
        if block - appeal.seed_block > 256:  # the seed's hash is gone: re-seed from this block
            appeal.seed_block, appeal.pool_size = block, len(self.pool)
            return None
        seed = self.block_hash(appeal.seed_block)
        unit = self.units[unit_id]
        excluded = [r.provider for r in unit.replicas] + unit.verifiers + [appeal.appellant]
        size, seats = appeal.pool_size, self.appeal_params.panel_size
        panel: list[str] = []
        for attempt in range(seats * DRAW_TRIES_PER_SEAT if size else 0):
            if len(panel) == seats:
                break
            word = keccak(seed + unit_id.to_bytes(32, "big") + attempt.to_bytes(32, "big"))
            referee, left = self.pool[int.from_bytes(word, "big") % size]
            if (left and left <= appeal.seed_block) or referee in excluded or referee in panel:
                continue
            panel.append(referee)
        if len(panel) < seats:
            return Expected("PanelUndrawable", (unit_id, len(panel)))
        appeal.panel, appeal.votes = panel, [None] * seats
        return None

    def vote(self, unit_id: int, outcomes: Sequence[int], referee: str, now: int) -> Expected | None:
        appeal = self._pending(unit_id)
        if isinstance(appeal, Expected):
            return appeal
        if not appeal.panel:
            return Expected("PanelNotDrawn", (unit_id,))
        if now > appeal.vote_deadline:
            return Expected("VoteWindowClosed", (unit_id, appeal.vote_deadline))
        if appeal.decided is not None:
            return Expected("AlreadyDecided", (unit_id,))
        if referee not in appeal.panel:
            return Expected("NotOnPanel", (unit_id, referee))
        seat = appeal.panel.index(referee)
        if appeal.votes[seat] is not None:
            return Expected("AlreadyVoted", (unit_id, referee))
        unit = self.units[unit_id]
        if len(outcomes) != len(unit.replicas):
            return Expected("OutcomeCountMismatch", (len(unit.replicas), len(outcomes)))
        for i, outcome in enumerate(outcomes):
            if outcome > FRAUD or (outcome != FAULT and unit.replicas[i].digest is None):
                return Expected("InvalidOutcome", (i, outcome))
        voted = outcomes_hash(outcomes)
        appeal.votes[seat] = voted
        if appeal.votes.count(voted) == len(appeal.panel) // 2 + 1:
            appeal.decided = tuple(outcomes)
        return None

    def resolve(self, unit_id: int, verdict: Sequence[int], decided: Sequence[int]) -> Expected | None:
        appeal = self._pending(unit_id)
        if isinstance(appeal, Expected):
            return appeal
        if appeal.decided is None:
            return Expected("NotDecided", (unit_id,))
        decided_hash = outcomes_hash(appeal.decided)
        if outcomes_hash(decided) != decided_hash:
            return Expected("OutcomesMismatch", (unit_id, decided_hash, outcomes_hash(decided)))
        verdict_hash = self.verdict_hash(unit_id)
        if outcomes_hash(verdict) != verdict_hash:
            return Expected("OutcomesMismatch", (unit_id, verdict_hash, outcomes_hash(verdict)))
        winners = [r for r, v in zip(appeal.panel, appeal.votes, strict=True) if v == decided_hash]
        bond, va = self.appeal_params.appeal_bond, self.token_holder_va
        self._unlock(appeal.appellant, bond)
        unit = self.units[unit_id]
        buyer = self.orders[unit.order_id].buyer
        if decided_hash == verdict_hash:  # confirmed: the bond to the referees who voted it
            appeal.state = AppealState.CONFIRMED
            self.settle_held(unit_id, verdict, decided, va)
            self._pay(winners, self.slash(appeal.appellant, bond, va), buyer)
        else:  # overturned: settleHeld slashes the fraud (held or missed) to us; a bounty to the deciders
            appeal.state = AppealState.OVERTURNED
            slashed = self.settle_held(unit_id, verdict, decided, va)
            bounty = slashed * self.appeal_params.bounty_bps // BPS
            self._pay(winners, bounty, buyer)
            if slashed != bounty:
                self._move(va, buyer, slashed - bounty)
        return None

    def _pay(self, referees: Sequence[str], amount: int, buyer: str) -> None:
        """VerdictAppeals._pay: `amount` (held by it) split among `referees`, the dust to `buyer`."""
        share = amount // len(referees)
        for referee in referees:
            if share:
                self._move(self.token_holder_va, referee, share)
        if amount - share * len(referees):
            self._move(self.token_holder_va, buyer, amount - share * len(referees))

    def settle_verdict(self, unit_id: int, verdict: Sequence[int], now: int) -> Expected | None:
        """VerdictAppeals.settleVerdict: settles the held replicas by the verdict once nobody appealed
        within the appeal window from the verdict, or the appeal lapsed."""
        expected = self.verdict_hash(unit_id)
        if outcomes_hash(verdict) != expected:
            return Expected("OutcomesMismatch", (unit_id, expected, outcomes_hash(verdict)))
        state = self.appeal_state(unit_id)
        if state == AppealState.PENDING:
            return Expected("TruthNotFixed", (unit_id,))
        if state in (AppealState.CONFIRMED, AppealState.OVERTURNED):
            return None  # resolve settled them
        if state == AppealState.NONE and now <= self.hold_ends(self.units[unit_id]):
            return Expected("TruthNotFixed", (unit_id,))
        self.settle_held(unit_id, verdict, verdict, self.token_holder_va)
        return None

    def lapse(self, unit_id: int, now: int) -> Expected | None:
        appeal = self._pending(unit_id)
        if isinstance(appeal, Expected):
            return appeal
        if appeal.decided is not None or now <= appeal.vote_deadline:
            return Expected("AppealNotLapsed", (unit_id, appeal.vote_deadline))
        appeal.state = AppealState.LAPSED
        self._unlock(appeal.appellant, self.appeal_params.appeal_bond)
        return None

    # ---- credits ----

    def withdraw_credit(self, account: str) -> Expected | None:
        amount = self.credits.get(account, 0)
        if amount == 0:
            return Expected("NothingToWithdraw", (account,))
        self.credits[account] = 0
        self._move(self.token_holder_jm, account, amount)
        return None
