"""The market's small interfaces to the outside: the chain it settles on and the recipe registry.

The service and the Celery tasks talk only to these Protocols, so the same code runs against the
in-process EVM in tests, a hardhat node in the demo and any JSON-RPC node in production; adapters live
next to the client they wrap (:mod:`market.chain_adapter` for :mod:`veritrain.chain`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from market.domain.pricing import EscrowPlan
from market.domain.replication import Reputation

if TYPE_CHECKING:
    from veritrain.chain.client import AuditRecord, Roster


@dataclass(frozen=True, slots=True)
class ChainOrder:
    """An order as the JobMarket holds it (what the buyer escrowed)."""

    order_id: int
    buyer: str
    spec_hash: str
    units: int
    replicas: int  # the most per unit
    price_per_replica: int
    verifier_fee_per_unit: int
    deadline: int
    min_replicas: int  # = replicas for a fixed order
    trusted_streak: int  # consecutive valid units for a unit below `replicas` (0 for a fixed order)
    posted_block: int = 0  # the block of its OrderPosted event, which seeds its first draw (0: unknown)


@dataclass(frozen=True, slots=True)
class MarketTerms:
    """JobMarket parameters the market schedules by (seconds, counts, token base units)."""

    commit_window_s: int
    reveal_window_s: int
    verdict_window_s: int
    min_verifiers: int
    provider_collateral: int
    verifier_collateral: int = 0


@dataclass(frozen=True, slots=True)
class SignedAccept:
    """A provider's Accept signature with the nonce and deadline it signed."""

    provider: str
    nonce: int
    deadline: int
    signature: str


@dataclass(frozen=True, slots=True)
class SignedAudit:
    """A roster verifier's `RoundAudit(orderId, records)` signature (65 bytes, hex); `verifier` is its index
    among the roster's verifiers."""

    verifier: int
    signature: str


@dataclass(frozen=True, slots=True)
class SignedCommit:
    """A provider's UnitCommit signature (no nonce: a provider commits once per unit), for commitBatch."""

    provider: str
    commitment: str
    deadline: int
    signature: str


@dataclass(frozen=True, slots=True)
class SignedRoundWork:
    """A round's work for stepRound: every slot's commitment (slot order) and each roster provider's
    `RoundCommit` signature over its own slots' commitments (65 bytes, hex; roster provider order)."""

    commitments: tuple[str, ...]
    signatures: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RevealForm:
    """A replica's reveal for revealBatch: its commitment's preimage (the salt is the authorization)."""

    provider: str
    result_digest: str
    salt: str


@dataclass(frozen=True, slots=True)
class SignedVerdict:
    """A verifier's outcome-only Verdict signature (no nonce: the unit's settlement makes it single-use)."""

    verifier: str
    deadline: int
    signature: str


@dataclass(frozen=True, slots=True)
class ChainEvent:
    """A decoded JobMarket event; ``(block_number, log_index)`` orders and identifies it."""

    block_number: int
    log_index: int
    name: str
    args: dict[str, Any] = field(default_factory=dict)


class SettlementPort(Protocol):
    """What the market needs from the chain. Write methods return a transaction hash (``assign``: the new
    unit's id); a revert raises a :class:`veritrain.chain.errors.ContractReverted` subclass."""

    chain_id: int
    job_market_address: str

    def get_order(self, order_id: int) -> ChainOrder | None: ...
    def free_stake(self, account: str) -> int: ...
    def bonded_stake(self, account: str) -> int:
        """The account's bonded stake in the StakeManager (locked collateral included): its draw weight."""
        ...

    def last_staked_block(self, account: str) -> int:
        """The block of the account's latest `Staked` event (0: never staked). A draw seeded by block B
        counts only accounts below B: a stake raised once B's hash was public cannot buy a better key."""
        ...

    def reputation_of(self, account: str) -> Reputation: ...
    def terms(self) -> MarketTerms: ...
    def assign(
        self,
        order_id: int,
        unit_key: str,
        providers: Sequence[str],
        verifiers: Sequence[str],
        accepts: Sequence[SignedAccept],
    ) -> int: ...
    def commit_batch(self, unit_id: int, commits: Sequence[SignedCommit]) -> str:
        """Relay several replicas' signed commits for one unit in one transaction; one bad entry reverts
        all of them."""
        ...

    def reveal_batch(self, unit_id: int, reveals: Sequence[RevealForm]) -> tuple[bool, str]:
        """Reveal several replicas of one unit in one transaction: (finalized, transaction hash). When
        that completes a unanimous unit the chain did not draw, the same transaction finalizes it."""
        ...

    def finalize(self, unit_id: int) -> str: ...
    def request_verification(self, unit_id: int) -> str:
        """Draw an open unit for verification (operator only): it then settles by verdict or expiry only.
        A unit the chain drew already is left alone (result ""): an operator's second VerificationRequested
        would set a planted cheat's unit apart from any other unit of a provider on probation."""
        ...

    def submit_verdict(
        self, unit_id: int, outcomes: Sequence[int], verdicts: Sequence[SignedVerdict]
    ) -> str: ...
    def expire_unit(self, unit_id: int) -> str: ...
    def slash_contradicting_verifier(
        self, unit_id: int, outcomes: Sequence[int], evidence: SignedVerdict
    ) -> str:
        """Relay a verifier's own Verdict signature over ``outcomes`` that contradict the unit's truth (the
        verdict once its appeal window passed unappealed, or the appeal panel's decision): the chain slashes
        the verifier once per unit and pays the sender the bounty. ``TruthNotFixed`` until then."""
        ...

    def settle_verdict(self, unit_id: int, verdict: Sequence[int]) -> str:
        """Settle the replicas the unit's verdict (``verdict``: its outcomes) called fraud, which the chain
        holds (collateral locked, not slashed) so that an appeal could still clear them: once the verdict is
        the unit's truth the chain slashes them and pays the verdict's signers the bounty (``HeldSettled``).
        ``TruthNotFixed`` until then; a no-op once they were settled (by anyone, or by an appeal)."""
        ...

    def unit_state(self, unit_id: int) -> str:
        """The unit's state on chain, lower case: none, committing, revealing, finalized, verdicted,
        expired (what the market re-reads after a revert)."""
        ...

    def block_number(self) -> int: ...
    def block_hash(self, block_number: int) -> str: ...
    def tx_block(self, tx_hash: str) -> int:
        """The block that included the transaction ``tx_hash`` (one this port sent and returned)."""
        ...

    def events(self, from_block: int, to_block: int) -> list[ChainEvent]: ...


@dataclass(frozen=True, slots=True)
class RosterChainState:
    """A roster as the JobMarket holds it (`getRoster`); `key` is zero when the order has none."""

    key: str
    committed: int  # rounds committed; all but a pending one are revealed
    pending_block: int  # the block that committed the round awaiting its reveal (0: none)
    closed: bool
    open_set_aside: int  # set-aside units not settled yet: the roster cannot close while any is
    required_streak: int  # a provider below it has each of its units set aside
    pending_since: int = 0  # that commit's time: after it plus revealWindow a silent slot may be withheld
    set_aside_units: int = 0  # units its steps set aside so far
    audits_pending: bool = False  # round audit records no posting covers yet: the roster cannot close

    @property
    def exists(self) -> bool:
        return int(self.key, 16) != 0


@runtime_checkable
class RosterPort(Protocol):
    """What the round path (market/rosters.py, market/roster_outbox.py) needs from the chain besides the
    SettlementPort: the roster transactions (each returns its transaction hash; a revert raises a
    ContractReverted subclass) and the reads that make them safe to retry."""

    def roster_state(self, order_id: int) -> RosterChainState: ...
    def open_roster(self, order_id: int, roster: Roster, accepts: Sequence[SignedAccept]) -> str: ...
    def step_round(
        self,
        order_id: int,
        roster: Roster,
        openings: Sequence[RevealForm],
        deadline: int,
        work: SignedRoundWork | None,
        verifiers: Sequence[str],
        withheld: int = 0,
        audits: Sequence[SignedAudit] = (),
    ) -> str:
        """Reveal the pending round (`openings` in slot order; none when nothing is pending) and commit the
        next (`work`; None for the last step or a held round's reveal), setting aside with
        `verifiers`. Bit i of `withheld`: slot i did not open (its opening's `result_digest` carries its
        commitment; only after the round's reveal window). The roster's pending audit chain is the chain's
        (read from its events); `audits`, when given, post it: a quorum of the roster's verifiers over the
        pending chain once this step's own round record is added."""
        ...

    def pending_audits(self, order_id: int) -> str:
        """The roster's pending audit chain (`RoundAudit.pending`; zero: none), from the chain's events."""
        ...

    def audit_records(self, order_id: int) -> list[AuditRecord]:
        """The roster's audit records in chain order (round records, postings), from the chain's events."""
        ...

    def set_aside_pending(self, order_id: int, roster: Roster, count: int, verifiers: Sequence[str]) -> str:
        """Take the roster's last `count` pending round records off its pending chain (`setAsidePending`):
        with `verifiers` (the operator) their units are set aside for verdicts; without (anyone, after the
        order's deadline + verdictWindow) they are dropped unpaid."""
        ...

    def close_roster(self, order_id: int, roster: Roster) -> str:
        """Close the roster (its verifiers' fees counted from the chain's audit records)."""
        ...

    def spot_check_ppm(self, replicas: int) -> int:
        """The chain's draw rate for a unit of `replicas` replicas (the solo rate for one)."""
        ...


class CanaryAccount(Protocol):
    """The operator-funded account that buys canary orders (market/canary.py): an ordinary buyer on chain."""

    address: str

    def posted_order(self, spec_hash: str) -> int | None:
        """The chain order this account posted for ``spec_hash``, if any (a retried post finds its own)."""
        ...

    def post_order(self, spec_hash: str, plan: EscrowPlan, deadline: int) -> int:
        """Approve the escrow and post the order (adaptive when the plan is); returns the chain order id."""
        ...

    def close_order(self, order_id: int) -> None:
        """Close the account's order (the close pays the account its unspent escrow); nothing if closed."""
        ...


@dataclass(frozen=True, slots=True)
class RecipeInfo:
    """What matching and pricing need from a recipe."""

    name: str
    flops_per_step: int
    min_memory_mb: int


class RecipeCatalog(Protocol):
    def lookup(self, name: str) -> RecipeInfo:
        """The recipe's needs; raises :class:`veritrain.errors.UnknownRecipe` for a name not registered."""
        ...


class RegistryRecipeCatalog:
    """Recipes from :mod:`veritrain.recipes` (parameter count is computed by building the model once)."""

    def lookup(self, name: str) -> RecipeInfo:
        return _registry_recipe(name)


BYTES_PER_PARAMETER_TRAINING = 16  # fp32 weights + gradients + two AdamW moments
RUNTIME_OVERHEAD_MB = 256


@lru_cache(maxsize=64)
def _registry_recipe(name: str) -> RecipeInfo:
    from veritrain.recipes import get_recipe

    recipe = get_recipe(name)
    params = recipe.param_count()
    memory_mb = -(-params * BYTES_PER_PARAMETER_TRAINING // 2**20) + RUNTIME_OVERHEAD_MB
    return RecipeInfo(name=name, flops_per_step=recipe.flops_per_step(), min_memory_mb=memory_mb)
