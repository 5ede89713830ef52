"""The round path through the market's HTTP API and its training plane (in-process EVM, the real market
service behind FastAPI's TestClient): providers learn their roster slots from their heartbeats, hand in
their Accept, works and openings at /rosters/*, each round's units start from the round before as a folded
order's do, and the order completes with its last round (the buyer runs the last outer step itself: no
aggregate unit on the per-unit path). Every refusal is typed
and leaves the market's state as it was."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from eth_account.signers.local import LocalAccount
from fastapi.testclient import TestClient
from sqlmodel import col, select

from apps.protocol_harness import ChainMarket
from market.api import create_app
from market.store import RosterAcceptRow, RosterWorkRow
from tests.market.test_chain_settlement import chain_market
from tests.market.test_roster_settlement import drive
from veritrain.chain.deployment import MarketParams
from veritrain.chain.eip712 import round_unit_id
from veritrain.diloco import Fold, folded_result_digest
from veritrain.messages import Assignment, AssignmentPhase, Heartbeat, sign_message
from veritrain.pol import result_digest

pytestmark = pytest.mark.chain

ROUNDS, SHARDS, REPLICAS = 2, 2, 2
SALT = "0x" + "5a" * 32


@pytest.fixture
def market(tmp_path: Path) -> Iterator[ChainMarket]:
    params = MarketParams(min_verifiers=1, spot_check_ppm=0, solo_spot_check_ppm=0, probation_streak=0)
    with chain_market(tmp_path, params, 4) as m:
        yield m


@pytest.fixture
def api(market: ChainMarket) -> TestClient:
    return TestClient(create_app(market.service))


def h(label: str) -> str:
    return "0x" + hashlib.sha256(label.encode()).hexdigest()


def heartbeat(market: ChainMarket, account: LocalAccount) -> list[Assignment]:
    beat = Heartbeat(agent=account.address, nonce=next(market.nonces), timestamp=market.now())
    reply = market.service.agents.heartbeat(sign_message(beat, account.key, market.client.chain_id))
    return list(reply.assignments)


def rostered_order(market: ChainMarket) -> int:
    """A folded 2 x 2 order (k = 2) on the round path, its roster drawn and its first round's units open."""
    order_id = market.post_order(
        rounds=ROUNDS, settlement="rounds", shards=SHARDS, outer_step="folded", replicas=REPLICAS
    )
    market.heartbeats()
    assert market.service.rosters.draw_pending() == 1
    market.service.orders.advance_orders()
    return order_id


def opening(work: Assignment, provider: str) -> dict[str, Any]:
    """A replica's honest-looking opening of `work`: its state bound to its result digest (and, from round
    1 on, to the outer step it names), the same for every replica of the unit."""
    state, root = h(f"state {work.round_index} {work.shard}"), h(f"root {work.round_index} {work.shard}")
    trained = result_digest(bytes.fromhex(state[2:]), bytes.fromhex(root[2:]))
    body: dict[str, Any] = {"state_digest": state, "transcript_root": root}
    if work.folds:
        fold = Fold(bytes.fromhex(h(f"round {work.round_index}")[2:]), bytes.fromhex(h("inputs")[2:]))
        trained = folded_result_digest(trained, fold)
        body |= {"round_state_digest": "0x" + fold.round_state_digest.hex(), "inputs_commitment": h("inputs")}
    return {
        "order_id": work.order_id,
        "provider": provider,
        "round_index": work.round_index,
        "unit": work.shard,
        "result_digest": "0x" + trained.hex(),
        "salt": SALT,
        **body,
    }


def work_body(
    market: ChainMarket, account: LocalAccount, works: Sequence[Assignment], results: Sequence[str]
) -> dict[str, Any]:
    """A provider's work for a round: the commitments of `works` (its slots of the round, taken in slot
    order) over `results`, and one `RoundCommit` signature of `account` over them."""
    ordered = sorted(zip(works, results, strict=True), key=lambda pair: pair[0].shard)
    first = ordered[0][0]
    assert first.commit_deadline is not None
    commitments = []
    for work, result in ordered:
        assert work.chain_unit_id is not None
        commitment = market.client.commitment(result, SALT, account.address, work.chain_unit_id)
        commitments.append("0x" + commitment.hex())
    signature = market.client.round_commit_signature(
        account, first.chain_order_id, first.round_index, commitments, first.commit_deadline
    )
    return {
        "order_id": first.order_id,
        "provider": account.address,
        "round_index": first.round_index,
        "commitments": commitments,
        "signature": "0x" + signature.hex(),
    }


def round_body(market: ChainMarket, account: LocalAccount, round_index: int) -> dict[str, Any] | None:
    """`account`'s work for every slot it runs in `round_index` (None: it runs none now), each over the
    result it would open."""
    works = [
        w
        for w in heartbeat(market, account)
        if w.phase == AssignmentPhase.RUN and w.round_index == round_index
    ]
    if not works:
        return None
    assert {w.round_units for w in works} == {tuple(sorted(w.shard for w in works))}
    return work_body(market, account, works, [opening(w, account.address)["result_digest"] for w in works])


def accept_all(market: ChainMarket, api: TestClient) -> None:
    """Every provider with an ACCEPT assignment signs the roster's Accept once and hands it in twice (a
    retry is a no-op)."""
    for account in market.providers:
        accepts = [a for a in heartbeat(market, account) if a.phase == AssignmentPhase.ACCEPT]
        if not accepts:
            continue
        first = accepts[0]
        assert {a.unit_key for a in accepts} == {first.unit_key} and first.settlement == "rounds"
        signed = market.client.sign_accept(
            account, first.chain_order_id, first.unit_key, first.accept_deadline
        )
        body = {
            "order_id": first.order_id,
            "provider": account.address,
            "nonce": signed.nonce,
            "deadline": first.accept_deadline,
            "signature": "0x" + signed.signature.hex(),
        }
        for _ in range(2):
            assert api.post("/rosters/accept", json=body).status_code == 200


def run_round(market: ChainMarket, api: TestClient, round_index: int) -> list[Assignment]:
    """Every slot of `round_index` trains (pretends to), commits over the market's works deadline, then,
    once its unit's every slot committed, opens; returns the RUN assignments seen."""
    runs: list[Assignment] = []
    for account in market.providers:
        runs += [
            w
            for w in heartbeat(market, account)
            if w.phase == AssignmentPhase.RUN and w.round_index == round_index
        ]
        body = round_body(market, account, round_index)
        if body is not None:
            assert api.post("/rosters/work", json=body).status_code == 200, body
    for account in market.providers:
        for work in heartbeat(market, account):
            assert work.phase == AssignmentPhase.REVEAL and work.round_index == round_index
            reply = api.post("/rosters/opening", json=opening(work, account.address))
            assert reply.status_code == 200, reply.json()
    return runs


def test_a_rounds_order_runs_its_folded_rounds_through_the_api_and_completes_with_its_last_round(
    market: ChainMarket, api: TestClient
) -> None:
    order_id = rostered_order(market)
    roster = api.get(f"/orders/{order_id}/roster").json()
    assert roster["state"] == "accepting" and roster["rounds"] == ROUNDS
    accept_all(market, api)
    assert drive(market) == ["sent"]  # openRoster
    for round_index in range(ROUNDS):
        runs = run_round(market, api, round_index)
        assert len(runs) == SHARDS * REPLICAS
        view = market.service.rosters.view(order_id)
        for work in runs:
            assert work.settlement == "rounds" and work.unit_key == view.roster_key
            assert work.chain_unit_id == round_unit_id(view.chain_order_id, round_index, work.shard)
            assert work.commit_deadline == view.works_deadline
            # round r >= 1 folds round r-1's outer step over its accepted results, as a folded order does
            assert work.folds == (round_index >= 1)
            if work.folds:
                assert all(source is not None for source in work.shard_results)
                assert work.previous is not None
        drive(market)
        market.service.orders.advance_orders()
    drive(market)  # the last round revealed, the roster closed
    status = api.get(f"/orders/{order_id}").json()
    assert status["roster"]["state"] == "closed"
    assert (status["roster"]["committed"], status["roster"]["revealed"]) == (ROUNDS, ROUNDS)
    trains = [u for u in status["units"] if u["kind"] == "train"]
    assert len(trains) == ROUNDS * SHARDS and all(u["state"] == "accepted" for u in trains)
    assert all(u["chain_unit_id"] is None for u in trains)  # settled by the roster, not per unit
    # no aggregate unit: the buyer runs the last outer step itself (the escrow's R·M + 1-th unit is the
    # reserve for a retry, refunded at close)
    assert not [u for u in status["units"] if u["kind"] == "aggregate"]
    assert (status["state"], status["rounds_accepted"]) == ("completed", ROUNDS)
    # the last round's state is the one its units reported (their outer step): the buyer's final step's start
    assert status["current_state_digest"] == h(f"round {ROUNDS - 1}")


def held(market: ChainMarket) -> tuple[int, int, list[tuple[Any, ...]]]:
    """What the round path holds: Accepts, works and their openings."""
    with market.store.transaction() as session:
        accepts = len(session.exec(select(RosterAcceptRow)).all())
        works = session.exec(select(RosterWorkRow).order_by(col(RosterWorkRow.id))).all()
        return accepts, len(works), [(w.slot, w.commitment, w.result_digest, w.salt) for w in works]


def test_the_roster_endpoints_refuse_bad_input_with_a_typed_error_and_change_nothing(
    market: ChainMarket, api: TestClient
) -> None:
    order_id = rostered_order(market)
    accounts = {a.address: a for a in market.providers}
    # the draw is the chain's (seeded by a block hash): take the roster's own providers
    view = market.service.rosters.view(order_id)
    first_account, other = (accounts[p] for p in view.providers[:2])
    (first,) = [a for a in heartbeat(market, first_account) if a.phase == AssignmentPhase.ACCEPT][:1]
    signed = market.client.sign_accept(
        first_account, first.chain_order_id, first.unit_key, first.accept_deadline
    )
    accept = {
        "order_id": order_id,
        "provider": first_account.address,
        "nonce": signed.nonce,
        "deadline": first.accept_deadline,
        "signature": "0x" + signed.signature.hex(),
    }
    before = held(market)
    refusals = [
        ("/rosters/accept", {**accept, "provider": other.address}, 401, "InvalidSignature"),
        ("/rosters/accept", {**accept, "order_id": order_id + 7}, 404, "NotFound"),
        ("/rosters/accept", {**accept, "provider": market.verifiers[0].address}, 400, "InvalidInput"),
        ("/rosters/accept", {**accept, "signature": "0x12"}, 422, None),
    ]
    for path, body, code, error in refusals:
        reply = api.post(path, json=body)
        assert reply.status_code == code, (body, reply.json())
        if error is not None:
            assert reply.json()["error"] == error
        assert held(market) == before
    accept_all(market, api)
    assert drive(market) == ["sent"]
    runs = {
        account.address: [w for w in heartbeat(market, account) if w.phase == AssignmentPhase.RUN]
        for account in market.providers
    }
    provider, works = next((p, w) for p, w in runs.items() if w)
    work = works[0]
    account = accounts[provider]
    results = [opening(w, provider)["result_digest"] for w in works]
    good = work_body(market, account, works, results)
    stranger = next(a for a in market.providers if a.address != provider)
    before = held(market)
    refusals = [
        # signed by another key than the slots' provider, or by it for another round, order or results
        (
            "/rosters/work",
            {**good, "signature": work_body(market, stranger, works, results)["signature"]},
            401,
        ),
        ("/rosters/work", {**good, "round_index": work.round_index + 1}, 401),
        (
            "/rosters/work",
            {**good, "signature": work_body(market, account, works, [h("x")] * len(works))["signature"]},
            401,
        ),
        ("/rosters/work", {**good, "order_id": order_id + 7}, 404),
        # not one commitment per slot the provider holds in the round, and a round outside the roster
        ("/rosters/work", {**good, "commitments": [*good["commitments"], good["commitments"][0]]}, 400),
        ("/rosters/work", {**good, "round_index": ROUNDS}, 400),
        # an opening before any work, and with an unbound state
        ("/rosters/opening", opening(work, provider), 409),
    ]
    for path, body, code in refusals:
        reply = api.post(path, json=body)
        assert reply.status_code == code, (path, body, reply.json())
        assert held(market) == before
    assert api.post("/rosters/work", json=good).status_code == 200
    assert api.post("/rosters/work", json=good).status_code == 200  # the same again: a retry, no change
    before = held(market)
    conflicting = work_body(market, account, works, [h("another result")] * len(works))
    reply = api.post("/rosters/work", json=conflicting)
    assert (reply.status_code, reply.json()["error"]) == (400, "InvalidInput")
    unbound = {**opening(work, provider), "state_digest": h("not the trained state")}
    reply = api.post("/rosters/opening", json=unbound)
    assert (reply.status_code, reply.json()["error"]) == (400, "InvalidInput")
    other_salt = {**opening(work, provider), "salt": "0x" + "77" * 32}
    reply = api.post("/rosters/opening", json=other_salt)
    assert (reply.status_code, reply.json()["error"]) == (400, "InvalidInput")
    assert held(market) == before
    assert api.get(f"/orders/{order_id + 7}/roster").status_code == 404
