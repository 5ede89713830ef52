"""Which path the market settles an order on when the buyer does not say (in-process EVM, the real market
service): the round path for every order a roster can serve (folded, fixed k), the per-unit path for the
rest (adaptive replication, M = 1, an outer step per round as a unit) and for a buyer who asks for it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.protocol_harness import ChainMarket
from tests.market.test_chain_settlement import chain_market
from veritrain.chain.deployment import MarketParams
from veritrain.errors import InvalidOrderSpec

pytestmark = pytest.mark.chain

FOLDED = {"rounds": 2, "shards": 2, "outer_step": "folded"}


@pytest.fixture
def market(tmp_path: Path) -> Iterator[ChainMarket]:
    params = MarketParams(min_verifiers=1, spot_check_ppm=0, solo_spot_check_ppm=0, probation_streak=0)
    with chain_market(tmp_path, params, 4) as m:
        yield m


def has_roster(market: ChainMarket, order_id: int) -> bool:
    with market.store.transaction() as session:
        return market.store.roster_of_order(session, order_id) is not None


def training_units(market: ChainMarket, order_id: int) -> int:
    market.service.orders.advance_orders()
    return len(market.service.orders.order_status(order_id).units)


def test_a_folded_fixed_k_order_goes_to_the_round_path_unless_the_buyer_asks_for_units(
    market: ChainMarket,
) -> None:
    by_default = market.post_order(**FOLDED)
    assert has_roster(market, by_default)
    market.heartbeats()
    assert market.service.rosters.draw_pending() == 1  # drawn as a roster, not matched unit by unit
    asked = market.post_order(settlement="units", **FOLDED)
    assert not has_roster(market, asked) and training_units(market, asked) == 2  # round 0's shard units


def test_orders_a_roster_cannot_serve_stay_on_the_per_unit_path_and_an_explicit_rounds_is_refused(
    market: ChainMarket,
) -> None:
    adaptive = market.post_order(**FOLDED, adaptive_replication=True)
    sequential = market.post_order(rounds=2)
    unit_outer_step = market.post_order(rounds=2, shards=2)
    for order_id in (adaptive, sequential, unit_outer_step):
        assert not has_roster(market, order_id) and training_units(market, order_id) >= 1
    with pytest.raises(InvalidOrderSpec, match="fixed replication"):
        market.post_order(settlement="rounds", **FOLDED, adaptive_replication=True)
