"""Canary units (DESIGN.md §4.7): a unit whose answer the network already verified, run again as an ordinary
order, so that a provider cannot tell it from a buyer's unit by what it is asked to do.

The rules here are pure: which verified unit may be replayed (a round-0 unit of one sequential shard
starts from the recipe's seeded initial state, so the replay asks for exactly the same work and no state
has to be kept for it), how the replay's spec is derived from the source's, and whether a replica's reveal
differs from the known answer. A difference is never fraud by itself: digests legitimately differ across
hardware classes (DESIGN.md §4.6), so a mismatch sends the unit to the verifiers, whose re-execution
decides fraud exactly as for a drawn audit. A canary is thus a certain audit the provider cannot see
coming, and a matching reveal costs no verifier any work.

A *planted* canary tests the verifiers instead (issue 9 item 2's "units with a known planted cheat"): the
same replay, worked alone by one of the operator's planted-cheat agents (`veritrain node run --plant`),
which forges it. Its replica set is unanimous, so a verifier that accepts unanimous units without
re-executing them (the verifier's dilemma: nearly every audited unit is honest) signs accept, and that
signature contradicts the unit's truth, which slashes it. The market shows its verifiers the job as the
spot check it looks like on chain, never as a canary.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from veritrain.errors import InvalidInput
from veritrain.messages import TRUSTED_STREAK, OrderSpec, UnitKind

PPM = 1_000_000


@dataclass(frozen=True, slots=True)
class KnownAnswer:
    """The verified result of a unit: what every replica of its replay must reveal on the same hardware."""

    source_unit_id: int
    result_digest: str


def replayable(
    spec: OrderSpec, kind: UnitKind, round_index: int, accepted_results: Iterable[str], source_unit_id: int
) -> KnownAnswer | None:
    """The known answer of an accepted unit that a canary may replay, or None.

    Only a training unit of round 0 of a one-shard order qualifies: it starts from the seeded initial
    state, so its replay needs no custody of a start state. Its accepted replicas must agree on one result
    (a unit accepted with differing digests has no single known answer)."""
    if kind != UnitKind.TRAIN or round_index != 0 or spec.shards != 1:
        return None
    results = {digest.lower() for digest in accepted_results}
    if len(results) != 1:
        return None
    return KnownAnswer(source_unit_id, results.pop())


class Replay(StrEnum):
    """What a verified unit's draw made of it."""

    NONE = "none"
    CANARY = "canary"  # a known-answer unit for providers
    PLANTED = "planted"  # a known planted cheat for verifiers


def canary_spec(source: OrderSpec, buyer: str, deadline: int, *, planted: bool = False) -> OrderSpec:
    """The replay's spec: the source's recipe, data, seed, unit length and replication policy, one unit
    long, bought by the canary account before ``deadline``. What a provider runs (UnitWork) is therefore
    the source's round-0 unit, field for field. A planted replay has one replica (the plant alone makes a
    unanimous set)."""
    update: dict[str, object] = {"buyer": buyer, "total_steps": source.unit_steps, "deadline": deadline}
    if planted:
        update.update(replicas=1, adaptive_replication=False, trusted_streak=TRUSTED_STREAK)
    return source.model_copy(update=update)


def replay_of(canary_rate_ppm: int, plant_rate_ppm: int, roll: int) -> Replay:
    """Whether a verified unit is replayed, and how: ``roll`` uniform in [0, 10⁶) (the market's own secret
    randomness, so nobody can predict which unit comes back) below the plant rate plants a cheat, in the
    next ``canary_rate_ppm`` a canary; the two rates together are at most 10⁶."""
    for name, rate in (("canary", canary_rate_ppm), ("plant", plant_rate_ppm)):
        if not 0 <= rate <= PPM:
            raise InvalidInput(f"{name} rate must be within [0, {PPM}] ppm, got {rate}")
    if canary_rate_ppm + plant_rate_ppm > PPM:
        raise InvalidInput(f"canary and plant rates add up to more than {PPM} ppm")
    if not 0 <= roll < PPM:
        raise InvalidInput(f"roll must be within [0, {PPM}), got {roll}")
    if roll < plant_rate_ppm:
        return Replay.PLANTED
    return Replay.CANARY if roll < plant_rate_ppm + canary_rate_ppm else Replay.NONE


def differs_from_known(known_result: str, revealed: str) -> bool:
    """A reveal that is not the known answer: the unit must go to the verifiers (not fraud by itself)."""
    return known_result.lower() != revealed.lower()
