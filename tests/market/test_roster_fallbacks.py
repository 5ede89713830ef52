"""The round path's ways out (in-process EVM, the real market service; PLAN 5e): a roster unit that fails
below the order's shard quorum is retried on the per-unit path (its round is revealed: no slot can run it
again), a roster whose open can never land is redrawn without the providers that failed it, and roster
slots count as load in the per-unit matchmaker."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from apps.protocol_harness import ChainMarket, result
from market.api import create_app
from market.rosters import roster_of
from tests.market.test_chain_settlement import chain_market
from tests.market.test_roster_api import accept_all, heartbeat, opening
from tests.market.test_roster_liveness import judge, run_round, runs_of, trains
from tests.market.test_roster_settlement import drive
from veritrain.chain.client import Outcome
from veritrain.chain.deployment import MarketParams
from veritrain.messages import Assignment, AssignmentPhase

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
    ordinary unit, matched, assigned, committed, revealed and finalized on the per-unit path (the roster's
    providers are not busy with the roster meanwhile: it waits on the retry), and round 1 then runs on the
    roster from it."""
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
    view = market.service.rosters.view(order_id)
    assert not set(loads(market)) & set(view.providers)  # the roster waits on it: its providers may take it
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
    assert loads(market) == {p: view.slots.count(i) for i, p in enumerate(view.providers)}
    run_round(market, api, 1)
    drive(market)  # round 1 committed, revealed by the last step; then the close
    assert client.get_roster(market.service.rosters.view(order_id).chain_order_id).closed


def accept_by(market: ChainMarket, api: TestClient, providers: set[str]) -> None:
    """The roster's Accept from each of `providers` that holds an ACCEPT assignment."""
    for account in market.providers:
        if account.address not in providers:
            continue
        for work in heartbeat(market, account):
            if work.phase == AssignmentPhase.ACCEPT:
                signed = market.client.sign_accept(
                    account, work.chain_order_id, work.unit_key, work.accept_deadline
                )
                body = {
                    "order_id": work.order_id,
                    "provider": account.address,
                    "nonce": signed.nonce,
                    "deadline": work.accept_deadline,
                    "signature": "0x" + signed.signature.hex(),
                }
                assert api.post("/rosters/accept", json=body).status_code == 200
                break


def slot_holders(market: ChainMarket, order_id: int) -> set[str]:
    """Who holds the order's round-0 slots, as its training units' replicas say."""
    with market.store.transaction() as session:
        return {
            r.provider
            for u in market.store.units_of_order(session, order_id)
            if u.state == "rostered"
            for r in market.store.replicas_of(session, u.id or 0)
        }


def test_a_roster_whose_accept_never_comes_is_redrawn_without_the_silent_provider(
    market: ChainMarket,
) -> None:
    api = TestClient(create_app(market.service))
    order_id = rounds_order(market, replicas=2)
    first = market.service.rosters.view(order_id)
    silent = first.providers[0]
    accept_by(market, api, set(first.providers) - {silent})
    assert drive(market) == []  # no open without every Accept
    market.client.advance_time(market.service.ctx.config.accept_timeout_s + 1)
    market.heartbeats()
    drive(market)  # the roster is let go of (Accepts too late) ...
    drive(market)  # ... and drawn again without the silent provider at the next pass
    second = market.service.rosters.view(order_id)
    assert second.state == "accepting" and silent not in second.providers
    assert second.roster_key != first.roster_key
    assert slot_holders(market, order_id) == set(second.providers)
    accept_by(market, api, set(second.providers))
    assert drive(market) == ["sent"]  # openRoster with the new roster's Accepts
    assert market.client.get_roster(first.chain_order_id).key == parties_key(market, order_id)
    running = {
        account.address
        for account in market.providers
        for work in heartbeat(market, account)
        if work.phase == AssignmentPhase.RUN
    }
    assert running == set(second.providers)


def test_a_roster_whose_open_reverts_for_a_provider_is_redrawn_without_it(market: ChainMarket) -> None:
    """Every Accept came, then a provider unstaked: the open reverts (InsufficientFreeStake) and would
    forever; the roster is redrawn without that provider and opens."""
    api = TestClient(create_app(market.service))
    order_id = rounds_order(market, replicas=2)
    first = market.service.rosters.view(order_id)
    leaver = next(a for a in market.providers if a.address == first.providers[1])
    accept_by(market, api, set(first.providers))
    market.client.request_unstake(leaver, market.client.stake_of(leaver).bonded)
    drive(market)  # the open reverts: the roster is let go of ...
    drive(market)  # ... and drawn again without the leaver
    second = market.service.rosters.view(order_id)
    assert second.state == "accepting" and leaver.address not in second.providers
    assert "InsufficientFreeStake" in (second_error := market_roster_error(market, order_id)), second_error
    accept_by(market, api, set(second.providers))
    assert drive(market) == ["sent"]
    assert market.client.get_roster(first.chain_order_id).key == parties_key(market, order_id)
    assert market.service.rosters.view(order_id).state == "open"


def test_a_roster_whose_open_reverts_for_a_verifier_is_redrawn_without_it(market: ChainMarket) -> None:
    """A roster verifier unstaked after every Accept came: the open reverts (InsufficientFreeStake, naming
    the verifier); the roster is redrawn without it (the other verifier audits), not failed over to the
    per-unit path, and opens."""
    api = TestClient(create_app(market.service))
    order_id = rounds_order(market, replicas=1)
    with market.store.transaction() as session:
        roster = market.store.roster_of_order(session, order_id)
        assert roster is not None
        auditor = json.loads(roster.verifiers_json or "[]")[0]
    leaver = next(v for v in market.verifiers if v.address == auditor)
    accept_by(market, api, set(market.service.rosters.view(order_id).providers))
    market.client.request_unstake(leaver, market.client.stake_of(leaver).bonded)
    drive(market)  # the open reverts: the roster is let go of ...
    drive(market)  # ... and drawn again without that verifier
    second = market.service.rosters.view(order_id)
    assert second.state == "accepting", market_roster_error(market, order_id)
    with market.store.transaction() as session:
        roster = market.store.roster_of_order(session, order_id)
        assert roster is not None
        assert auditor not in json.loads(roster.verifiers_json or "[]")
    accept_by(market, api, set(second.providers))
    assert drive(market) == ["sent"]
    assert market.service.rosters.view(order_id).state == "open"


def parties_key(market: ChainMarket, order_id: int) -> bytes:
    """The key the chain records for the order's roster as drawn now: its parties' (the Accept's key also
    covers the roster's verifiers)."""
    with market.store.transaction() as session:
        roster = market.store.roster_of_order(session, order_id)
        assert roster is not None
        return replace(roster_of(roster), verifiers=()).key


def market_roster_error(market: ChainMarket, order_id: int) -> str:
    with market.store.transaction() as session:
        roster = market.store.roster_of_order(session, order_id)
        assert roster is not None
        return roster.last_error or ""


def test_a_roster_that_cannot_be_redrawn_falls_back_to_the_per_unit_path(market: ChainMarket) -> None:
    """No provider ever accepts: each redraw leaves out the silent ones, until too few are left to seat
    2 replicas a unit; the roster then fails and the order's units are matched one by one, with the whole
    budget (nothing of the roster reached the chain)."""
    api = TestClient(create_app(market.service))
    order_id = rounds_order(market, replicas=2)
    chain_order = market.service.rosters.view(order_id).chain_order_id
    drawn: list[set[str]] = []
    for _ in range(len(market.providers)):
        status = api.get(f"/orders/{order_id}").json()
        if status["roster"] is None or status["roster"]["state"] != "accepting":
            break
        drawn.append(set(status["roster"]["providers"]))
        market.client.advance_time(market.service.ctx.config.accept_timeout_s + 1)
        market.heartbeats()
        drive(market)  # let go of ...
        drive(market)  # ... and drawn again without the silent ones, or failed
    assert drawn and all(not (a & b) for a, b in itertools.pairwise(drawn))
    assert market_roster_error(market, order_id).startswith("redraw failed")
    status = api.get(f"/orders/{order_id}").json()
    assert status["roster"]["state"] == "failed"
    round0 = [u for u in status["units"] if u["kind"] == "train"]
    assert [u["state"] for u in round0] == ["pending"] * SHARDS
    matches = market.service.matching.match_pending()
    assert len(matches) == SHARDS and all(m.complete for m in matches)
    assert market.client.get_roster(chain_order).key == bytes(32)
    order = market.client.get_order(chain_order)
    assert order.balance == order.units * (
        order.replicas * order.price_per_replica + order.verifier_fee_per_unit
    )


def loads(market: ChainMarket) -> dict[str, int]:
    with market.store.transaction() as session:
        return market.store.active_load(session)


def test_roster_slots_count_as_load_between_rounds_and_not_while_their_order_waits_on_a_retry(
    market: ChainMarket,
) -> None:
    """A provider holding roster slots is busy for the per-unit matchmaker for as long as its roster has
    rounds to run, between rounds too (one load per slot of a round, the collateral the chain locks),
    except while the roster's own order waits for a per-unit retry, which its providers may then take."""
    api = TestClient(create_app(market.service))
    order_id = rounds_order(market, replicas=2)
    view = market.service.rosters.view(order_id)
    slots = {p: view.slots.count(i) for i, p in enumerate(view.providers)}
    assert loads(market) == slots  # drawn: busy before any work
    accept_all(market, api)
    drive(market)
    run_round(market, api, 0)
    drive(market)  # round 0's units accepted from their openings
    assert [u["state"] for u in trains(api, order_id, 0)] == ["accepted"] * SHARDS
    assert runs_of(market, 1) == []  # round 1 is not open yet (advance_orders opens it)
    assert loads(market) == slots  # between rounds: still the roster's
    # a per-unit order posted now finds every roster provider at capacity (capacity 1 each)
    market.post_order(rounds=1, replicas=1)
    market.heartbeats()
    market.service.matching.refresh_pool(force=True)
    (match,) = market.service.matching.match_pending()
    idle = {a.address for a in market.providers} - set(view.providers)
    assert set(match.selected) <= idle and match.complete == bool(idle)
    market.service.orders.advance_orders()
    assert runs_of(market, 1)
    # round 1's slots: the same load, not twice
    assert loads(market) == dict(Counter(slots) + Counter(match.selected))
