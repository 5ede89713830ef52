"""The market's way past pending round audits (market/rosters.py `_past_pending`, market/roster_outbox.py) on
the real contracts (in-process EVM), every unit drawn, 2 x 2, k = 2, 2 roster verifiers.

Steps are permissionless, so anyone holding a round's openings may reveal it before the market, without
verifiers: its drawn units are then pending on chain whether or not the market holds its verifiers'
quorum. The market waits while the round's audit collects (the verifiers still sign: the same record) and
goes on as usual; on a refusal or no quorum it sets the record aside for verdicts (the cheat slashed, the
honest paid); past the order's deadline + verdictWindow with nobody to judge them it drops them and closes.
A close is sent once, after the last posting's challenge window."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from earned import earned
from eth_account.signers.local import LocalAccount

from apps.protocol_harness import ChainMarket
from tests.market.test_chain_settlement import chain_market
from tests.market.test_roster_api import REPLICAS, ROUNDS, SHARDS
from tests.market.test_roster_audits import (
    audit_rows,
    close_attempts,
    forge_unit_1,
    jobs,
    refusal,
    sign_all,
    submission,
)
from tests.market.test_roster_liveness import actions, judge, opened, run_round, runs_of, trains
from tests.market.test_roster_settlement import drive
from veritrain.chain.client import Outcome, Reveal
from veritrain.chain.deployment import MarketParams

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
