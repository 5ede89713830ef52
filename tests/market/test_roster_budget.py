"""A rounds order's budget when a failed roster unit is retried per unit (in-process EVM, the real market
service; PLAN 5e): the retry's verifier fee is one verification more than the R·M + 1 units' escrow, which a
roster's close pays back only from units it paid without a verdict. With every roster unit set aside (drawn,
no round audits) there is nothing to pay it back, so the order's last (aggregate) unit could never be
assigned (`NoUnitBudget`) and the order waited for its deadline."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from apps.protocol_harness import ChainMarket, result
from market.api import create_app
from tests.market.test_chain_settlement import chain_market
from tests.market.test_roster_api import accept_all, opening
from tests.market.test_roster_fallbacks import ROUNDS, SHARDS, rounds_order
from tests.market.test_roster_liveness import judge, run_round, trains
from tests.market.test_roster_settlement import drive
from veritrain.chain.client import Outcome
from veritrain.chain.deployment import MarketParams
from veritrain.messages import Assignment

pytestmark = pytest.mark.chain


@pytest.fixture
def market(tmp_path: Path) -> Iterator[ChainMarket]:
    """Every unit drawn, rosters without verifiers: every roster unit is set aside and judged."""
    params = MarketParams(
        min_verifiers=1, spot_check_ppm=1_000_000, solo_spot_check_ppm=1_000_000, probation_streak=0
    )
    with chain_market(tmp_path, params, 4, round_audits=False) as m:
        yield m


def units_of(api: TestClient, order_id: int) -> list[dict[str, Any]]:
    return list(api.get(f"/orders/{order_id}").json()["units"])


def run_unit(market: ChainMarket, api: TestClient, order_id: int, label: str) -> dict[str, Any]:
    """Match, assign, commit and reveal the order's one pending per-unit unit; it is drawn: judged accept."""
    unit_id, chosen = market.match_and_accept()
    market.send_outbox()  # assign
    unit = market.unit(unit_id)
    assert unit.chain_unit_id is not None, f"unit {unit_id} was not assigned on chain ({unit.state})"
    res = result(label)
    for provider in chosen:
        market.commit(unit_id, provider, res)
    for provider in chosen:
        market.service.assignments.reveal(market.reveal_submission(unit_id, provider, res))
    market.send_outbox()
    market.service.sync.sync_chain_events()
    (status,) = [u for u in units_of(api, order_id) if u["unit_id"] == unit_id]
    judge(market, status, lambda _: Outcome.ACCEPT)
    return status


def test_a_drawn_retry_of_a_failed_roster_unit_leaves_budget_for_the_last_unit(market: ChainMarket) -> None:
    """k = 1: unit 1 of round 0 is withheld and judged a fault, its retry is drawn and judged (a fee the
    escrow of R·M + 1 units did not plan), round 1 is set aside and judged, the roster closes having paid
    nothing itself: the order's last aggregate unit is still assigned, from the order's spare unit."""
    api = TestClient(create_app(market.service))
    order_id = rounds_order(market, replicas=1)
    accept_all(market, api)
    drive(market)
    client = market.client
    chain_order = market.service.rosters.view(order_id).chain_order_id

    def mute_unit_1(provider: str, work: Assignment) -> dict[str, Any] | None:
        return None if work.shard == 1 else opening(work, provider)

    run_round(market, api, 0, mute_unit_1)
    drive(market)
    client.advance_time(client.params.reveal_window + 1)
    market.heartbeats()
    drive(market)  # round 0 revealed, both units drawn and set aside, unit 1's slot withheld
    unit0, unit1 = trains(api, order_id, 0)
    judge(market, unit0, lambda _: Outcome.ACCEPT)
    judge(market, unit1, lambda _: Outcome.FAULT)
    market.service.orders.advance_orders()
    run_unit(market, api, order_id, "retry of unit 1")  # the retry, drawn: its fee is spent
    market.service.orders.advance_orders()
    run_round(market, api, 1)
    drive(market)  # round 1 committed, revealed by the last step: both units set aside
    for unit in trains(api, order_id, 1):
        judge(market, unit, lambda _: Outcome.ACCEPT)
    drive(market)  # the close: every unit was set aside, it pays and returns nothing
    assert client.get_roster(chain_order).closed
    market.service.orders.advance_orders()  # round 1 accepted: the last aggregate unit
    (aggregate,) = [u for u in units_of(api, order_id) if u["kind"] == "aggregate"]
    assert aggregate["state"] == "pending"
    unit_id, _ = market.match_and_accept()
    market.send_outbox()  # its assign: NoUnitBudget (retried until the order's deadline) without the spare
    assert unit_id == aggregate["unit_id"] and market.unit(unit_id).chain_unit_id is not None
    order = client.get_order(chain_order)
    price, fee = order.price_per_replica, order.verifier_fee_per_unit
    assert order.units == ROUNDS * SHARDS + 2  # R·M + 1 and the spare
    # delivered: unit 0, the retry, round 1's two (the withheld unit 1 not); the aggregate open
    assert (order.delivered, order.open_units) == (4, 1)
    # escrowed 6 units; paid 4 replicas and 5 verdicts' fees, the aggregate's budget reserved
    assert order.balance == order.units * (price + fee) - 4 * price - 5 * fee - (price + fee) == price
