"""A rounds order's budget when a failed roster unit is retried per unit (in-process EVM, the real market
service; PLAN 5e): the roster holds the budget of its R·M units until it closes, which waits for the
round the retry belongs to, so the retry is paid from the order's spare unit (market/domain/pricing.py);
without it the retry could never be assigned (`NoUnitBudget`) and the order waited for its deadline."""

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


def test_a_drawn_retry_of_a_failed_roster_unit_is_paid_from_the_spare_unit(market: ChainMarket) -> None:
    """k = 1: unit 1 of round 0 is withheld and judged a fault, its retry is assigned from the spare unit,
    drawn and judged, round 1 is set aside and judged, the roster closes having paid nothing itself, and
    the order completes with its last round (no aggregate unit on the round path)."""
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
    market.service.orders.advance_orders()  # round 1 accepted: the order's last round
    assert api.get(f"/orders/{order_id}").json()["state"] == "completed"
    assert not [u for u in units_of(api, order_id) if u["kind"] == "aggregate"]
    order = client.get_order(chain_order)
    price, fee = order.price_per_replica, order.verifier_fee_per_unit
    assert order.units == ROUNDS * SHARDS + 1  # R·M and the spare
    # delivered: unit 0, the retry, round 1's two (the withheld unit 1 not)
    assert (order.delivered, order.open_units) == (4, 0)
    # escrowed 5 units; paid 4 replicas and 5 verdicts' fees (unit 1's fault included): one price left
    assert order.balance == order.units * (price + fee) - 4 * price - 5 * fee == price
