"""Whether what a replica reports about its result is the result it committed to (DESIGN.md §4)."""

from __future__ import annotations

from veritrain.diloco import Fold, aggregate_result_digest, folded_result_digest
from veritrain.pol import result_digest


def is_bound(
    result: str | None,
    state_digest: str | None,
    transcript_root: str | None,
    *,
    aggregate: bool = False,
    fold: tuple[str, str] | None = None,
) -> bool:
    """sha256(domain ‖ state_digest ‖ transcript_root) == result (all 0x-hex, 32 bytes each).

    An aggregate unit's replica reports its output state digest and inputs commitment in those two fields,
    bound by ``diloco.aggregate_result_digest`` instead. A folded shard unit's replica also reports its
    outer step (``fold``: round state digest, inputs commitment), bound by ``diloco.folded_result_digest``.

    Why: the chain holds only the result digest; the state digest decides where the next round starts,
    so a reported state not bound to the revealed result would let a replica steer the buyer's weights.
    """
    if not (result and state_digest and transcript_root):
        return False
    state, root = bytes.fromhex(state_digest[2:]), bytes.fromhex(transcript_root[2:])
    if len(state) != 32 or len(root) != 32:
        return False
    opened = aggregate_result_digest(state, root) if aggregate else result_digest(state, root)
    if fold is not None:
        parts = [bytes.fromhex(part[2:]) for part in fold]
        if any(len(part) != 32 for part in parts):
            return False
        opened = folded_result_digest(opened, Fold(*parts))
    return "0x" + opened.hex() == result.lower()
