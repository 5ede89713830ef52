"""The round path's safety and liveness through the market's API and training plane (in-process EVM, PLAN
5e): a unit the chain will set aside is never used before its verdict (its round is revealed by a step of
its own, the next round starts from the verdict), a split unit no longer stalls the roster, and a provider
that commits and never opens is given as withheld once the reveal window passed, penalized on chain, while
the roster goes on and the honest providers are paid."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from earned import earned
from fastapi.testclient import TestClient

from apps.protocol_harness import ChainMarket
from market.api import create_app
from market.rosters import RosterView
from market.store import RosterActionRow
from tests.market.test_chain_settlement import chain_market
from tests.market.test_roster_api import (
    REPLICAS,
    ROUNDS,
    SHARDS,
    accept_all,
    h,
    heartbeat,
    opening,
    rostered_order,
    work_body,
)
from tests.market.test_roster_settlement import drive
from veritrain.chain.client import Outcome
from veritrain.chain.deployment import MarketParams
from veritrain.messages import Assignment, AssignmentPhase

pytestmark = pytest.mark.chain

# (provider, assignment) -> the opening it hands in (None: it never opens)
Opener = Callable[[str, Assignment], dict[str, Any] | None]


def honest(provider: str, work: Assignment) -> dict[str, Any] | None:
    return opening(work, provider)


def market_with(tmp_path: Path, spot_check_ppm: int, round_audits: bool = True) -> Iterator[ChainMarket]:
    params = MarketParams(
        min_verifiers=1, spot_check_ppm=spot_check_ppm, solo_spot_check_ppm=spot_check_ppm, probation_streak=0
    )
    with chain_market(tmp_path, params, 4, round_audits=round_audits) as m:
        yield m


@pytest.fixture
def market(tmp_path: Path) -> Iterator[ChainMarket]:
    yield from market_with(tmp_path, 0)


@pytest.fixture
def drawing_market(tmp_path: Path) -> Iterator[ChainMarket]:
    """Every unit is drawn (k = 2 at a rate of 10⁶ ppm); rosters without verifiers (no round audits: every
    drawn unit is set aside, tests/market/test_roster_audits.py has them)."""
    yield from market_with(tmp_path, 1_000_000, round_audits=False)


def opened(market: ChainMarket) -> tuple[TestClient, int, RosterView]:
    """A rounds order (2 x 2, k = 2) through the API, its roster accepted by its providers and open."""
    api = TestClient(create_app(market.service))
    order_id = rostered_order(market)
    accept_all(market, api)
    drive(market)
    return api, order_id, market.service.rosters.view(order_id)


def run_round(market: ChainMarket, api: TestClient, round_index: int, opener: Opener = honest) -> int:
    """Every slot of `round_index` commits what `opener` would open, then opens it (or stays silent);
    returns how many slots ran."""
    ran = 0
    for account in market.providers:
        works = [
            w
            for w in heartbeat(market, account)
            if w.phase == AssignmentPhase.RUN and w.round_index == round_index
        ]
        if not works:
            continue
        ran += len(works)
        results = [
            (opener(account.address, w) or opening(w, account.address))["result_digest"] for w in works
        ]
        reply = api.post("/rosters/work", json=work_body(market, account, works, results))
        assert reply.status_code == 200, reply.json()
    for account in market.providers:
        for work in heartbeat(market, account):
            if work.phase == AssignmentPhase.REVEAL and work.round_index == round_index:
                body = opener(account.address, work)
                if body is not None:
                    assert api.post("/rosters/opening", json=body).status_code == 200
    return ran


def runs_of(market: ChainMarket, round_index: int) -> list[Assignment]:
    return [
        work
        for account in market.providers
        for work in heartbeat(market, account)
        if work.phase == AssignmentPhase.RUN and work.round_index == round_index
    ]


def actions(market: ChainMarket, order_id: int) -> list[str]:
    with market.store.transaction() as session:
        roster = market.store.roster_of_order(session, order_id)
        assert roster is not None
        rows = session.exec(RosterActionRow.__table__.select().where(RosterActionRow.roster_id == roster.id))
        return [row.action for row in rows]


def trains(api: TestClient, order_id: int, round_index: int) -> list[dict[str, Any]]:
    units = api.get(f"/orders/{order_id}").json()["units"]
    return sorted(
        (u for u in units if u["kind"] == "train" and u["round_index"] == round_index),
        key=lambda u: u["shard"],
    )


def judge(market: ChainMarket, unit: dict[str, Any], outcome_of: Callable[[str], Outcome]) -> None:
    """The unit's verifiers sign each replica's outcome; the market relays the verdict."""
    verifiers = {v.address: v for v in market.verifiers}
    verdict = [int(outcome_of(provider)) for provider in unit["providers"]]
    for address in unit["verifiers"]:
        market.sign_verdict(unit["unit_id"], verifiers[address], verdict)
    market.send_outbox()
    market.service.sync.sync_chain_events()


def settle_held_and_close(market: ChainMarket, chain_order_id: int) -> None:
    """Past the verdict and appeal windows: held frauds settled, then the roster's close."""
    client = market.client
    client.advance_time(client.params.verdict_window + client.deployment.appeal_params.appeal_window + 1)
    market.heartbeats()
    market.send_outbox()
    market.service.sync.sync_chain_events()
    drive(market)
    assert client.get_roster(chain_order_id).closed


def test_a_drawn_unit_is_not_used_before_its_verdict_its_round_revealed_alone(
    drawing_market: ChainMarket,
) -> None:
    market = drawing_market
    api, order_id, view = opened(market)
    chain_order = view.chain_order_id
    assert run_round(market, api, 0) == SHARDS * REPLICAS
    drive(market)  # round 0 committed; every unit is drawn: the step revealing round 0 commits nothing
    info = market.client.get_roster(chain_order)
    assert (info.committed, info.pending_block, info.set_aside_units) == (1, 0, SHARDS)
    assert actions(market, order_id) == ["open", "step:0", "reveal:0"]
    market.service.orders.advance_orders()
    units = trains(api, order_id, 0)
    assert [u["state"] for u in units] == ["verifying"] * SHARDS  # the training units themselves
    assert all(u["chain_unit_id"] is not None for u in units)
    assert runs_of(market, 1) == []  # round 1 does not start from an unverified result
    for unit in units:
        judge(market, unit, lambda _: Outcome.ACCEPT)
    market.service.orders.advance_orders()
    assert [u["state"] for u in trains(api, order_id, 0)] == ["accepted"] * SHARDS
    assert run_round(market, api, 1) == SHARDS * REPLICAS  # round 1 starts from the verdicts
    drive(market)  # round 1 committed alone, then the last step reveals (and sets aside) it
    assert actions(market, order_id)[3:] == ["step:1", "step:2"]
    for unit in trains(api, order_id, 1):
        judge(market, unit, lambda _: Outcome.ACCEPT)
    drive(market)  # the close
    assert market.client.get_roster(chain_order).closed
    market.service.orders.advance_orders()
    status = api.get(f"/orders/{order_id}").json()
    # completed with its last round (no aggregate unit: the buyer runs the last outer step from this state)
    assert status["rounds_accepted"] == ROUNDS and status["current_state_digest"] == h(f"round {ROUNDS - 1}")


def test_a_split_unit_is_set_aside_judged_and_the_order_goes_on_from_the_honest_result(
    market: ChainMarket,
) -> None:
    api, order_id, view = opened(market)
    client = market.client
    cheater = view.providers[view.slots[1 * REPLICAS + 1]]  # replica 1 of unit 1
    earned_before = {p: earned(client, p) for p in view.providers}

    def forge(provider: str, work: Assignment) -> dict[str, Any] | None:
        body = opening(work, provider)
        if (work.round_index, work.shard, provider) != (0, 1, cheater):
            return body
        forged = opening(work.model_copy(update={"shard": 9}), provider)  # a bound state of another unit
        return {**body, **{k: forged[k] for k in ("state_digest", "transcript_root", "result_digest")}}

    run_round(market, api, 0, forge)
    drive(market)  # unit 0 accepted from its openings; unit 1 split: round 0 revealed alone
    assert actions(market, order_id) == ["open", "step:0", "reveal:0"]
    unit0, unit1 = trains(api, order_id, 0)
    assert (unit0["state"], unit0["chain_unit_id"]) == ("accepted", None)
    assert unit1["state"] == "verifying" and client.get_unit(unit1["chain_unit_id"]).drawn
    market.service.orders.advance_orders()
    assert runs_of(market, 1) == []
    judge(market, unit1, lambda p: Outcome.FRAUD if p == cheater else Outcome.ACCEPT)
    market.service.orders.advance_orders()
    assert trains(api, order_id, 0)[1]["state"] == "accepted"
    works = runs_of(market, 1)
    assert works and all(w.folds for w in works)
    # round 1 folds round 0's honest results: the forged state is nowhere among its inputs
    honest_state = h("state 0 1")
    assert all(honest_state in [s.state_digest for s in w.shard_results if s] for w in works)
    forged_state = h("state 0 9")
    assert all(forged_state not in [s.state_digest for s in w.shard_results if s] for w in works)
    run_round(market, api, 1)
    drive(market)
    settle_held_and_close(market, view.chain_order_id)
    market.service.orders.advance_orders()
    status = api.get(f"/orders/{order_id}").json()
    # completed with its last round (no aggregate unit: the buyer runs the last outer step from this state)
    assert status["rounds_accepted"] == ROUNDS and status["current_state_digest"] == h(f"round {ROUNDS - 1}")
    assert client.reputation(cheater).fraud == 1
    price = client.get_order(view.chain_order_id).price_per_replica
    for provider in view.providers:
        slots = view.slots.count(view.providers.index(provider))
        expected = (ROUNDS * slots - (provider == cheater)) * price
        assert earned(client, provider) - earned_before[provider] == expected, provider


def test_a_provider_that_commits_and_never_opens_is_withheld_after_the_reveal_window_and_penalized(
    market: ChainMarket,
) -> None:
    api, order_id, view = opened(market)
    client = market.client
    silent = view.providers[view.slots[0]]  # replica 0 of unit 0: it commits, never opens
    earned_before = {p: earned(client, p) for p in view.providers}
    stake_before = client.stake_of(silent).bonded

    def mute(provider: str, work: Assignment) -> dict[str, Any] | None:
        return None if provider == silent else opening(work, provider)

    for round_index in range(ROUNDS):
        run_round(market, api, round_index, mute)
        drive(market)  # committed; the silent slot's unit waits
        info = client.get_roster(view.chain_order_id)
        assert (info.committed, info.pending_block != 0) == (round_index + 1, True)
        assert drive(market) == []  # within the reveal window nobody is given as withheld
        client.advance_time(client.params.reveal_window + 1)
        market.heartbeats()
        drive(market)  # the reveal, the silent slots given as withheld: their units set aside
        assert client.get_roster(view.chain_order_id).pending_block == 0
        for unit in trains(api, order_id, round_index):
            if unit["state"] == "verifying":
                assert silent in unit["providers"]
                judge(market, unit, lambda p: Outcome.FAULT if p == silent else Outcome.ACCEPT)
        market.service.orders.advance_orders()
        assert all(u["state"] == "accepted" for u in trains(api, order_id, round_index))
    drive(market)  # the close
    assert client.get_roster(view.chain_order_id).closed
    withheld = (
        sum(
            view.slots[u * REPLICAS + r] == view.providers.index(silent)
            for u in range(SHARDS)
            for r in range(REPLICAS)
        )
        * ROUNDS
    )
    assert client.reputation(silent).fault == withheld
    assert client.stake_of(silent).bonded == stake_before - withheld * client.params.withhold_penalty
    assert earned(client, silent) == earned_before[silent]
    price = client.get_order(view.chain_order_id).price_per_replica
    for provider in view.providers:
        if provider != silent:
            slots = view.slots.count(view.providers.index(provider))
            assert earned(client, provider) - earned_before[provider] == ROUNDS * slots * price, provider
    status = api.get(f"/orders/{order_id}").json()
    assert (status["state"], status["rounds_accepted"]) == ("completed", ROUNDS)  # no aggregate unit


def test_a_rounds_order_past_its_deadline_expires_its_pending_round_revealed_and_the_rest_returned(
    market: ChainMarket,
) -> None:
    api, order_id, view = opened(market)
    client = market.client
    earned_before = {p: earned(client, p) for p in view.providers}
    run_round(market, api, 0)
    drive(market)  # round 0 committed, its units accepted; round 1 never runs
    market.service.orders.advance_orders()
    assert runs_of(market, 1)
    balance = client.get_order(view.chain_order_id).balance
    client.advance_time(client.get_order(view.chain_order_id).deadline - client.now() + 1)
    market.heartbeats()
    market.service.orders.advance_orders()
    assert api.get(f"/orders/{order_id}").json()["state"] == "expired"
    assert runs_of(market, 1) == []  # no more work handed out for an expired order
    client.advance_time(client.params.reveal_window + 1)  # round 0's reveal window, after the deadline
    drive(market)
    assert actions(market, order_id)[-2:] == ["reveal:0", "close"]  # round 0 revealed alone, then closed
    assert client.get_roster(view.chain_order_id).closed
    assert market.service.rosters.view(order_id).state == "closed"
    # round 0's providers are paid (the close pays nothing for a round left pending); round 1's budget and
    # every verifier fee return to the order, for the buyer to close it
    order = client.get_order(view.chain_order_id)
    price, fee = order.price_per_replica, order.verifier_fee_per_unit
    for provider in view.providers:
        slots = view.slots.count(view.providers.index(provider))
        assert earned(client, provider) - earned_before[provider] == slots * price, provider
    assert order.balance - balance == ROUNDS * SHARDS * (REPLICAS * price + fee) - SHARDS * REPLICAS * price
