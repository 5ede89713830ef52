"""The market's way past pending round audits (market/rosters.py `_past_pending`, market/roster_outbox.py) on
the real contracts (in-process EVM), every unit drawn, 2 x 2, k = 2, 2 roster verifiers.

Steps are permissionless, so anyone holding a round's openings may reveal it before the market, without
verifiers: its drawn units are then pending on chain whether or not the market holds its verifiers'
quorum. The market waits while the round's audit collects (the verifiers still sign: the same record) and
goes on as usual; on a refusal or no quorum it sets the record aside for verdicts (the cheat slashed, the
honest paid); past the order's deadline + verdictWindow with nobody to judge them it drops them and closes.
A close is sent once, after the last posting's challenge window. A round pending its reveal at the deadline
whose next round's works never came is revealed by a step of its own before the close (the close pays
nothing for a pending round), so its honest providers and verifiers are paid and a forgery in it judged."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from earned import earned
from eth_account.signers.local import LocalAccount
from fastapi.testclient import TestClient

from apps.protocol_harness import ChainMarket
from market.api import create_app
from market.rosters import RosterView
from tests.market.test_chain_settlement import chain_market
from tests.market.test_roster_api import REPLICAS, ROUNDS, SHARDS, accept_all, heartbeat, opening, work_body
from tests.market.test_roster_audits import (
    audit_rows,
    close_attempts,
    forge_unit_1,
    jobs,
    refusal,
    sign_all,
    submission,
)
from tests.market.test_roster_liveness import (
    actions,
    judge,
    opened,
    run_round,
    runs_of,
    settle_held_and_close,
    trains,
)
from tests.market.test_roster_settlement import drive
from veritrain.chain.client import Outcome, Reveal
from veritrain.chain.deployment import MarketParams
from veritrain.messages import AssignmentPhase

pytestmark = pytest.mark.chain


@pytest.fixture
def market(tmp_path: Path) -> Iterator[ChainMarket]:
    params = MarketParams(
        min_verifiers=1, spot_check_ppm=1_000_000, solo_spot_check_ppm=1_000_000, probation_streak=0
    )
    with chain_market(tmp_path, params, 4) as m:
        yield m


def reveal_first(market: ChainMarket, order_id: int, round_index: int, sender: LocalAccount) -> None:
    """`sender` reveals the pending round before the market, without verifiers, from the openings it saw
    (the market's, as a provider that collects them would have them): its drawn units are left pending."""
    client = market.client
    roster = market.service.rosters.roster(order_id)
    with market.store.transaction() as session:
        row = market.store.roster_of_order(session, order_id)
        assert row is not None
        chain_order_id = row.chain_order_id
        works = market.store.roster_works(session, row.id or 0, round_index)
        openings = [Reveal(w.provider, w.result_digest or "", w.salt or "") for w in works]
    records = client.audit_records(chain_order_id)
    client.step_round(chain_order_id, roster, openings, 0, None, audit_records=records, sender=sender)
    assert client.get_roster(chain_order_id).audits_pending


def test_a_round_someone_pends_while_its_audit_collects_goes_on_once_the_verifiers_sign(
    market: ChainMarket,
) -> None:
    """A griefer (here a roster provider) reveals round 0 before the market while its audit collects: the
    market uses none of its units until its verifiers sign the record the chain holds, then goes on as
    usual: one posting at the last step, nothing set aside, one close after the challenge window."""
    client = market.client
    api, order_id, view = opened(market)
    earned_before = {p: earned(client, p) for p in view.providers}
    run_round(market, api, 0)
    drive(market)
    assert audit_rows(market) == [(0, "collecting", 0)]
    reveal_first(market, order_id, 0, market.providers[0])
    drive(market)
    market.service.orders.advance_orders()
    assert [u["state"] for u in trains(api, order_id, 0)] == ["rostered"] * SHARDS  # not used unaudited
    assert runs_of(market, 1) == []
    sign_all(market, 0)  # the verifiers check the revealed round against the chain's record, and sign
    drive(market)
    market.service.orders.advance_orders()
    assert [u["state"] for u in trains(api, order_id, 0)] == ["accepted"] * SHARDS
    run_round(market, api, 1)
    drive(market)  # round 1 committed alone: round 0 is revealed already
    sign_all(market, 1)
    drive(market)  # the last step reveals round 1 and posts one quorum over both rounds
    chain_order = view.chain_order_id
    assert [r.posting for r in client.audit_records(chain_order)] == [False, False, True]
    assert client.get_roster(chain_order).set_aside_units == 0
    client.advance_time(client.params.verdict_window + 1)
    market.heartbeats()
    drive(market)
    assert client.get_roster(chain_order).closed
    assert close_attempts(market, order_id) == (1, None)  # one close, sent after the window: no revert
    order = client.get_order(chain_order)
    for provider in view.providers:
        slots = view.slots.count(view.providers.index(provider))
        assert earned(client, provider) - earned_before[provider] == ROUNDS * slots * order.price_per_replica


def test_a_cheat_pending_its_own_forgery_is_set_aside_judged_and_slashed(market: ChainMarket) -> None:
    """Two colluding providers open one forged result for unit 1 and reveal the round themselves, so that
    the forgery is pending instead of set aside: a verifier refuses the record, the market sets it aside
    with verifiers (`setAsidePending`), the forgery is judged fraud and slashed, the honest unit paid by its
    verdict, and round 1 starts from the verdicts."""
    client = market.client
    api, order_id, view = opened(market)
    pair = {view.providers[view.slots[1 * REPLICAS + r]] for r in range(REPLICAS)}
    honest_pair = {view.providers[view.slots[0 * REPLICAS + r]] for r in range(REPLICAS)}

    run_round(market, api, 0, forge_unit_1)
    drive(market)
    cheater = next(a for a in market.providers if a.address in pair)
    reveal_first(market, order_id, 0, cheater)
    drive(market)
    market.service.orders.advance_orders()
    assert runs_of(market, 1) == []  # the forged unit is not used while its record is unheld
    first, second = market.verifiers
    (job,) = jobs(market, first)
    market.service.rosters.audits.submit(submission(market, first, job))
    market.service.rosters.audits.refuse(refusal(market, second, job, next(market.nonces)))
    drive(market)
    assert actions(market, order_id) == ["open", "step:0", "aside:0"]
    info = client.get_roster(view.chain_order_id)
    assert (info.set_aside_units, info.open_set_aside, info.audits_pending) == (SHARDS, SHARDS, False)
    assert client.audit_records(view.chain_order_id) == []
    stakes = {p: client.stake_of(p).bonded for p in pair}
    before = {p: earned(client, p) for p in honest_pair}
    unit0, unit1 = trains(api, order_id, 0)
    assert (unit0["state"], unit1["state"]) == ("verifying", "verifying")
    judge(market, unit0, lambda _: Outcome.ACCEPT)
    judge(market, unit1, lambda _: Outcome.FRAUD)
    client.advance_time(client.params.verdict_window + client.deployment.appeal_params.appeal_window + 1)
    market.heartbeats()
    market.send_outbox()
    market.service.sync.sync_chain_events()
    for provider in pair:
        assert client.reputation(provider).fraud == 1
        assert client.stake_of(provider).bonded < stakes[provider]
    price = client.get_order(view.chain_order_id).price_per_replica
    for provider in honest_pair:
        assert earned(client, provider) - before[provider] >= price  # paid for its unit by the verdict


def test_pending_records_nobody_can_judge_are_dropped_after_the_deadline_and_the_roster_closes(
    market: ChainMarket,
) -> None:
    """Round 0 is pended by a provider, and its verifiers go silent: no quorum comes and nobody can take its
    units for a verdict. After the order's deadline + verdictWindow the market drops them
    (`setAsidePending` without verifiers) and closes the roster: the budget and every lock come back."""
    client = market.client
    api, order_id, view = opened(market)
    chain_order = view.chain_order_id
    order = client.get_order(chain_order)
    escrow = order.units * (order.replicas * order.price_per_replica + order.verifier_fee_per_unit)
    parties = [a.address for a in market.providers + market.verifiers]
    roster = market.service.rosters.roster(order_id)
    assert all(client.stake_of(p).locked > 0 for p in roster.providers + roster.verifiers)  # its locks
    run_round(market, api, 0)
    drive(market)
    reveal_first(market, order_id, 0, market.providers[0])
    client.advance_time(market.service.ctx.config.round_audit_timeout_s + 1)
    market.service.agents.sweep()  # nobody heartbeats: every verifier is offline
    drive(market)
    assert audit_rows(market) == [(0, "refused", 0)]
    assert client.get_roster(chain_order).audits_pending  # nobody to judge them before the deadline
    deadline = client.get_order(chain_order).deadline
    client.advance_time(deadline + client.params.verdict_window + 1 - client.now())
    market.service.agents.sweep()
    drive(market)
    info = client.get_roster(chain_order)
    assert (info.closed, info.audits_pending, info.set_aside_units, info.open_set_aside) == (
        True,
        False,
        SHARDS,
        0,
    )
    assert "aside:0" in actions(market, order_id)
    assert [client.stake_of(p).locked for p in parties] == [0] * len(parties)  # every lock released
    order = client.get_order(chain_order)
    assert (order.balance, order.open_units, order.delivered) == (escrow, 0, 0)  # the whole budget is back


def test_a_signed_pending_round_at_the_deadline_is_posted_then_the_roster_closes(market: ChainMarket) -> None:
    """Round 0 audited and left pending with its quorum held, then round 1 committed and never opened: past
    the deadline and the reveal window the market's last step reveals round 1 (its silent slots withheld,
    set aside) and posts round 0's quorum; once those units settle it closes after the posting's challenge
    window, paying round 0 (the close reverted `AuditsPending` before, for ever)."""
    client = market.client
    api, order_id, view = opened(market)
    chain_order = view.chain_order_id
    before = {p: earned(client, p) for p in view.providers}
    run_round(market, api, 0)
    drive(market)
    sign_all(market, 0)
    drive(market)
    market.service.orders.advance_orders()
    run_round(market, api, 1, lambda provider, work: None)  # committed, never opened
    drive(market)
    assert client.get_roster(chain_order).audits_pending  # round 0's record, its quorum in the market's hands
    client.advance_time(
        client.get_order(chain_order).deadline + client.params.reveal_window + 1 - client.now()
    )
    market.heartbeats()
    drive(market)
    assert [r.posting for r in client.audit_records(chain_order)] == [False, True]
    assert not client.get_roster(chain_order).audits_pending
    for unit in trains(api, order_id, 1):  # withheld: set aside, the silent replicas at fault
        judge(market, unit, lambda _: Outcome.FAULT)
    client.advance_time(client.params.verdict_window + client.deployment.appeal_params.appeal_window + 1)
    market.heartbeats()
    market.send_outbox()
    market.service.sync.sync_chain_events()
    drive(market)
    assert client.get_roster(chain_order).closed
    assert close_attempts(market, order_id) == (1, None)
    price = client.get_order(chain_order).price_per_replica
    for provider in view.providers:
        slots = view.slots.count(view.providers.index(provider))
        assert earned(client, provider) - before[provider] == slots * price  # round 0's slots, no more


def test_a_last_round_someone_else_reveals_is_posted_by_a_step_of_its_own(market: ChainMarket) -> None:
    """Someone reveals the last round (both audits signed) before the market's last step: nothing is left
    for that step, so the market posts its quorum in a post-only step, then closes once."""
    client = market.client
    api, order_id, view = opened(market)
    for round_index in range(ROUNDS):
        run_round(market, api, round_index)
        drive(market)
        sign_all(market, round_index)
        if round_index + 1 < ROUNDS:
            drive(market)
            market.service.orders.advance_orders()
    reveal_first(market, order_id, ROUNDS - 1, market.providers[1])
    market.service.sync.sync_chain_events()  # the market's next tick sees the reveal
    drive(market)
    assert [r.posting for r in client.audit_records(view.chain_order_id)] == [False, False, True]
    assert actions(market, order_id)[-2:] == [f"step:{ROUNDS - 1}", "post:2"]  # no last step to send
    client.advance_time(client.params.verdict_window + 1)
    market.heartbeats()
    drive(market)
    assert client.get_roster(view.chain_order_id).closed
    assert close_attempts(market, order_id) == (1, None)


def opened_for(market: ChainMarket, rounds: int) -> tuple[TestClient, int, RosterView]:
    """A folded 2 x 2 order (k = 2) of `rounds` rounds through the API, its roster accepted and open."""
    api = TestClient(create_app(market.service))
    order_id = market.post_order(
        rounds=rounds, settlement="rounds", shards=SHARDS, outer_step="folded", replicas=REPLICAS
    )
    market.heartbeats()
    assert market.service.rosters.draw_pending() == 1
    market.service.orders.advance_orders()
    accept_all(market, api)
    drive(market)
    return api, order_id, market.service.rosters.view(order_id)


def escrow_of(market: ChainMarket, chain_order: int) -> int:
    order = market.client.get_order(chain_order)
    return order.units * (order.replicas * order.price_per_replica + order.verifier_fee_per_unit)


def past_deadline(market: ChainMarket, chain_order: int) -> None:
    """Past the order's deadline and the pending round's reveal window (the chain would take a close)."""
    client = market.client
    client.advance_time(
        client.get_order(chain_order).deadline + client.params.reveal_window + 1 - client.now()
    )
    market.heartbeats()


def closes_paying_rounds(
    market: ChainMarket, order_id: int, view: RosterView, before: dict[str, int], escrow: int, rounds: int
) -> int:
    """After the last posting's challenge window the market closes the roster once, paying each provider its
    slots and each roster verifier its fees for the first `rounds` rounds (earned since `before`), releasing
    every lock and leaving the order the rest of `escrow`. Returns what the close paid."""
    client = market.client
    roster = market.service.rosters.roster(order_id)
    client.advance_time(client.params.verdict_window + 1)
    market.heartbeats()
    drive(market)
    assert client.get_roster(view.chain_order_id).closed
    assert close_attempts(market, order_id) == (1, None)
    order = client.get_order(view.chain_order_id)
    price, fee = order.price_per_replica, order.verifier_fee_per_unit // len(roster.verifiers)
    for provider in view.providers:
        slots = view.slots.count(view.providers.index(provider))
        assert earned(client, provider) - before[provider] == rounds * slots * price
    for verifier in roster.verifiers:
        assert earned(client, verifier) - before[verifier] == rounds * SHARDS * fee
    parties = [*roster.providers, *roster.verifiers]
    assert [client.stake_of(p).locked for p in parties] == [0] * len(parties)
    paid = rounds * SHARDS * (REPLICAS * price + fee * len(roster.verifiers))
    assert (order.open_units, order.delivered, order.balance) == (0, rounds * SHARDS, escrow - paid)
    return paid


def test_a_pending_round_whose_next_works_never_come_is_revealed_posted_and_paid(market: ChainMarket) -> None:
    """Three rounds: round 0 audited and revealed pending by step 1, round 1 committed, opened and audited,
    and round 2's works never come (the providers vanish). The market reveals round 1 alone past the
    deadline, posting its quorum over both records, and closes once after the challenge window: every
    provider paid its two rounds' slots, each verifier its audit fees, every lock released, the rest of the
    escrow the buyer's. (Before, no step revealed round 1 and the close waited on the pending records: the
    order stalled with its escrow and every lock held for ever.)"""
    client = market.client
    api, order_id, view = opened_for(market, 3)
    chain_order = view.chain_order_id
    escrow = escrow_of(market, chain_order)
    everyone = [*market.providers, *market.verifiers, market.buyer]
    before = {a.address: earned(client, a) for a in everyone}
    for round_index in (0, 1):
        run_round(market, api, round_index)
        drive(market)
        sign_all(market, round_index)
        drive(market)
        market.service.orders.advance_orders()
    info = client.get_roster(chain_order)
    assert (info.committed, info.pending_block != 0, info.audits_pending) == (2, True, True)
    assert len(runs_of(market, 2)) == SHARDS * REPLICAS  # round 2 handed out; its works never come
    past_deadline(market, chain_order)
    drive(market)
    assert actions(market, order_id)[-1] == "reveal:1"
    assert [r.posting for r in client.audit_records(chain_order)] == [False, False, True]
    info = client.get_roster(chain_order)
    assert (info.pending_block, info.audits_pending, info.set_aside_units) == (0, False, 0)
    paid = closes_paying_rounds(market, order_id, view, before, escrow, 2)
    client.close_order(chain_order, sender=market.buyer)
    assert earned(client, market.buyer) - before[market.buyer.address] == escrow - paid


def test_a_provider_withholding_its_next_works_does_not_cut_off_the_others_pay(market: ChainMarket) -> None:
    """Two rounds: round 0 opened and audited, then one provider never signs round 1's works (a griefer, or
    a buyer's accomplice: the close pays nothing for a round left pending, so the buyer would get round 0's
    budget back). At the deadline the market reveals round 0 alone and posts its quorum, then closes: every
    provider is paid round 0's slots and the verifiers their fees. (Before, the close at the deadline left
    round 0 pending and unpaid.)"""
    client = market.client
    api, order_id, view = opened(market)
    chain_order = view.chain_order_id
    escrow = escrow_of(market, chain_order)
    roster = market.service.rosters.roster(order_id)
    before = {a: earned(client, a) for a in [*view.providers, *roster.verifiers]}
    run_round(market, api, 0)
    drive(market)
    sign_all(market, 0)
    drive(market)
    market.service.orders.advance_orders()
    griefer = view.providers[0]
    for account in market.providers:  # every other provider hands in round 1's works
        works = [
            w for w in heartbeat(market, account) if w.phase == AssignmentPhase.RUN and w.round_index == 1
        ]
        if works and account.address != griefer:
            results = [opening(w, account.address)["result_digest"] for w in works]
            reply = api.post("/rosters/work", json=work_body(market, account, works, results))
            assert reply.status_code == 200
    drive(market)
    assert client.get_roster(chain_order).committed == 1  # round 1 never committed
    past_deadline(market, chain_order)
    drive(market)
    assert actions(market, order_id)[-1] == "reveal:0"
    assert [r.posting for r in client.audit_records(chain_order)] == [False, True]
    closes_paying_rounds(market, order_id, view, before, escrow, 1)


def test_a_forgery_whose_audit_lapses_at_the_deadline_is_judged_not_closed_away(market: ChainMarket) -> None:
    """A colluding pair opens one forged result for unit 1 of round 0 and then nobody sends round 1's works;
    the verifiers never answer the audit. Past the deadline the audit has lapsed: the market reveals round 0
    alone with verifiers (both units set aside) before any close, the pair is judged fraud and slashed, the
    honest pair paid by its verdict. (Before, the close at the deadline left round 0 pending: the forgery
    never judged, the honest pair unpaid.)"""
    client = market.client
    api, order_id, view = opened(market)
    chain_order = view.chain_order_id
    pair = {view.providers[view.slots[1 * REPLICAS + r]] for r in range(REPLICAS)}
    honest_pair = {view.providers[view.slots[0 * REPLICAS + r]] for r in range(REPLICAS)}
    stakes = {p: client.stake_of(p).bonded for p in pair}
    before = {p: earned(client, p) for p in honest_pair}
    run_round(market, api, 0, forge_unit_1)
    drive(market)
    assert audit_rows(market) == [(0, "collecting", 0)]
    past_deadline(market, chain_order)
    drive(market)
    assert actions(market, order_id)[-2:] == ["reveal:0", "close"]  # the close waits for the verdicts
    info = client.get_roster(chain_order)
    assert (info.closed, info.set_aside_units, info.open_set_aside) == (False, SHARDS, SHARDS)
    unit0, unit1 = trains(api, order_id, 0)
    judge(market, unit0, lambda _: Outcome.ACCEPT)
    judge(market, unit1, lambda _: Outcome.FRAUD)
    settle_held_and_close(market, chain_order)
    for provider in pair:
        assert client.reputation(provider).fraud == 1
        assert client.stake_of(provider).bonded < stakes[provider]
    price = client.get_order(chain_order).price_per_replica
    for provider in honest_pair:
        assert earned(client, provider) - before[provider] == price


def test_a_pending_round_nobody_can_judge_is_closed_unpaid_a_verdict_window_after_its_reveal_queued(
    market: ChainMarket,
) -> None:
    """As above, but every verifier is offline past the deadline: the step revealing round 0 needs verifiers
    for its set-aside units and none can be drawn, so it is retried; a `verdictWindow` after it was queued the
    market closes the roster with round 0 pending (unpaid), so that the budget and every lock come back."""
    client = market.client
    api, order_id, view = opened(market)
    chain_order = view.chain_order_id
    escrow = escrow_of(market, chain_order)
    roster = market.service.rosters.roster(order_id)
    run_round(market, api, 0, forge_unit_1)
    drive(market)
    client.advance_time(
        client.get_order(chain_order).deadline + client.params.reveal_window + 1 - client.now()
    )
    market.service.agents.sweep()  # nobody heartbeats: every verifier is offline
    drive(market)
    assert actions(market, order_id)[-1] == "reveal:0"
    assert not client.get_roster(chain_order).closed  # retried: a verifier may come back
    client.advance_time(client.params.verdict_window + 1)
    market.service.agents.sweep()
    drive(market)
    info = client.get_roster(chain_order)
    assert (info.closed, info.pending_block != 0, info.set_aside_units) == (True, True, 0)
    parties = [*roster.providers, *roster.verifiers]
    assert [client.stake_of(p).locked for p in parties] == [0] * len(parties)
    order = client.get_order(chain_order)
    assert (order.balance, order.open_units, order.delivered) == (escrow, 0, 0)
