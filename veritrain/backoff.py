"""One exponential backoff for every retry loop (the market's outbox, the agents' registration)."""

from __future__ import annotations


def backoff_delay(attempt: int, *, base: float, cap: float) -> float:
    """Seconds to wait after the ``attempt``-th failure (1-based): ``base``, doubling, at most ``cap``."""
    return min(cap, base * 2 ** min(max(attempt, 1) - 1, 32))
