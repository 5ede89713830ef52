"""The seed block of a draw (market.domain.selection), fixed by the chain, and who may take part in it.

Why: a seed read from the head when the market runs its pass lets the operator pick the moment, one try
per block; a seed fixed by a chain event (the order's posting, the settlement a unit follows) is neither
the operator's choice nor known before that event's block was mined. Since a fixed seed stays public for a
while, an account whose stake grew after that block is left out of the draw it seeds: it could have ground
a new key, or topped up one whose key the seed made small (a stake in the seed block itself was sent before
its hash existed). A draw that comes up short while such late stake waits is seeded again by the block of
the latest of those stakes (:func:`late_stake_block`): chain-fixed too, and it lets a young network's first
orders start once enough providers have staked."""

from __future__ import annotations

from collections.abc import Iterable

from market.domain.selection import NO_BLOCK_HASH
from market.ports import SettlementPort
from market.store import AgentRow, UnitRow


def staked_by(agent: AgentRow, block_number: int) -> bool:
    """Whether the agent's stake last grew in or before ``block_number`` (0: no seed block, every agent
    counts), so it may take part in a draw that block seeds."""
    return not block_number or (agent.stake_block or 0) <= block_number


def late_stake_block(stake_blocks: Iterable[int], block_number: int) -> int | None:
    """The block a draw seeded by ``block_number`` that came up short is seeded by next: the latest of the
    stakes that grew after it (None: there is none, a new seed would change nothing)."""
    late = [block for block in stake_blocks if block_number and block > block_number]
    return max(late, default=None)


class SeedBlocks:
    """Seed blocks and their hashes, each hash read once (per pass of the matchmaker or the roster draw)."""

    def __init__(self, chain: SettlementPort | None) -> None:
        self.chain = chain
        self._hashes: dict[int, str] = {}

    def of(self, unit: UnitRow) -> tuple[int, str]:
        """The unit's seed block, fixed when it was created (``UnitRow.selection_block``: market.orders)."""
        return self.at(unit.selection_block)

    def at(self, block: int | None) -> tuple[int, str]:
        """``block`` and its hash; the head for None (a unit or order from before seed blocks were
        recorded); (0, zero hash) without a chain, when the unit key alone seeds the draw."""
        if self.chain is None:
            return 0, NO_BLOCK_HASH
        number = block if block is not None else self.chain.block_number()
        if number not in self._hashes:
            self._hashes[number] = self.chain.block_hash(number)
        return number, self._hashes[number]
