"""Segment selection is a deterministic function of public data and the post-commit randomness."""

from __future__ import annotations

import pytest

from verifier.segments import (
    Segment,
    draw_random_segments,
    first_divergence,
    is_spot_checked,
    segments_of,
    select_segments,
    top_q_segments,
)

STEPS = (0, 4, 8, 12, 16, 20, 24, 28, 32)


def test_same_seed_same_segments_and_seeds_spread_over_all_segments() -> None:
    norms = [1.0] * 8
    first = select_segments(STEPS, b"seed-1", 2, norms, 1)
    assert first == select_segments(STEPS, b"seed-1", 2, norms, 1)
    assert len(first) == 3 and len(set(first)) == 3
    drawn = {draw_random_segments(STEPS, seed.to_bytes(4, "big"), 1)[0] for seed in range(200)}
    assert drawn == set(segments_of(STEPS))


def test_random_draw_is_without_replacement_and_capped() -> None:
    assert sorted(draw_random_segments(STEPS, b"x", 100)) == list(segments_of(STEPS))


def test_top_q_takes_the_largest_updates_and_skips_already_drawn_segments() -> None:
    norms = [0.1, 5.0, 0.2, 0.3, 9.0, 0.1, 0.1, 0.1]
    assert top_q_segments(STEPS, norms, 2) == (Segment(16, 20), Segment(4, 8))
    assert top_q_segments(STEPS, norms, 1, exclude=[Segment(16, 20)]) == (Segment(4, 8),)
    with pytest.raises(ValueError):
        top_q_segments(STEPS, norms[:3], 1)


@pytest.mark.parametrize("divergent_from", [1, 2, 5, 8])
def test_bisection_finds_the_first_divergent_segment(divergent_from: int) -> None:
    calls: list[int] = []

    def agrees(step: int) -> bool:
        calls.append(step)
        return step < STEPS[divergent_from]

    assert first_divergence(STEPS, agrees) == Segment(STEPS[divergent_from - 1], STEPS[divergent_from])
    assert len(calls) <= 3  # log2(8 segments)


def test_spot_check_draw_is_deterministic_and_close_to_its_rate() -> None:
    draws = [is_spot_checked(index.to_bytes(8, "big"), 1000) for index in range(5000)]
    assert draws == [is_spot_checked(index.to_bytes(8, "big"), 1000) for index in range(5000)]
    assert 0.08 < sum(draws) / len(draws) < 0.12
    assert not any(is_spot_checked(index.to_bytes(8, "big"), 0) for index in range(100))
    with pytest.raises(ValueError):
        is_spot_checked(b"", 10_001)
