"""The matching engine: which providers run the replicas of a unit, and why every other one did not.

Hard constraints (a candidate failing one is declined with a :class:`DeclineReason`): online with spare
capacity, supports the recipe, enough memory, measured speed fast enough for the unit's time budget,
free stake ≥ the collateral, a live offer at or under the order's max price per PFLOP, and an operator
not already running another replica of the same unit (replicas must be independent).

Ranking: one static score per provider (price per PFLOP, measured speed, reputation), so a
:class:`CandidatePool` keeps each recipe's providers pre-sorted and a match scans only until it has its
k replicas: O(k + declines) per match instead of a query over every provider. Replicas of one unit
prefer one hardware class (bitwise-equal results take the fast path); other classes fill in only when
one class cannot provide k distinct operators.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from enum import StrEnum

from market.domain.replication import (
    DEFAULT_POLICY,
    NO_REPUTATION,
    ReplicationPolicy,
    Reputation,
    replication_factor,
)


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


@dataclass(frozen=True, slots=True)
class ScoringWeights:
    """Score = w_price·r/(r+price) + w_speed·g/(g+ref) + w_rep·reliability, each term in [0, 1]."""

    price: float = 0.5
    speed: float = 0.3
    reputation: float = 0.2
    reference_price_per_pflop: int = 10**18
    reference_gflops: int = 100


DEFAULT_WEIGHTS = ScoringWeights()


def reliability(reputation: Reputation) -> float:
    """Laplace-smoothed share of valid units; fraud counts five times."""
    bad = reputation.fault + 5 * reputation.fraud
    return (reputation.valid + 1) / (reputation.valid + bad + 2)


def score(candidate: ProviderCandidate, weights: ScoringWeights = DEFAULT_WEIGHTS) -> float:
    """Higher is better; independent of the order, so candidates can be kept pre-sorted."""
    price = candidate.price_per_pflop
    reference = weights.reference_price_per_pflop
    price_term = 0.0 if price is None else reference / (reference + price)
    speed_term = candidate.gflops / (candidate.gflops + weights.reference_gflops)
    reputation_term = reliability(candidate.reputation)
    return weights.price * price_term + weights.speed * speed_term + weights.reputation * reputation_term


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
    demand: UnitDemand, ranked: Iterable[ProviderCandidate], policy: ReplicationPolicy = DEFAULT_POLICY
) -> Match:
    """Choose replicas for ``demand`` from candidates given best-first; record a reason for each decline.

    With ``adaptive`` the best eligible candidate's reputation sets k (capped by ``needed``).
    """
    k = demand.needed
    operators = set(demand.taken_operators)
    declines: list[tuple[str, DeclineReason]] = []
    chosen: list[ProviderCandidate] = []
    other_class: list[ProviderCandidate] = []
    hardware_class: str | None = None
    for candidate in ranked:
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
    # One class could not fill the unit: complete it with other classes, best first, operators distinct.
    for candidate in other_class:
        if len(chosen) < k and candidate.operator not in operators:
            chosen.append(candidate)
            operators.add(candidate.operator)
        else:
            reason = DeclineReason.OPERATOR_ALREADY_ON_UNIT if candidate.operator in operators else None
            declines.append((candidate.address, reason or DeclineReason.OTHER_HARDWARE_CLASS))
    return Match(demand.unit_id, tuple(c.address for c in chosen), k, tuple(declines))


def rank(
    candidates: Iterable[ProviderCandidate], weights: ScoringWeights = DEFAULT_WEIGHTS
) -> list[ProviderCandidate]:
    """Best first; ties broken by address so matching is deterministic."""
    return sorted(candidates, key=lambda c: (-score(c, weights), c.address))


@dataclass
class CandidatePool:
    """In-memory index of providers with spare capacity, pre-sorted per recipe by :func:`score`.

    The market refreshes it from the store (agents registered, heartbeats, offers, stake) and updates
    it as it reserves and releases providers, so a match never queries the database. Providers that no
    order could use right now (offline, at capacity, no live offer, free stake under the collateral)
    are kept out of the ranked lists, and out of a recipe's list when their memory is under what the
    recipe needs (``recipe_memory_mb``), with the reason available from :meth:`unavailable_reason`. A
    match then scans only candidates that might fit, instead of re-declining the same ones each time.
    """

    weights: ScoringWeights = field(default_factory=ScoringWeights)
    collateral: int = 0
    recipe_memory_mb: dict[str, int] = field(default_factory=dict)
    _by_address: dict[str, ProviderCandidate] = field(default_factory=dict)
    _keys: dict[str, tuple[float, str]] = field(default_factory=dict)
    _ranked: dict[str, list[tuple[float, str]]] = field(default_factory=dict)
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
        if candidate.address in self._keys or not self._available(candidate):
            return
        key = (-score(candidate, self.weights), candidate.address)
        self._keys[candidate.address] = key
        for recipe in candidate.recipes:
            if candidate.memory_mb >= self.recipe_memory_mb.get(recipe, 0):
                bisect.insort(self._ranked.setdefault(recipe, []), key)

    def _unlist(self, address: str) -> None:
        key = self._keys.pop(address, None)
        if key is None:
            return
        for recipe in self._by_address[address].recipes:
            ranked = self._ranked.get(recipe, [])
            i = bisect.bisect_left(ranked, key)
            if i < len(ranked) and ranked[i] == key:
                del ranked[i]

    def ranked(self, recipe: str) -> Iterator[ProviderCandidate]:
        """Available candidates for ``recipe``, best first (a snapshot: safe to reserve while iterating)."""
        for _, address in list(self._ranked.get(recipe, ())):
            yield self._by_address[address]

    def match(self, demand: UnitDemand, policy: ReplicationPolicy = DEFAULT_POLICY) -> Match:
        """Match ``demand`` and reserve the chosen providers (one more active unit each)."""
        result = match_unit(demand, self._scan(demand.recipe), policy)
        for address in result.selected:
            self.reserve(address)
        return result

    def _scan(self, recipe: str) -> Iterator[ProviderCandidate]:
        ranked = self._ranked.get(recipe, [])
        i = 0
        while i < len(ranked):  # reservations happen only after the scan, so the list is stable here
            yield self._by_address[ranked[i][1]]
            i += 1

    def reserve(self, address: str) -> None:
        """One more active unit; a provider at capacity leaves the ranked lists until released."""
        self._active[address] += 1
        if self._active[address] >= self._by_address[address].capacity:
            self._unlist(address)

    def release(self, address: str) -> None:
        if address in self._active:
            self._active[address] = max(0, self._active[address] - 1)
            self._list(self._by_address[address])

    def unavailable_reason(self, address: str, recipe: str | None = None) -> DeclineReason | None:
        """Why a known provider is outside the ranked lists (of ``recipe``, if given); None if inside."""
        candidate = self._by_address.get(address)
        if candidate is None:
            return None
        if address in self._keys:
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
