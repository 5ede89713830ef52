"""PartyAccess: an authorizer that serves blobs only to the market's parties, never to throwaway keys.

Policy: a requester is served when it is a *party*: it has bonded stake on chain (every provider and
verifier must, so an identity costs stake, not a fresh key) or it was granted by this agent (the buyer of
an order the agent worked on, who fetches the verified result and the PoL manifests). Why not a per-unit
allow-list: the fetchers of a unit's blobs (its verifiers, the aggregate's replicas, the next round's
providers, a re-assigned shard, the buyer) are known to the market only step by step, and a provider
that refused a legitimate fetcher would be judged for blobs it failed to serve; the stake check refuses
the flood this guards against (issue 8 finding 9) without that risk.

A refused request never takes a serving slot or replay-cache room (veritrain.p2p.guard), so a flood of
requests from unstaked keys costs the provider a signature check and one stake lookup each. Lookups are
cached (``ttl_s`` for a party, ``refuse_ttl_s`` for a refusal): a party that unstakes keeps access at
most ``ttl_s`` longer. A lookup that fails (RPC down) refuses, and is not cached.

The requester's address is authenticated before the authorizer runs: the request's EIP-712 signature
recovers to it and the request is bound to the Noise peer id it arrives on.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable

from veritrain.errors import InvalidInput
from veritrain.p2p.messages import BlobRequest

__all__ = ["PartyAccess"]

logger = logging.getLogger(__name__)

MAX_CACHED = 65_536  # cache entries before the oldest half is dropped (a flood of fresh keys stays bounded)


class PartyAccess:
    """Thread-safe authorizer (pass as `authorize=`): staked parties (``is_staked``) and granted addresses."""

    def __init__(
        self,
        is_staked: Callable[[str], bool],
        *,
        ttl_s: float = 60.0,
        refuse_ttl_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._is_staked = is_staked
        self._ttl_s = ttl_s
        self._refuse_ttl_s = refuse_ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._granted: set[str] = set()
        self._cache: dict[str, tuple[bool, float]] = {}  # address -> (party?, valid until)

    def grant(self, addresses: Iterable[str]) -> None:
        """Serve each of `addresses` whatever its stake (an order's buyer)."""
        checked = [_address(a) for a in addresses]
        with self._lock:
            self._granted.update(checked)

    def __call__(self, request: BlobRequest) -> bool:
        requester = request.requester.lower()
        now = self._clock()
        with self._lock:
            if requester in self._granted:
                return True
            cached = self._cache.get(requester)
            if cached is not None and cached[1] > now:
                return cached[0]
        try:
            party = bool(self._is_staked(requester))
        except Exception as exc:  # RPC down: refuse now, ask again next time
            logger.warning("stake lookup for %s failed: %r", requester, exc)
            return False
        with self._lock:
            if len(self._cache) >= MAX_CACHED:
                for key in list(self._cache)[: MAX_CACHED // 2]:
                    del self._cache[key]
            self._cache[requester] = (party, now + (self._ttl_s if party else self._refuse_ttl_s))
        return party


def _address(text: str) -> str:
    if not (isinstance(text, str) and re.fullmatch(r"0x[0-9a-fA-F]{40}", text)):
        raise InvalidInput(f"not an eth address: {text!r:.60}")
    return text.lower()
