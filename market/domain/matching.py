"""The matching engine: which providers run the replicas of a unit, and why every other one did not.

Hard constraints (a candidate failing one is declined with a :class:`DeclineReason`): online with spare
capacity, supports the recipe, enough memory, measured speed fast enough for the unit's time budget,
free stake ≥ the collateral, a live offer at or under the order's max price per PFLOP, an operator
not already running another replica of the same unit (replicas must be independent), and stake that did
not grow after the unit's seed block.

Order: candidates are drawn by bonded stake from the unit's public seed (:mod:`market.domain.selection`),
never ranked by the market, so the operator cannot steer who runs a unit and a party's share of replicas
follows its share of stake however many keys it splits it over. A :class:`CandidatePool` keeps each
recipe's available providers, and a match walks them in draw order until it has its k replicas. Replicas
of one unit prefer the hardware class of the first one drawn (bitwise-equal results take the fast path);
other classes fill in, in draw order, only when that class cannot provide k distinct operators.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

import numpy as np
import numpy.typing as npt

from market.domain.replication import (
    DEFAULT_POLICY,
    NO_REPUTATION,
    ReplicationPolicy,
    Reputation,
    replication_factor,
)
from market.domain.selection import (
    ROLE_REPLICAS,
    Hashes,
    candidate_hashes,
    draw_keys,
    draw_order,
    unit_tweak,
)

HASHED_BLOCKS = 8  # seed blocks whose candidate hashes a recipe's slots keep


class DeclineReason(StrEnum):
    OFFLINE = "offline"
    AT_CAPACITY = "at_capacity"
    EXCLUDED = "excluded"  # already on this unit, or dropped from it before
    FRAUD_RECORD = "fraud_record"  # fraud confirmed by re-execution and slashed on chain
    RECIPE_UNSUPPORTED = "recipe_unsupported"
    INSUFFICIENT_MEMORY = "insufficient_memory"
    TOO_SLOW = "too_slow"
    INSUFFICIENT_FREE_STAKE = "insufficient_free_stake"
    NO_OFFER = "no_offer"
    PRICE_ABOVE_MAX = "price_above_max"
    OPERATOR_ALREADY_ON_UNIT = "operator_already_on_unit"
    OTHER_HARDWARE_CLASS = "other_hardware_class"
    STAKED_AFTER_SEED = "staked_after_seed"  # its stake grew after the seed block, whose hash was public


@dataclass(frozen=True, slots=True)
class ProviderCandidate:
    address: str
    operator: str
    memory_mb: int
    gflops: int
    hardware_class: str
    recipes: frozenset[str]
    free_stake: int
    price_per_pflop: int | None  # None: no live offer
    reputation: Reputation = NO_REPUTATION
    online: bool = True
    active_units: int = 0
    capacity: int = 1
    bonded_stake: int = 0  # the draw weight (free stake only gates the collateral)
    stake_block: int = 0  # the block of its latest `Staked` event (0: none known)


@dataclass(frozen=True, slots=True)
class UnitDemand:
    """What one unit needs; ``needed`` replicas are still to be chosen (fewer when refilling)."""

    unit_id: int
    recipe: str
    min_memory_mb: int
    unit_flops: int
    time_budget_s: int
    max_price_per_pflop: int
    collateral: int
    needed: int
    adaptive: bool = False
    excluded: frozenset[str] = frozenset()
    taken_operators: frozenset[str] = frozenset()
    seed_block: int = 0  # the block whose hash seeds the draw (0: none, no chain): stake after it is late

    @property
    def min_gflops(self) -> int:
        """Measured speed a provider needs to finish the unit inside its time budget (rounded up)."""
        return -(-self.unit_flops // (max(self.time_budget_s, 1) * 10**9))


@dataclass(frozen=True, slots=True)
class Match:
    unit_id: int
    selected: tuple[str, ...]
    k: int
    declines: tuple[tuple[str, DeclineReason], ...]

    @property
    def complete(self) -> bool:
        return len(self.selected) == self.k


def decline_reason(
    candidate: ProviderCandidate, demand: UnitDemand, operators: set[str]
) -> DeclineReason | None:
    """The first hard constraint ``candidate`` fails for ``demand``, or None if it is eligible."""
    if not candidate.online:
        return DeclineReason.OFFLINE
    if candidate.active_units >= candidate.capacity:
        return DeclineReason.AT_CAPACITY
    if candidate.address in demand.excluded:
        return DeclineReason.EXCLUDED
    if demand.seed_block and candidate.stake_block > demand.seed_block:
        # a key whose stake grew once the seed's hash could be known may have been ground or topped up for
        # it (selection.py): it waits for a draw seeded later
        return DeclineReason.STAKED_AFTER_SEED
    if candidate.reputation.fraud > 0:
        # A fraud verdict is never a distance alone: re-execution confirmed it. Buyers' work does not go
        # back to a proven cheat; slashing alone leaves it enough stake to keep undercutting honest peers.
        return DeclineReason.FRAUD_RECORD
    if demand.recipe not in candidate.recipes:
        return DeclineReason.RECIPE_UNSUPPORTED
    if candidate.memory_mb < demand.min_memory_mb:
        return DeclineReason.INSUFFICIENT_MEMORY
    if candidate.gflops < demand.min_gflops:
        return DeclineReason.TOO_SLOW
    if candidate.free_stake < demand.collateral:
        return DeclineReason.INSUFFICIENT_FREE_STAKE
    if candidate.price_per_pflop is None:
        return DeclineReason.NO_OFFER
    if candidate.price_per_pflop > demand.max_price_per_pflop:
        return DeclineReason.PRICE_ABOVE_MAX
    if candidate.operator in operators:
        return DeclineReason.OPERATOR_ALREADY_ON_UNIT
    return None


def match_unit(
    demand: UnitDemand, drawn: Iterable[ProviderCandidate], policy: ReplicationPolicy = DEFAULT_POLICY
) -> Match:
    """Choose replicas for ``demand`` from candidates in draw order; record a reason for each decline.

    With ``adaptive`` the first eligible candidate's reputation sets k (capped by ``needed``).
    """
    k = demand.needed
    operators = set(demand.taken_operators)
    declines: list[tuple[str, DeclineReason]] = []
    chosen: list[ProviderCandidate] = []
    other_class: list[ProviderCandidate] = []
    hardware_class: str | None = None
    for candidate in drawn:
        reason = decline_reason(candidate, demand, operators)
        if reason is not None:
            declines.append((candidate.address, reason))
            continue
        if hardware_class is None:
            hardware_class = candidate.hardware_class
            if demand.adaptive:
                k = replication_factor(candidate.reputation, demand.needed, policy)
        if candidate.hardware_class != hardware_class:
            other_class.append(candidate)
            continue
        chosen.append(candidate)
        operators.add(candidate.operator)
        if len(chosen) == k:
            break
    # One class could not fill the unit: complete it with other classes in draw order, operators distinct.
    for candidate in other_class:
        if len(chosen) < k and candidate.operator not in operators:
            chosen.append(candidate)
            operators.add(candidate.operator)
        else:
            reason = DeclineReason.OPERATOR_ALREADY_ON_UNIT if candidate.operator in operators else None
            declines.append((candidate.address, reason or DeclineReason.OTHER_HARDWARE_CLASS))
    return Match(demand.unit_id, tuple(c.address for c in chosen), k, tuple(declines))


def match_plant(demand: UnitDemand, plants: Iterable[ProviderCandidate]) -> Match:
    """The replicas of a planted cheat's unit (market/canary.py): the operator's own plant agents, the least
    loaded first, judged like any provider but for the offer and the operator (a plant is paid nothing, and
    the draw by stake is for buyers' units, which never get a plant). So a caught plant is declined
    (``FRAUD_RECORD``) like any cheat: no buyer's unit goes to a provider with fraud on record, so a
    verifier reading that record on chain would know the plant's next unit for a plant and re-execute that
    one only; a key never caught looks like any newcomer. Each plant key is caught once."""
    declines: list[tuple[str, DeclineReason]] = []
    chosen: list[str] = []
    for plant in sorted(plants, key=lambda c: (c.active_units, c.address)):
        reason = decline_reason(replace(plant, price_per_pflop=0), demand, set())  # a plant needs no offer
        if reason is not None:
            declines.append((plant.address, reason))
        elif len(chosen) < demand.needed:
            chosen.append(plant.address)
    return Match(demand.unit_id, tuple(chosen), demand.needed, tuple(declines))


def draw(block_hash: str, seed: str, candidates: Sequence[ProviderCandidate]) -> Iterator[ProviderCandidate]:
    """``candidates`` in the replica draw order of the unit with seed ``seed``, drawn at ``block_hash``."""
    stakes = np.array([float(c.bonded_stake) for c in candidates], dtype=np.float64)
    hashes = candidate_hashes(block_hash, [c.address for c in candidates])
    keys = draw_keys(hashes, stakes, unit_tweak(seed, ROLE_REPLICAS))
    return (candidates[i] for i in draw_order(keys))


@dataclass
class _RecipeSlots:
    """One recipe's candidates as arrays (a slot per address ever listed), so a draw is a few vector
    operations; ``listed`` marks who is available now, ``hashes`` holds the candidate hashes of the seed
    blocks drawn with lately (a unit's seed block is fixed by the chain, so one pass meets a few)."""

    addresses: list[str] = field(default_factory=list)
    slot: dict[str, int] = field(default_factory=dict)
    listed: npt.NDArray[np.bool_] = field(default_factory=lambda: np.zeros(16, dtype=np.bool_))
    stakes: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros(16, dtype=np.float64))
    hashes: dict[str, Hashes] = field(default_factory=dict)  # least recently used first

    def put(self, address: str, stake: int) -> None:
        i = self.slot.get(address)
        if i is None:
            i = len(self.addresses)
            self.addresses.append(address)
            self.slot[address] = i
            if i == len(self.listed):  # double the capacity
                self.listed = np.concatenate([self.listed, np.zeros_like(self.listed)])
                self.stakes = np.concatenate([self.stakes, np.zeros_like(self.stakes)])
        self.listed[i] = True
        self.stakes[i] = float(stake)

    def _hashes(self, block_hash: str) -> Hashes:
        """Every slot's candidate hash for ``block_hash`` (computed for slots new since the last use)."""
        n = len(self.addresses)
        known = self.hashes.pop(block_hash, np.zeros(0, dtype=np.uint64))
        if len(known) < n:
            known = np.concatenate([known, candidate_hashes(block_hash, self.addresses[len(known) : n])])
        self.hashes[block_hash] = known
        while len(self.hashes) > HASHED_BLOCKS:
            del self.hashes[next(iter(self.hashes))]
        return known

    def unlist(self, address: str) -> None:
        i = self.slot.get(address)
        if i is not None:
            self.listed[i] = False

    def positions(self) -> npt.NDArray[np.intp]:
        return np.flatnonzero(self.listed[: len(self.addresses)])

    def order(self, block_hash: str, seed: str) -> Iterator[str]:
        """Listed addresses in the unit's replica draw order."""
        n = len(self.addresses)
        keys = draw_keys(self._hashes(block_hash), self.stakes[:n], unit_tweak(seed, ROLE_REPLICAS))
        return (self.addresses[i] for i in draw_order(keys, self.positions()))


@dataclass
class CandidatePool:
    """In-memory index of providers with spare capacity, listed per recipe.

    The market refreshes it from the store (agents registered, heartbeats, offers, stake) and updates
    it as it reserves and releases providers, so a match never queries the database. Providers that no
    order could use right now (offline, at capacity, no live offer, free stake under the collateral)
    are kept out of the lists, and out of a recipe's list when their memory is under what the recipe
    needs (``recipe_memory_mb``), with the reason available from :meth:`unavailable_reason`. A match
    then draws only among candidates that might fit, instead of re-declining the same ones each time.
    """

    collateral: int = 0
    recipe_memory_mb: dict[str, int] = field(default_factory=dict)
    _by_address: dict[str, ProviderCandidate] = field(default_factory=dict)
    _listed: set[str] = field(default_factory=set)
    _by_recipe: dict[str, _RecipeSlots] = field(default_factory=dict)
    _active: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self._by_address)

    def get(self, address: str) -> ProviderCandidate | None:
        """The provider with its current load (reservations included)."""
        candidate = self._by_address.get(address)
        if candidate is None or candidate.active_units == self._active[address]:
            return candidate
        return replace(candidate, active_units=self._active[address])

    def active_units(self, address: str) -> int:
        return self._active.get(address, 0)

    def upsert(self, candidate: ProviderCandidate) -> None:
        self.remove(candidate.address)
        self._by_address[candidate.address] = candidate
        self._active[candidate.address] = candidate.active_units
        self._list(candidate)

    def remove(self, address: str) -> None:
        self._unlist(address)
        self._by_address.pop(address, None)
        self._active.pop(address, None)

    def _list(self, candidate: ProviderCandidate) -> None:
        if candidate.address in self._listed or not self._available(candidate):
            return
        self._listed.add(candidate.address)
        for recipe in candidate.recipes:
            if candidate.memory_mb >= self.recipe_memory_mb.get(recipe, 0):
                slots = self._by_recipe.setdefault(recipe, _RecipeSlots())
                slots.put(candidate.address, candidate.bonded_stake)

    def _unlist(self, address: str) -> None:
        if address not in self._listed:
            return
        self._listed.discard(address)
        for recipe in self._by_address[address].recipes:
            if recipe in self._by_recipe:
                self._by_recipe[recipe].unlist(address)

    def available(self, recipe: str) -> list[ProviderCandidate]:
        """Available candidates for ``recipe`` (a snapshot: safe to reserve while iterating)."""
        slots = self._by_recipe.get(recipe)
        if slots is None:
            return []
        return [self._by_address[slots.addresses[i]] for i in slots.positions()]

    def has_available(self, recipe: str) -> bool:
        slots = self._by_recipe.get(recipe)
        return slots is not None and bool(slots.listed.any())

    def match(
        self, demand: UnitDemand, block_hash: str, seed: str, policy: ReplicationPolicy = DEFAULT_POLICY
    ) -> Match:
        """Match ``demand`` in the draw order of ``seed`` (this pass's block ``block_hash``) and reserve
        the chosen providers."""
        slots = self._by_recipe.get(demand.recipe)
        drawn: Iterable[ProviderCandidate] = (
            () if slots is None else (self._by_address[a] for a in slots.order(block_hash, seed))
        )
        result = match_unit(demand, drawn, policy)
        for address in result.selected:
            self.reserve(address)
        return result

    def reserve(self, address: str) -> None:
        """One more active unit; a provider at capacity leaves the lists until released."""
        self._active[address] += 1
        if self._active[address] >= self._by_address[address].capacity:
            self._unlist(address)

    def release(self, address: str) -> None:
        if address in self._active:
            self._active[address] = max(0, self._active[address] - 1)
            self._list(self._by_address[address])

    def unavailable_reason(self, address: str, recipe: str | None = None) -> DeclineReason | None:
        """Why a known provider is outside the lists (of ``recipe``, if given); None if inside."""
        candidate = self._by_address.get(address)
        if candidate is None:
            return None
        if address in self._listed:
            if recipe is None:
                return None
            if recipe not in candidate.recipes:
                return DeclineReason.RECIPE_UNSUPPORTED
            if candidate.memory_mb < self.recipe_memory_mb.get(recipe, 0):
                return DeclineReason.INSUFFICIENT_MEMORY
            return None
        if not candidate.online:
            return DeclineReason.OFFLINE
        if self._active[address] >= candidate.capacity:
            return DeclineReason.AT_CAPACITY
        if candidate.price_per_pflop is None:
            return DeclineReason.NO_OFFER
        if candidate.reputation.fraud > 0:
            return DeclineReason.FRAUD_RECORD
        return DeclineReason.INSUFFICIENT_FREE_STAKE

    def _available(self, candidate: ProviderCandidate) -> bool:
        has_room = self._active[candidate.address] < candidate.capacity
        staked = candidate.free_stake >= self.collateral
        offers = candidate.price_per_pflop is not None
        honest_record = candidate.reputation.fraud == 0
        return candidate.online and has_room and staked and offers and honest_record
