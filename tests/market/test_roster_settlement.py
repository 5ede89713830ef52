"""The market's round path (market/rosters.py, market/roster_outbox.py) on the real contracts (in-process
EVM): a folded order that opts into `settlement: "rounds"` is drawn once, accepted by its providers, stepped
once per round and closed, its credits paid by the contract; a split unit is set aside by the step and
settles through the per-unit verdict path."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from earned import earned
from eth_account.signers.local import LocalAccount
from sqlmodel import select

from apps.protocol_harness import ChainMarket
from market.ports import ChainEvent
from market.rosters import RosterView
from market.store import RosterActionRow
from tests.market.test_chain_settlement import chain_market
from veritrain.chain.client import Outcome
from veritrain.chain.deployment import MarketParams
from veritrain.chain.eip712 import round_unit_id
from veritrain.errors import InvalidOrderSpec

pytestmark = pytest.mark.chain

ROUNDS, SHARDS = 2, 2
SALT = "0x" + "5a" * 32


@pytest.fixture
def market(tmp_path: Path) -> Iterator[ChainMarket]:
    params = MarketParams(min_verifiers=1, spot_check_ppm=0, solo_spot_check_ppm=0, probation_streak=0)
    with chain_market(tmp_path, params, 4) as m:
        yield m


def digest(label: str) -> str:
    return "0x" + hashlib.sha256(label.encode()).hexdigest()


def drive(market: ChainMarket) -> list[str]:
    """The worker's round-path pass (draw, plan, send) and the chain sync until nothing more lands; one
    "sent" per action that landed."""
    states: list[str] = []
    for _ in range(10):
        sent = market.service.roster_outbox.run()
        market.service.sync.sync_chain_events()
        if not sent:
            return states
        states += ["sent"] * sent
    raise AssertionError("the roster outbox did not settle")


def opened(market: ChainMarket) -> tuple[int, RosterView, dict[str, LocalAccount]]:
    """A folded 2 x 2 order on the round path, its roster drawn, accepted and opened on chain."""
    order_id = market.post_order(rounds=ROUNDS, settlement="rounds", shards=SHARDS, outer_step="folded")
    market.heartbeats()
    assert market.service.rosters.draw_pending() == 1
    view = market.service.rosters.view(order_id)
    accounts = {a.address: a for a in market.providers}
    deadline = market.client.now() + 3600
    for provider in view.providers:
        signed = market.client.sign_accept(accounts[provider], view.chain_order_id, view.roster_key, deadline)
        market.service.rosters.accept(
            order_id, provider, signed.nonce, deadline, "0x" + signed.signature.hex()
        )
    assert drive(market) == ["sent"]
    roster = market.service.rosters.roster(order_id)
    assert view.roster_key == "0x" + roster.key.hex()  # the Accept covers the roster's verifiers
    assert market.client.get_roster(view.chain_order_id).key == replace(roster, verifiers=()).key
    assert market.service.rosters.view(order_id).state == "open"
    return order_id, view, accounts


def work(
    market: ChainMarket,
    order_id: int,
    view: RosterView,
    accounts: dict[str, LocalAccount],
    round_index: int,
    results: dict[tuple[int, str], str],
) -> None:
    """Every slot's provider signs its commitment for `round_index` (unit u's result `results[(u, p)]`,
    else the unit's common one) over the roster's works deadline and hands it to the market."""
    for provider in view.providers:
        commitments = []
        for unit, _ in sorted(view.units_of(provider)):  # slot order: one slot of a unit per provider
            value = results.get((unit, provider), digest(f"{round_index}:{unit}"))
            unit_id = round_unit_id(view.chain_order_id, round_index, unit)
            commitments.append("0x" + market.client.commitment(value, SALT, provider, unit_id).hex())
        if not commitments:
            continue
        signature = market.client.round_commit_signature(
            accounts[provider], view.chain_order_id, round_index, commitments, view.works_deadline
        )
        market.service.rosters.submit_work(
            order_id, provider, round_index, commitments, "0x" + signature.hex()
        )


def open_round(
    market: ChainMarket,
    order_id: int,
    view: RosterView,
    round_index: int,
    results: dict[tuple[int, str], str],
) -> None:
    for provider in view.providers:
        for unit, _ in view.units_of(provider):
            value = results.get((unit, provider), digest(f"{round_index}:{unit}"))
            market.service.rosters.submit_opening(order_id, provider, round_index, unit, value, SALT)


def slots_of(view: RosterView) -> dict[str, int]:
    return {p: view.slots.count(i) for i, p in enumerate(view.providers)}


def test_a_folded_order_on_the_round_path_settles_in_one_step_per_round_and_pays_at_close(
    market: ChainMarket,
) -> None:
    client = market.client
    order_id, view, accounts = opened(market)
    earned_before = {p: earned(client, p) for p in view.providers}

    work(market, order_id, view, accounts, 0, {})
    assert drive(market) == ["sent"]  # step 0: commits round 0
    assert client.get_roster(view.chain_order_id).committed == 1
    assert drive(market) == []  # step 1 waits for round 0's openings and round 1's works
    open_round(market, order_id, view, 0, {})
    work(market, order_id, view, accounts, 1, {})
    assert drive(market) == ["sent"]  # step 1: reveals round 0 and commits round 1 together
    open_round(market, order_id, view, 1, {})
    assert drive(market) == ["sent", "sent"]  # step 2 reveals round 1, then the close

    info = client.get_roster(view.chain_order_id)
    assert (info.committed, info.pending_block, info.closed) == (ROUNDS, 0, True)
    price = client.get_order(view.chain_order_id).price_per_replica
    for provider, slots in slots_of(view).items():
        assert earned(client, provider) - earned_before[provider] == ROUNDS * slots * price
    with market.store.transaction() as session:
        roster = market.store.roster_of_order(session, order_id)
        assert roster is not None and (roster.state, roster.committed, roster.revealed) == ("closed", 2, 2)
        actions = {a.action: a.state for a in _actions(market, roster.id or 0)}
    assert actions == dict.fromkeys(["open", "step:0", "step:1", "step:2", "close"], "confirmed")
    assert market.service.orders.order_status(order_id).units == ()  # no unit went the per-unit path


def _actions(market: ChainMarket, roster_id: int) -> list[RosterActionRow]:
    with market.store.transaction() as session:
        query = select(RosterActionRow).where(RosterActionRow.roster_id == roster_id)
        return list(session.exec(query).all())


def test_a_split_unit_is_set_aside_by_the_step_and_settles_by_verdict(market: ChainMarket) -> None:
    client = market.client
    order_id, view, accounts = opened(market)
    earned_before = {p: earned(client, p) for p in view.providers}
    cheater = view.providers[view.slots[1 * view.replicas + 2]]  # replica 2 of unit 1
    split = {(1, cheater): digest("forged")}

    work(market, order_id, view, accounts, 0, split)
    drive(market)
    open_round(market, order_id, view, 0, split)
    work(market, order_id, view, accounts, 1, {})
    assert drive(market) == ["sent"]  # the step predicted the split and carried verifiers

    (status,) = market.service.orders.order_status(order_id).units
    assert (status.round_index, status.shard, status.state) == (0, 1, "verifying")
    assert status.providers[2] == cheater and len(status.verifiers) == 2
    chain_unit = status.chain_unit_id
    assert chain_unit is not None and client.get_unit(chain_unit).drawn
    verdict = [int(Outcome.ACCEPT), int(Outcome.ACCEPT), int(Outcome.FRAUD)]
    verifiers = {v.address: v for v in market.verifiers}
    for address in status.verifiers:
        market.sign_verdict(status.unit_id, verifiers[address], verdict)
    market.send_outbox()
    market.service.sync.sync_chain_events()
    assert market.service.orders.order_status(order_id).units[0].state == "accepted"

    open_round(market, order_id, view, 1, {})
    assert drive(market) == ["sent"]  # step 2; the close waits: the fraud is held until its truth is fixed
    assert not client.get_roster(view.chain_order_id).closed
    client.advance_time(client.params.verdict_window + client.deployment.appeal_params.appeal_window + 1)
    market.send_outbox()  # settle_held: the fraud slashed, the roster's set-aside unit settled
    assert client.get_roster(view.chain_order_id).open_set_aside == 0
    assert drive(market) == ["sent"]  # the close
    assert client.get_roster(view.chain_order_id).closed

    price = client.get_order(view.chain_order_id).price_per_replica
    in_unit_1 = {view.providers[view.slots[view.replicas + r]] for r in range(view.replicas)}
    for provider, slots in slots_of(view).items():
        roster_pay = (ROUNDS * slots - (provider in in_unit_1)) * price
        verdict_pay = price if provider in in_unit_1 and provider != cheater else 0
        assert earned(client, provider) - earned_before[provider] == roster_pay + verdict_pay
    assert client.reputation(cheater).fraud == 1


def test_an_order_that_opts_in_but_is_not_folded_is_refused_before_anything_is_stored(
    market: ChainMarket,
) -> None:
    with pytest.raises(InvalidOrderSpec, match="folded"):
        market.post_order(rounds=2, settlement="rounds")
    with market.store.transaction() as session:
        assert market.store.rosters_in(session, ["drawing"]) == []


def test_a_step_already_on_chain_is_confirmed_not_sent_again(market: ChainMarket) -> None:
    client = market.client
    order_id, view, accounts = opened(market)
    work(market, order_id, view, accounts, 0, {})
    market.service.rosters.plan()
    (step,) = market.service.roster_outbox.pending()
    assert market.service.roster_outbox.send(step).sent
    with market.store.transaction() as session:  # a worker that crashed before recording it
        row = market.store.get_roster_action(session, step, for_update=True)
        row.state, row.updated_at = "sending", 0
        session.add(row)
    block = client.w3.eth.block_number
    again = market.service.roster_outbox.send(step)
    assert (again.state, again.sent) == ("confirmed", False)
    assert client.w3.eth.block_number == block  # nothing was sent


def test_round_path_events_the_market_does_not_expect_change_nothing_and_never_stall_the_sync(
    market: ChainMarket,
) -> None:
    order_id, view, _ = opened(market)
    strange = [
        ChainEvent(1, 0, "UnitSetAside", {"orderId": 10**9, "round": 0, "unit": 0, "unitId": 5}),
        ChainEvent(1, 1, "RoundCommitted", {"round": 0}),  # no order id
        ChainEvent(1, 2, "RosterClosed", {"orderId": "0xzz"}),
        ChainEvent(
            1,
            3,
            "OpeningPublished",
            {"orderId": view.chain_order_id, "round": 7, "slot": 99, "resultDigest": "0x" + "00" * 32},
        ),
    ]
    with market.store.transaction() as session:
        for event in strange:
            assert market.service.rosters.apply_event(session, event, market.now()) == set()
    assert market.service.rosters.view(order_id).state == "open"
