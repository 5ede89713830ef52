"""The round path's ways out (in-process EVM, the real market service; PLAN 5e): a roster unit that fails
below the order's shard quorum is retried on the per-unit path (its round is revealed: no slot can run it
again), a roster whose open can never land is redrawn without the providers that failed it, and roster
slots count as load in the per-unit matchmaker."""

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
from tests.market.test_roster_liveness import judge, run_round, runs_of, trains
from tests.market.test_roster_settlement import drive
from veritrain.chain.client import Outcome
from veritrain.chain.deployment import MarketParams
from veritrain.messages import Assignment

pytestmark = pytest.mark.chain

ROUNDS, SHARDS = 2, 2


@pytest.fixture
def market(tmp_path: Path) -> Iterator[ChainMarket]:
    params = MarketParams(min_verifiers=1, spot_check_ppm=0, solo_spot_check_ppm=0, probation_streak=0)
    with chain_market(tmp_path, params, 4) as m:
        yield m


def rounds_order(market: ChainMarket, replicas: int) -> int:
    """A folded 2 x 2 rounds order with `replicas` replicas a unit, its roster drawn, round 0 open."""
    order_id = market.post_order(
        rounds=ROUNDS, settlement="rounds", shards=SHARDS, outer_step="folded", replicas=replicas
    )
    market.heartbeats()
    assert market.service.rosters.draw_pending() == 1
    market.service.orders.advance_orders()
    return order_id


def test_a_roster_unit_that_fails_is_retried_on_the_per_unit_path_and_the_order_goes_on(
    market: ChainMarket,
) -> None:
    """k = 1, the provider of unit 1 of round 0 commits and never opens: the step gives its slot as
    withheld, the verdict fails the unit (a fault), and the order's quorum needs the shard: its retry is an
    ordinary unit, matched, assigned, committed, revealed and finalized on the per-unit path, and round 1
    then runs on the roster from it."""
    api = TestClient(create_app(market.service))
    order_id = rounds_order(market, replicas=1)
    accept_all(market, api)
    drive(market)
    client = market.client

    def mute_unit_1(provider: str, work: Assignment) -> dict[str, Any] | None:
        return None if work.shard == 1 else opening(work, provider)

    run_round(market, api, 0, mute_unit_1)
    drive(market)
    client.advance_time(client.params.reveal_window + 1)
    market.heartbeats()
    drive(market)  # round 0 revealed, unit 1's slot given as withheld: the unit set aside
    failed = trains(api, order_id, 0)[1]
    assert failed["state"] == "verifying"
    judge(market, failed, lambda _: Outcome.FAULT)
    market.service.orders.advance_orders()
    units = api.get(f"/orders/{order_id}").json()["units"]
    (retry,) = [u for u in units if u["kind"] == "train" and u["attempt"] == 1]
    assert (retry["round_index"], retry["shard"], retry["state"]) == (0, 1, "pending")
    unit_id, chosen = market.match_and_accept()  # the per-unit matchmaker takes it
    assert unit_id == retry["unit_id"]
    market.send_outbox()  # assign
    res = result("retry of unit 1")
    for provider in chosen:
        market.commit(unit_id, provider, res)
    for provider in chosen:
        market.service.assignments.reveal(market.reveal_submission(unit_id, provider, res))
    market.send_outbox()  # commits, reveals, finalize
    market.service.sync.sync_chain_events()
    assert market.unit(unit_id).state == "accepted"
    assert client.get_unit(market.chain_unit(unit_id)).state.name == "FINALIZED"
    market.service.orders.advance_orders()
    assert api.get(f"/orders/{order_id}").json()["rounds_accepted"] == 1
    assert len(runs_of(market, 1)) == SHARDS  # round 1 on the roster's slots
    run_round(market, api, 1)
    drive(market)  # round 1 committed, revealed by the last step; then the close
    assert client.get_roster(market.service.rosters.view(order_id).chain_order_id).closed
