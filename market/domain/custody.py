"""Custody of live states (pure): who else keeps a state an open order may still start a unit from.

Why: a unit's result lives on the providers that produced it. With k = 1 that is one machine, and the
next round's providers fetch their start state from its holders only, so a producer that dies for good
would stall the order although its work was accepted and paid. The market therefore asks other
registered agents to fetch and keep such a state (the content address checks whatever they fetch) and
lists them as holders once they report holding it; the next round waits, for a bounded time, until one
does. Nothing here moves money.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Custodian:
    """An agent asked to keep one state: when it was asked, whether it reported holding it, and whether
    it is online now."""

    agent: str
    requested_at: int
    held: bool
    online: bool


def custodians_needed(custodians: Sequence[Custodian], copies: int, now: int, timeout_s: int) -> int:
    """How many more agents to ask so that ``copies`` online custodians hold (or are still fetching,
    asked less than ``timeout_s`` ago) the state: one that went offline or never reported no longer counts."""
    counting = [c for c in custodians if c.online and (c.held or now - c.requested_at < timeout_s)]
    return max(0, copies - len(counting))


def pick_custodians(
    need: int, candidates: Sequence[str], excluded: Collection[str], load: Mapping[str, int]
) -> list[str]:
    """``need`` candidates, never a producer of the state nor one already asked (``excluded``): the least
    loaded first (states they already keep), then by address, so storage spreads over the agents."""
    eligible = [agent for agent in candidates if agent not in excluded]
    return sorted(eligible, key=lambda agent: (load.get(agent, 0), agent))[: max(0, need)]


def may_rely_on(custodians: Sequence[Custodian], now: int, wait_s: int) -> bool:
    """May the order open a round that starts from the state? Yes once a custodian holds it, when nobody
    could be asked (no other agent), or when ``wait_s`` passed since the first request (it goes on with
    the producers alone rather than stall; custody is still sought)."""
    if not custodians or any(c.held for c in custodians):
        return True
    return now - min(c.requested_at for c in custodians) >= wait_s
