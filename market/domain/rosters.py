"""Rosters, the round path's fixed assignment (docs/studies/round-settlement/PLAN.md, step 5): who holds an
order's replica slots for all its rounds, and which units of a revealed round the contract sets aside for
a verdict. Pure, no IO.

Why the market predicts the set-aside: the step that reveals a round must carry verifiers exactly when one
of its units will be set aside (the contract refuses it otherwise, `RoundUnitNeedsVerdict`), and a market
that starts round r before round r-1 is revealed on chain must know what the chain will decide. The rules
are JobMarketRounds `_revealRound`'s, read from public data: the draw `keccak(blockhash(commit block) ‖
roundUnitId) mod 10⁶ < rate` (every unit once that block hash is gone, 256 blocks on), a provider below the
roster's required streak, replicas that disagree, a replica that did not open.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum

from eth_hash.auto import keccak

from market.domain.replication import spot_check_drawn
from market.domain.selection import ROLE_REPLICAS, sample, selection_seed
from veritrain.chain.client import Roster
from veritrain.chain.eip712 import round_unit_id
from veritrain.errors import InvalidInput, MarketError

MAX_ROSTER_PROVIDERS = 32  # the contract's layout gives each slot a 5-bit provider index


class SetAsideReason(StrEnum):
    """Why a round's unit goes to its verifiers, the most telling first when several hold."""

    WITHHELD = "withheld"  # a replica did not open within the reveal window (and published no opening)
    SPLIT = "split"  # its replicas revealed different results
    WEAK_PROVIDER = "weak_provider"  # a provider below the roster's required streak
    DRAWN = "drawn"  # the spot-check draw, or the commit block's hash is no longer readable


def draw_roster(
    block_hash: str,
    order_key: str,
    stakes: Mapping[str, int],
    capacity: Mapping[str, int],
    replicas: int,
    units_per_round: int,
    rounds: int,
) -> Roster:
    """Each unit's `replicas` providers by the stake-weighted draw of market/domain/selection.py, seeded per
    unit from `block_hash` and the order's 32-byte `order_key`: distinct within a unit, none over its
    `capacity` (the slots its free stake can collateralize), at most 32 providers in all (the first 32
    drawn; later units draw among them). The same draw for every round: the roster holds for the order."""
    if not 1 <= replicas <= 5:
        raise InvalidInput(f"a unit has 1 to 5 replicas, got {replicas}")
    seed = selection_seed(block_hash, order_key)
    providers: list[str] = []
    used: dict[str, int] = {}
    slots: list[int] = []
    for unit in range(units_per_round):
        unit_seed = "0x" + keccak(bytes.fromhex(seed[2:]) + unit.to_bytes(32, "big")).hex()

        def eligible(address: str) -> bool:
            if used.get(address, 0) >= capacity.get(address, 0):
                return False
            return address in used or len(providers) < MAX_ROSTER_PROVIDERS

        chosen = sample(block_hash, unit_seed, ROLE_REPLICAS, stakes, replicas, eligible)
        if len(chosen) < replicas:
            raise MarketError(
                f"unit {unit} of the roster found {len(chosen)} of {replicas} providers with free stake "
                "for a slot"
            )
        for address in chosen:
            if address not in used:
                providers.append(address)
            used[address] = used.get(address, 0) + 1
            slots.append(providers.index(address))
    return Roster(tuple(providers), tuple(slots), replicas, units_per_round, rounds)


def predict_set_aside(
    roster: Roster,
    order_id: int,
    round_index: int,
    commit_block_hash: str,
    rate_ppm: int,
    values: Sequence[str | None],
    weak: frozenset[str] = frozenset(),
) -> dict[int, SetAsideReason]:
    """The units of round `round_index` that the step revealing it sets aside, with why. `values`: per
    replica slot the digest it opened (or published), None for a slot that did not open; `rate_ppm`: the
    contract's rate for the roster's replica count (`soloSpotCheckPpm` when it is 1, else
    `spotCheckPpm`); `commit_block_hash`: the hash of the block whose step committed the round (zero once
    unreadable); `weak`: the roster's providers below its required streak now."""
    k = roster.replicas
    if len(values) != roster.units_per_round * k:
        raise InvalidInput(f"expected {roster.units_per_round * k} slot values, got {len(values)}")
    unreadable = int(commit_block_hash, 16) == 0
    weak_lower = {address.lower() for address in weak}
    reasons: dict[int, SetAsideReason] = {}
    for unit in range(roster.units_per_round):
        opened = values[unit * k : (unit + 1) * k]
        providers = {roster.provider_of(unit, replica).lower() for replica in range(k)}
        unit_key = f"0x{round_unit_id(order_id, round_index, unit):064x}"
        if any(value is None for value in opened):
            reasons[unit] = SetAsideReason.WITHHELD
        elif len({value.lower() for value in opened if value is not None}) > 1:
            reasons[unit] = SetAsideReason.SPLIT
        elif providers & weak_lower:
            reasons[unit] = SetAsideReason.WEAK_PROVIDER
        elif unreadable or spot_check_drawn(commit_block_hash, unit_key, rate_ppm):
            reasons[unit] = SetAsideReason.DRAWN
    return reasons
