"""BlobAccess: an authorizer that serves each blob only to the parties granted it, until a deadline.

Policy (simple on purpose): a provider's blobs of a unit — its checkpoints, manifest and final state —
are for the parties of that unit as the market lists them: the unit's assigned verifiers, its other
replicas, and the providers of the next round that start from its result. The agent grants them
(`grant(digests, addresses, until)`) when the market tells it who they are, with the unit's verdict
deadline (or the next round's) as `until`; every other requester is refused, however well it signs.
A refused request never takes a serving slot or replay-cache room (veritrain.p2p.guard), so a flood of
requests from throwaway keys costs the provider one signature check each and nothing else.

The requester's address is authenticated before the authorizer runs: the request's EIP-712 signature
recovers to it and the request is bound to the Noise peer id it arrives on.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable

from veritrain.blobstore import check_digest
from veritrain.errors import InvalidInput
from veritrain.p2p.messages import BlobRequest

__all__ = ["BlobAccess"]


class BlobAccess:
    """Thread-safe allow-list of (digest, eth address) pairs with expiry; pass it as `authorize=`."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._until: dict[tuple[str, str], float] = {}

    def grant(self, digests: Iterable[str], addresses: Iterable[str], until: float) -> None:
        """Let each of `addresses` fetch each of `digests` until `until` (unix seconds); never shortens."""
        keys = [(check_digest(d), _address(a)) for d in digests for a in addresses]
        with self._lock:
            now = self._clock()
            self._until = {key: end for key, end in self._until.items() if end > now}
            for key in keys:
                self._until[key] = max(until, self._until.get(key, 0.0))

    def __call__(self, request: BlobRequest) -> bool:
        with self._lock:
            return self._until.get((request.digest, request.requester.lower()), 0.0) > self._clock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._until)


def _address(text: str) -> str:
    if not (isinstance(text, str) and re.fullmatch(r"0x[0-9a-fA-F]{40}", text)):
        raise InvalidInput(f"not an eth address: {text!r:.60}")
    return text.lower()
