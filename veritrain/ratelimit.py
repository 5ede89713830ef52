"""Token buckets keyed by anything hashable: the data plane's per-peer arrivals and the market API's
per-client registrations ration what costs them work (issue 8 finding 9 and 11)."""

from __future__ import annotations

from collections.abc import Hashable


class TokenBuckets:
    """One token bucket per key; a bucket refilled to the brim is forgotten (it is the same as a new one)."""

    def __init__(self, rate_per_s: float, burst: int) -> None:
        self._rate = rate_per_s
        self._burst = float(burst)
        self._buckets: dict[Hashable, tuple[float, float]] = {}  # key -> (tokens, at)
        self._prune_at = 1024

    def take(self, key: Hashable, now: float) -> bool:
        """Spend one token of `key`'s bucket; False if it is empty."""
        tokens, at = self._buckets.get(key, (self._burst, now))
        tokens = min(self._burst, tokens + (now - at) * self._rate)
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            return False
        self._buckets[key] = (tokens - 1.0, now)
        if len(self._buckets) >= self._prune_at:
            self._prune(now)
        return True

    def _prune(self, now: float) -> None:
        self._buckets = {
            key: (tokens, at)
            for key, (tokens, at) in self._buckets.items()
            if tokens + (now - at) * self._rate < self._burst
        }
        self._prune_at = max(1024, 2 * len(self._buckets))

    def __len__(self) -> int:
        return len(self._buckets)
