"""Which PoL segments a verifier re-executes: pure, deterministic functions of public data.

Why: a prover must not be able to predict which segments get re-executed when it commits, so random
segments are drawn from ``randomness`` that is fixed only after the commit phase (a later block hash or a
verifier commit–reveal). The top-q largest updates are added as in Jia et al. 2021 (a spoofer who
shortcuts training tends to leave one big jump). Everything here is a function of (checkpoint steps,
randomness, update norms), so any other verifier or a court contract can recompute the same choice.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

SEGMENT_DOMAIN = b"veritrain/verifier/segments/v1"
SPOT_CHECK_DOMAIN = b"veritrain/verifier/spot-check/v1"
ORDER_DOMAIN = b"veritrain/verifier/order/v1"
BASIS_POINTS = 10_000


@dataclass(frozen=True, order=True)
class Segment:
    """Unit steps [start, end) between two consecutive (or agreed) checkpoints."""

    start: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start


def segments_of(checkpoint_steps: Sequence[int]) -> tuple[Segment, ...]:
    """The segments between consecutive checkpoints (0, c, 2c, ..., H)."""
    return tuple(Segment(a, b) for a, b in itertools.pairwise(checkpoint_steps))


def _draw(seed: bytes, domain: bytes, counter: int) -> int:
    return int.from_bytes(hashlib.sha256(domain + seed + counter.to_bytes(8, "big")).digest()[:8], "big")


def draw_random_segments(checkpoint_steps: Sequence[int], seed: bytes, count: int) -> tuple[Segment, ...]:
    """`count` distinct segments, uniformly without replacement (a seeded partial Fisher–Yates shuffle)."""
    pool = list(segments_of(checkpoint_steps))
    chosen: list[Segment] = []
    for counter in range(min(count, len(pool))):
        index = counter + _draw(seed, SEGMENT_DOMAIN, counter) % (len(pool) - counter)
        pool[counter], pool[index] = pool[index], pool[counter]
        chosen.append(pool[counter])
    return tuple(chosen)


def top_q_segments(
    checkpoint_steps: Sequence[int], update_norms: Sequence[float], q: int, exclude: Sequence[Segment] = ()
) -> tuple[Segment, ...]:
    """The q segments with the largest update norm, not counting `exclude` (ties: earliest first)."""
    segments = segments_of(checkpoint_steps)
    if len(update_norms) != len(segments):
        raise ValueError(f"{len(update_norms)} update norms for {len(segments)} segments")
    ranked = sorted(range(len(segments)), key=lambda index: (-update_norms[index], index))
    picked = [segments[index] for index in ranked if segments[index] not in exclude]
    return tuple(picked[:q])


def select_segments(
    checkpoint_steps: Sequence[int], seed: bytes, random_count: int, update_norms: Sequence[float], top_q: int
) -> tuple[Segment, ...]:
    """Random segments from `seed` plus the top-q largest updates, sorted by start step."""
    random_part = draw_random_segments(checkpoint_steps, seed, random_count)
    return tuple(sorted({*random_part, *top_q_segments(checkpoint_steps, update_norms, top_q, random_part)}))


def first_divergence(checkpoint_steps: Sequence[int], agrees_at: Callable[[int], bool]) -> Segment:
    """Bisect for adjacent checkpoints (a, b) with agreement at a and disagreement at b.

    Precondition (checked by the caller, not re-evaluated here): the two sides agree at the first step
    (the unit's start state) and disagree at the last. Needs log2(#checkpoints) comparisons; any adjacent
    pair found this way is a valid refereed-delegation target even if agreement is not monotone.
    """
    low, high = 0, len(checkpoint_steps) - 1
    if high < 1:
        raise ValueError("need at least two checkpoints")
    while high - low > 1:
        middle = (low + high) // 2
        if agrees_at(checkpoint_steps[middle]):
            low = middle
        else:
            high = middle
    return Segment(checkpoint_steps[low], checkpoint_steps[high])


def is_spot_checked(randomness: bytes, rate_bps: int) -> bool:
    """Whether a unit whose digests all agree is still sent to a verifier (probability rate_bps / 10 000)."""
    if not 0 <= rate_bps <= BASIS_POINTS:
        raise ValueError(f"spot-check rate must be 0..{BASIS_POINTS} basis points, got {rate_bps}")
    return _draw(randomness, SPOT_CHECK_DOMAIN, 0) % BASIS_POINTS < rate_bps


def tie_break(randomness: bytes, key: bytes) -> bytes:
    """A per-unit random but reproducible order key (so no replica can arrange to be the reference)."""
    return hashlib.sha256(ORDER_DOMAIN + randomness + key).digest()
