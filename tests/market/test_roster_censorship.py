"""A market that censors a roster provider's opening (PLAN 5e, the agents' side), through the market's own
round path and the real contract (in-process EVM): the market never takes the victim's opening and, once the
round's reveal window has passed, gives its slot as withheld, which would set its unit aside unopened, cost
it `withholdPenalty` and its pay. The victim's slot watch (the provider agent's code,
veritrain.chain.slot_watch) publishes the opening on chain late in the window, from the chain's own records,
so the market's withheld step takes the victim's result from the chain: the unit is unanimous and paid, the
victim keeps its stake and is paid for its slots when the roster closes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from earned import earned

from apps.protocol_harness import ChainMarket
from tests.market.test_roster_api import opening
from tests.market.test_roster_liveness import market_with, opened, run_round
from tests.market.test_roster_settlement import drive
from veritrain.chain.appeal_watch import VerdictWatch
from veritrain.chain.slot_watch import SlotWatch
from veritrain.messages import Assignment, AssignmentPhase

pytestmark = pytest.mark.chain


@pytest.fixture
def market(tmp_path: Path) -> Iterator[ChainMarket]:
    yield from market_with(tmp_path, 0)


def test_a_provider_whose_opening_the_market_censors_publishes_it_and_is_paid_not_penalized(
    market: ChainMarket, tmp_path: Path
) -> None:
    api, _, view = opened(market)
    client = market.client
    chain_order = view.chain_order_id
    victim = view.providers[view.slots[0]]  # replica 0 of unit 0
    account = next(a for a in market.providers if a.address == victim)
    verdicts = VerdictWatch(client, account, tmp_path / "appeals.json")
    watch = SlotWatch(client, account, tmp_path / "slots.json", verdicts)
    earned_before = {p: earned(client, p) for p in view.providers}
    stake_before = client.stake_of(victim).bonded
    opened_digests: dict[int, str] = {}  # unit -> what the victim opened

    def censored(provider: str, work: Assignment) -> dict[str, Any] | None:
        """Every provider opens its slots; the market drops the victim's openings (its agent's watch
        remembers them first, as node/agent.py does)."""
        body = opening(work, provider)
        if provider != victim:
            return body
        if work.phase == AssignmentPhase.REVEAL:
            opened_digests[work.shard] = body["result_digest"]
            watch.opened(
                work.chain_order_id,
                work.round_index,
                work.shard,
                body["result_digest"],
                body["salt"],
                honest=True,
            )
        return None

    run_round(market, api, 0, censored)
    drive(market)  # round 0 committed; the victim's unit waits for an opening the market never takes
    info = client.get_roster(chain_order)
    assert (info.committed, info.pending_block != 0) == (1, True)
    assert watch.tick() == []  # early in the window: a market that steps with its opening makes it moot
    window = client.params.reveal_window
    client.advance_time(window - watch.margin_s + 1)
    victim_slots = [s for s in range(len(view.slots)) if view.providers[view.slots[s]] == victim]
    assert len(watch.tick()) == len(victim_slots)  # published on chain
    market.service.sync.sync_chain_events()

    client.advance_time(watch.margin_s)  # the window ended: the market gives the victim's slots as withheld
    market.heartbeats()
    drive(market)
    info = client.get_roster(chain_order)
    assert (info.pending_block, info.set_aside_units) == (0, 0)  # revealed, the victim's result counted
    revealed = client.roster_events(chain_order, ("RoundRevealed",))[0].args["digests"]
    assert "0x" + bytes(revealed[0]).hex() == opened_digests[0]
    assert watch.tick() == [] and watch.slots == {} and verdicts.units == {}

    # a censoring market's order stalls (it never learns the victim's state): closed at the deadline
    client.advance_time(client.get_order(chain_order).deadline - client.now() + 1)
    market.heartbeats()
    market.service.orders.advance_orders()
    drive(market)
    assert client.get_roster(chain_order).closed
    price = client.get_order(chain_order).price_per_replica
    for provider in view.providers:
        slots = view.slots.count(view.providers.index(provider))
        assert earned(client, provider) - earned_before[provider] == slots * price, provider  # round 0
    assert client.reputation(victim).fault == 0
    assert client.stake_of(victim).bonded == stake_before
