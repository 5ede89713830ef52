"""Round audits in the market (market/round_audits.py) on the real contracts (in-process EVM): a roster opens
with verifiers, each round's drawn units are audited off chain by them before the next round starts from
them, the step revealing an audited round leaves them pending and the last step posts one quorum over
every pending round; the verifiers are paid at close. A refusal sets the round's drawn units aside for a
verdict; a forged, duplicate or short signature set is refused and changes nothing; nothing is lost when
the worker restarts between collecting and posting. Every unit is drawn here (rate 10⁶ ppm)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from earned import earned
from eth_account.signers.local import LocalAccount

from apps.protocol_harness import ChainMarket
from market.chain_adapter import ChainClientSettlement
from market.ports import RegistryRecipeCatalog
from market.service import MarketService
from market.store import RoundAuditRow, RoundAuditVoteRow
from tests.market.test_chain_settlement import chain_market
from tests.market.test_roster_api import REPLICAS, ROUNDS, SHARDS, opening
from tests.market.test_roster_liveness import actions, judge, opened, run_round, runs_of, trains
from tests.market.test_roster_settlement import drive
from verifier.round_audit import RoundAuditRefused, audit_records
from veritrain.chain.client import Outcome
from veritrain.chain.deployment import MarketParams
from veritrain.errors import InvalidInput, InvalidSignature, NotFound, ReplayedMessage
from veritrain.messages import (
    Assignment,
    Heartbeat,
    RoundAuditJob,
    RoundAuditRefusal,
    RoundAuditSubmission,
    sign_message,
)

pytestmark = pytest.mark.chain

UNITS = (1 << SHARDS) - 1  # every unit of a round drawn


@pytest.fixture
def market(tmp_path: Path) -> Iterator[ChainMarket]:
    params = MarketParams(
        min_verifiers=1, spot_check_ppm=1_000_000, solo_spot_check_ppm=1_000_000, probation_streak=0
    )
    with chain_market(tmp_path, params, 4) as m:
        yield m


def jobs(market: ChainMarket, verifier: LocalAccount) -> list[RoundAuditJob]:
    beat = Heartbeat(agent=verifier.address, nonce=next(market.nonces), timestamp=market.now())
    signed = sign_message(beat, verifier.key, market.client.chain_id)
    return list(market.service.rosters.audits.jobs(signed, market.service.orders.unit_work).audits)


def submission(market: ChainMarket, verifier: LocalAccount, job: RoundAuditJob) -> RoundAuditSubmission:
    """The verifier's answer as its agent computes it: the records recomputed from the chain, signed."""
    records = audit_records(market.client, job, verifier.address)
    signature = market.client.round_audit_signature(verifier, job.chain_order_id, records)
    return RoundAuditSubmission(
        order_id=job.order_id,
        round_index=job.round_index,
        verifier=verifier.address,
        records="0x" + records.hex(),
        signature="0x" + signature.hex(),
    )


def sign_all(market: ChainMarket, round_index: int) -> None:
    for verifier in market.verifiers:
        (job,) = jobs(market, verifier)
        assert job.round_index == round_index and job.units == UNITS
        assert [view.shard for view in job.jobs] == list(range(SHARDS))
        market.service.rosters.audits.submit(submission(market, verifier, job))


def refusal(market: ChainMarket, verifier: LocalAccount, job: RoundAuditJob, nonce: int) -> Any:
    message = RoundAuditRefusal(
        agent=verifier.address,
        nonce=nonce,
        timestamp=market.now(),
        order_id=job.order_id,
        round_index=job.round_index,
        reason="unit 1: outcomes (2, 2)",
    )
    return sign_message(message, verifier.key, market.client.chain_id)


def audit_rows(market: ChainMarket) -> list[tuple[int, str, int]]:
    with market.store.transaction() as session:
        audits = session.exec(RoundAuditRow.__table__.select()).all()
        votes = session.exec(RoundAuditVoteRow.__table__.select()).all()
        return [(a.round_index, a.state, sum(v.audit_id == a.id for v in votes)) for a in audits]


def close_attempts(market: ChainMarket, order_id: int) -> tuple[int, str | None]:
    """How many times the market tried its close of the order's roster, and its last error."""
    with market.store.transaction() as session:
        roster = market.store.roster_of_order(session, order_id)
        assert roster is not None
        close = market.store.roster_action(session, roster.id or 0, "close")
        assert close is not None
        return close.attempts, close.last_error


def gas_of(market: ChainMarket, order_id: int) -> int:
    """Gas of every roster transaction the market sent for the order (their receipts)."""
    with market.store.transaction() as session:
        roster = market.store.roster_of_order(session, order_id)
        assert roster is not None
        hashes = [a.tx_hash for a in market.store.roster_actions_of(session, roster.id) if a.tx_hash]
    return sum(int(market.client.w3.eth.get_transaction_receipt(h)["gasUsed"]) for h in hashes)


def test_audited_rounds_pend_and_one_posting_pays_the_verifiers_at_close(market: ChainMarket) -> None:
    client = market.client
    verifier_earned = {v.address: earned(client, v) for v in market.verifiers}
    locked = {v.address: client.stake_of(v).locked for v in market.verifiers}
    api, order_id, view = opened(market)
    roster = market.service.rosters.roster(order_id)
    assert set(roster.verifiers) == {v.address for v in market.verifiers}  # inside the Accepts' key
    collateral = client.params.verifier_collateral
    assert all(client.stake_of(v).locked == locked[v.address] + collateral for v in market.verifiers)
    earned_before = {p: earned(client, p) for p in view.providers}

    run_round(market, api, 0)
    drive(market)  # round 0 committed; every unit drawn: its audit opens, nothing is sent meanwhile
    assert actions(market, order_id) == ["open", "step:0"]
    assert audit_rows(market) == [(0, "collecting", 0)]
    market.service.orders.advance_orders()
    assert runs_of(market, 1) == []  # no drawn result used before its audit
    sign_all(market, 0)
    assert audit_rows(market) == [(0, "signed", 2)]
    drive(market)
    market.service.orders.advance_orders()
    assert [u["state"] for u in trains(api, order_id, 0)] == ["accepted"] * SHARDS
    run_round(market, api, 1)  # round 1 starts from the audited results
    drive(market)  # step 1 reveals round 0 (left pending, no signatures) and commits round 1
    info = client.get_roster(view.chain_order_id)
    assert (info.committed, info.set_aside_units) == (2, 0)
    assert [int(r.info) & 0xFF for r in client.audit_records(view.chain_order_id)] == [UNITS]
    sign_all(market, 1)
    drive(market)  # the last step reveals round 1 and posts one quorum over both rounds
    records = client.audit_records(view.chain_order_id)
    assert [r.posting for r in records] == [False, False, True]
    # the posting's challenge window runs first: the close is planned for after it, not sent to revert
    assert actions(market, order_id) == ["open", "step:0", "step:1", "step:2"]
    assert client.get_roster(view.chain_order_id).set_aside_units == 0
    assert not client.get_roster(view.chain_order_id).closed
    client.advance_time(client.params.verdict_window + 1)
    market.heartbeats()
    drive(market)
    assert client.get_roster(view.chain_order_id).closed
    assert close_attempts(market, order_id) == (1, None)  # one close, sent once
    order = client.get_order(view.chain_order_id)
    fee = order.verifier_fee_per_unit // len(roster.verifiers)
    for verifier in market.verifiers:
        assert earned(client, verifier) - verifier_earned[verifier.address] == ROUNDS * SHARDS * fee
        assert client.stake_of(verifier).locked == locked[verifier.address]
    for provider in view.providers:
        slots = view.slots.count(view.providers.index(provider))
        assert earned(client, provider) - earned_before[provider] == ROUNDS * slots * order.price_per_replica
    market.service.orders.advance_orders()
    status = api.get(f"/orders/{order_id}").json()  # no aggregate unit: the buyer runs the last outer step
    assert (status["state"], status["rounds_accepted"]) == ("completed", ROUNDS)
    units = ROUNDS * SHARDS
    print(f"market's roster gas: {gas_of(market, order_id)} for {units} units")


def forge_unit_1(provider: str, work: Assignment) -> dict[str, Any] | None:
    """The opening a provider of unit 1 sends when the pair holding it colludes: another shard's result,
    identical for both replicas (unanimous, so only a re-execution tells); every other unit opens honestly."""
    body = opening(work, provider)
    if work.shard != 1:
        return body
    forged = opening(work.model_copy(update={"shard": 9}), provider)
    return {**body, **{k: forged[k] for k in ("state_digest", "transcript_root", "result_digest")}}


def test_a_refused_audit_sets_the_drawn_units_aside_and_the_forgery_is_slashed(market: ChainMarket) -> None:
    """Two colluding providers open one forged result for unit 1 (unanimous, so only a re-execution tells):
    a verifier refuses the round; its drawn units are set aside with verifiers, judged, the pair slashed."""
    client = market.client
    api, order_id, view = opened(market)
    pair = {view.providers[view.slots[1 * REPLICAS + r]] for r in range(REPLICAS)}

    run_round(market, api, 0, forge_unit_1)
    drive(market)
    first, second = market.verifiers
    (job,) = jobs(market, first)
    market.service.rosters.audits.submit(submission(market, first, job))  # the lazy one signs
    market.service.rosters.audits.refuse(refusal(market, second, job, next(market.nonces)))
    assert audit_rows(market) == [(0, "refused", 2)]
    with pytest.raises(InvalidInput):  # it answered already: no second answer
        market.service.rosters.audits.submit(submission(market, second, job))
    drive(market)  # round 0 revealed alone, both drawn units set aside
    assert actions(market, order_id) == ["open", "step:0", "reveal:0"]
    info = client.get_roster(view.chain_order_id)
    assert (info.set_aside_units, client.audit_records(view.chain_order_id)) == (SHARDS, [])
    market.service.orders.advance_orders()
    assert runs_of(market, 1) == []
    stakes = {p: client.stake_of(p).bonded for p in pair}
    unit0, unit1 = trains(api, order_id, 0)
    judge(market, unit0, lambda _: Outcome.ACCEPT)
    judge(market, unit1, lambda _: Outcome.FRAUD)
    client.advance_time(client.params.verdict_window + client.deployment.appeal_params.appeal_window + 1)
    market.heartbeats()
    market.send_outbox()
    market.service.sync.sync_chain_events()
    for provider in pair:
        assert client.reputation(provider).fraud == 1
        assert client.stake_of(provider).bonded < stakes[provider]


def test_forged_duplicate_and_short_signature_sets_are_refused_and_change_nothing(
    market: ChainMarket,
) -> None:
    api, order_id, _ = opened(market)
    run_round(market, api, 0)
    drive(market)
    first, second = market.verifiers
    (job,) = jobs(market, first)
    audits = market.service.rosters.audits
    honest = submission(market, first, job)
    outsider = market.providers[0]  # not a roster verifier
    forged = honest.model_copy(update={"signature": submission(market, second, job).signature})
    wrong_chain = honest.model_copy(update={"records": "0x" + "11" * 32})
    for bad, error in (
        (forged, InvalidSignature),  # another verifier's signature under first's name
        (wrong_chain, InvalidInput),  # a chain that is not the round's
        (honest.model_copy(update={"verifier": outsider.address}), InvalidInput),
        (honest.model_copy(update={"round_index": 1}), NotFound),
    ):
        with pytest.raises(error):
            audits.submit(bad)
    assert audit_rows(market) == [(0, "collecting", 0)]
    assert audits.submit(honest) == "collecting"
    assert audits.submit(honest) == "collecting"  # the same again: a no-op
    other = market.client.round_audit_signature(first, job.chain_order_id, bytes.fromhex("22" * 32))
    with pytest.raises(InvalidInput):  # another answer from the same verifier
        audits.submit(
            honest.model_copy(update={"records": "0x" + "22" * 32, "signature": "0x" + other.hex()})
        )
    assert audit_rows(market) == [(0, "collecting", 1)]
    drive(market)  # a short set (one of two) holds the round: nothing is sent, nothing used
    assert actions(market, order_id) == ["open", "step:0"]
    nonce = next(market.nonces)
    audits.refuse(refusal(market, second, job, nonce))
    with pytest.raises(ReplayedMessage):
        audits.refuse(refusal(market, second, job, nonce))
    assert audit_rows(market) == [(0, "refused", 2)]


def test_the_verifier_refuses_to_sign_what_the_chain_does_not_say(market: ChainMarket) -> None:
    api, _, _ = opened(market)
    run_round(market, api, 0)
    drive(market)
    verifier = market.verifiers[0]
    (job,) = jobs(market, verifier)
    audit_records(market.client, job, verifier.address)  # the honest job passes
    opening0 = job.openings[0].model_copy(update={"result_digest": "0x" + "33" * 32})
    for tampered in (
        job.model_copy(update={"openings": (opening0, *job.openings[1:])}),  # not the committed opening
        job.model_copy(update={"pending": "0x" + "44" * 32}),  # not the chain's pending audit chain
        job.model_copy(update={"units": 1}),  # not the chain's draw
        job.model_copy(update={"jobs": job.jobs[:1]}),  # a drawn unit left unchecked
        job.model_copy(update={"round_index": 1}),
    ):
        with pytest.raises(RoundAuditRefused):
            audit_records(market.client, tampered, verifier.address)
    with pytest.raises(RoundAuditRefused):
        audit_records(market.client, job, market.providers[0].address)


def test_an_audit_without_a_quorum_by_its_deadline_sets_the_units_aside(market: ChainMarket) -> None:
    api, order_id, _ = opened(market)
    run_round(market, api, 0)
    drive(market)
    (job,) = jobs(market, market.verifiers[0])
    market.service.rosters.audits.submit(submission(market, market.verifiers[0], job))
    market.client.advance_time(market.service.ctx.config.round_audit_timeout_s + 1)
    market.heartbeats()
    drive(market)
    assert audit_rows(market) == [(0, "refused", 1)]
    assert actions(market, order_id) == ["open", "step:0", "reveal:0"]
    assert market.client.get_roster(market.service.rosters.view(order_id).chain_order_id).set_aside_units == 2


def test_signatures_collected_before_a_restart_are_posted_after_it(market: ChainMarket) -> None:
    client = market.client
    api, _, view = opened(market)
    for round_index in range(ROUNDS):
        run_round(market, api, round_index)
        drive(market)
        sign_all(market, round_index)
        if round_index + 1 < ROUNDS:
            drive(market)
            market.service.orders.advance_orders()
    # the worker restarts between collecting round 1's quorum and sending the posting step
    market.service = MarketService(
        market.store,
        RegistryRecipeCatalog(),
        ChainClientSettlement(client),
        market.service.ctx.config,
        clock=market.now,
    )
    drive(market)
    records = client.audit_records(view.chain_order_id)
    assert [r.posting for r in records] == [False, False, True]
    client.advance_time(client.params.verdict_window + 1)
    market.heartbeats()
    drive(market)
    assert client.get_roster(view.chain_order_id).closed
