"""The market API end to end over HTTP (FastAPI TestClient) on SQLite and PostgreSQL, with the chain double.

Covers the whole unit lifecycle (match → accept → assign → commit → reveal → finalize / verify → next
round), migration away from a silent provider, settlement idempotency, and the bad-input contract:
a 4xx with a clear message and no state change.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

import pytest
from agents import CHAIN_ID, Clock, chain_order_for, order_spec
from chain_double import DEFAULT_FREE_STAKE, LedgerChain
from fastapi.testclient import TestClient
from market_flow import (
    ROOT,
    accept_offered,
    bound,
    drain_outbox,
    post_order,
    pull,
    register_market,
    run_proposed_units,
    run_unit,
    snapshot,
    verdict_body,
)

from market.api import create_app
from market.context import MarketConfig, Triggers
from market.domain.replication import ReplicationPolicy
from market.outbox import backoff_s
from market.service import MarketService
from market.store import MarketStore
from veritrain.api_client import MarketClient
from veritrain.chain.eip712 import commitment
from veritrain.messages import EvidenceRequest, Heartbeat, OrderRequest, Signed, sign_message


@pytest.fixture
def client(service: MarketService) -> TestClient:
    return TestClient(create_app(service))


def no_audit(service: MarketService, rate_ppm: int = 0) -> None:
    """Replication settings for these tests; `rate_ppm` is the chain's spot-check rate (0 or 100 %)."""
    chain = service.ctx.chain
    assert isinstance(chain, LedgerChain)
    chain.spot_check_ppm = rate_ppm
    service.config = MarketConfig(
        chain_id=CHAIN_ID,
        min_verifiers=1,
        verifiers_per_unit=2,
        policy=ReplicationPolicy(base_audit_ppm=rate_ppm, trusted_audit_ppm=rate_ppm),
    )


def test_two_round_order_runs_to_completion_on_the_fast_path(
    client: TestClient, service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    no_audit(service)
    providers, _ = register_market(client, make_agent)
    keys = {k.address: k for k in providers}
    order = post_order(client, ledger, make_agent(), clock)
    assert order["state"] == "open" and order["rounds_total"] == 2

    digests = ["0x" + "a1" * 32, "0x" + "b2" * 32]
    for round_index, digest in enumerate(digests):
        (match,) = service.matching.match_pending()
        assert match.complete and len(match.selected) == 3
        if round_index == 1:  # the next unit starts from the accepted state, served by its producers
            (assignment,) = pull(client, keys[match.selected[0]])
            assert assignment["start_state"]["state_digest"] == digests[0]
            assert assignment["start_state"]["holders"] and assignment["start_step"] == 20
        unit_id = run_unit(client, service, keys, {"default": digest})
        status = client.get(f"/orders/{order['order_id']}").json()
        unit = next(u for u in status["units"] if u["unit_id"] == unit_id)
        assert unit["state"] == "accepted" and unit["accepted_state_digest"] == digest
        assert service.orders.advance_orders() == 1

    final = client.get(f"/orders/{order['order_id']}").json()
    assert final["state"] == "completed" and final["rounds_accepted"] == 2
    assert final["current_state_digest"] == digests[-1]
    assert len(ledger.effects("UnitFinalized")) == 2
    # where the buyer fetches results: the libp2p address each provider of the order announced
    peers = client.get(f"/orders/{order['order_id']}/peers").json()["peers"]
    ran = {p for unit in final["units"] for p in unit["providers"]}
    assert peers == {p: f"/ip4/127.0.0.1/tcp/4001/p2p/{p}" for p in ran}
    assert len(ledger.effects("UnitAssigned")) == 2


@dataclass(frozen=True)
class Dispute:
    """A one-round order whose unit's replicas disagreed (one cheat), pulled by its assigned verifiers."""

    providers: list[Any]
    verifiers: list[Any]
    cheat: str
    unit_id: int
    job: dict[str, Any]
    signers: list[Any]  # the verifiers the job went to


def disputed_unit(
    client: TestClient, service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> Dispute:
    no_audit(service)
    providers, verifiers = register_market(client, make_agent)
    keys = {k.address: k for k in providers}
    post_order(client, ledger, make_agent(), clock, total_steps=20)
    (match,) = service.matching.match_pending()
    cheat = match.selected[1]
    unit_id = run_unit(client, service, keys, {"default": "0x" + "11" * 32, cheat: "0x" + "66" * 32})
    pulled = {}
    for verifier in verifiers:
        reply = client.post("/verification/jobs", json=verifier.heartbeat().model_dump(mode="json"))
        assert reply.status_code == 200
        pulled[verifier.address] = reply.json()["jobs"]
    (job,) = next(jobs for jobs in pulled.values() if jobs)
    signers = [v for v in verifiers if pulled[v.address]]
    return Dispute(providers, verifiers, cheat, unit_id, job, signers)


def test_disagreeing_replicas_go_to_verifiers_and_a_majority_with_different_reasons_settles(
    client: TestClient, service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    dispute = disputed_unit(client, service, ledger, make_agent, clock)
    cheat, job, signers, unit_id = dispute.cheat, dispute.job, dispute.signers, dispute.unit_id
    assert job["reason"] == "digests_differ" and len(job["replicas"]) == 3
    assert len(signers) == 2  # both assigned verifiers: a majority of two is two
    outcomes = [2 if r["provider"] == cheat else 0 for r in job["replicas"]]
    # Each verifier's reasons carry its own measurements, so their hashes differ; the outcomes agree.
    first = verdict_body(signers[0], job, outcomes, "0x" + "99" * 32, clock)
    assert client.post("/verification/verdict", json=first).status_code == 200
    drain_outbox(service)
    assert ledger.effects("VerdictRecorded") == []  # one of two is no majority
    second = verdict_body(signers[1], job, outcomes, "0x" + "98" * 32, clock)
    assert client.post("/verification/verdict", json=second).status_code == 200
    drain_outbox(service)
    (recorded,) = ledger.effects("VerdictRecorded")
    assert recorded["outcomes"] == outcomes
    status = service.orders.order_status(_order_id(service))
    unit = next(u for u in status.units if u.unit_id == unit_id)
    assert unit.state == "accepted"
    assert (
        service.orders.advance_orders() == 1
        and service.orders.order_status(_order_id(service)).state == "completed"
    )


def test_a_decided_unit_s_evidence_is_served_to_verifiers_for_an_appeal(
    client: TestClient,
    service: MarketService,
    store: MarketStore,
    ledger: LedgerChain,
    make_agent: Any,
    clock: Clock,
) -> None:
    """POST /verification/evidence: what a seated referee re-executes. Refused while the verifiers have not
    decided, to a non-verifier, for an unknown unit, and on a replayed nonce; nothing changes then."""
    dispute = disputed_unit(client, service, ledger, make_agent, clock)
    providers, verifiers, job = dispute.providers, dispute.verifiers, dispute.job

    def request(agent: Any, unit: int, nonce: int | None = None) -> Signed[EvidenceRequest]:
        message = EvidenceRequest(
            agent=agent.address,
            nonce=next(agent.nonces) if nonce is None else nonce,
            timestamp=clock.now,
            chain_unit_id=unit,
        )
        return sign_message(message, agent.account.key, CHAIN_ID)

    def ask(agent: Any, unit: int, nonce: int | None = None) -> Any:
        body = request(agent, unit, nonce).model_dump(mode="json")
        return client.post("/verification/evidence", json=body)

    referee = verifiers[-1]
    before = snapshot(store)
    undecided = ask(referee, job["chain_unit_id"])
    assert undecided.status_code == 409 and "no verdict yet" in undecided.json()["detail"]
    assert ask(providers[0], job["chain_unit_id"]).status_code == 400  # a provider is not a verifier
    assert ask(referee, job["chain_unit_id"] + 100).status_code == 404
    assert ask(referee, 2**256 - 1).status_code == 404  # the widest id the message allows
    assert snapshot(store) == before  # refused: not even the nonce was taken
    outcomes = [2 if r["provider"] == dispute.cheat else 0 for r in job["replicas"]]
    for signer in dispute.signers:
        body = verdict_body(signer, job, outcomes, "0x" + "99" * 32, clock)
        assert client.post("/verification/verdict", json=body).status_code == 200
    evidence = MarketClient(http=client).evidence(request(referee, job["chain_unit_id"]))  # typed reply
    assert evidence.reason == "appeal" and evidence.chain_unit_id == job["chain_unit_id"]
    assert evidence.job_id == job["job_id"]
    assert [r.model_dump(mode="json") for r in evidence.replicas] == job["replicas"]
    before = snapshot(store)
    assert ask(referee, job["chain_unit_id"], nonce=1).status_code == 409  # a replayed nonce
    assert snapshot(store) == before


def _order_id(service: MarketService) -> int:
    with service.store.transaction() as session:
        (order,) = service.store.orders_in(session, ["open", "running", "completed", "expired"])
        assert order.id is not None
        return order.id


def test_spot_check_sends_a_unanimous_unit_to_verification(
    client: TestClient, service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    no_audit(service, rate_ppm=1_000_000)
    providers, verifiers = register_market(client, make_agent)
    post_order(client, ledger, make_agent(), clock, total_steps=20, checkpoint_every=4)
    service.matching.match_pending()
    (offered,) = [a for k in providers for a in pull(client, k)][:1]
    assert (offered["shard"], offered["num_shards"], offered["steps"], offered["checkpoint_every"]) == (
        0,
        1,
        20,
        4,
    )
    unit_id = run_unit(client, service, {k.address: k for k in providers}, {"default": "0x" + "12" * 32})
    assert len(ledger.effects("VerificationRequested")) == 1
    assert not ledger.effects("UnitFinalized")
    # the market sent its finalize without asking first; the chain's refusal turned it into the spot check
    with service.store.transaction() as session:
        finalize = service.store.outbox_entry(session, unit_id, "finalize")
        assert finalize is not None and finalize.state == "reverted" and finalize.attempts == 1
        assert "UnitUnderVerification" in (finalize.last_error or "")
        assert service.store.get_unit(session, unit_id).state == "verifying"
    bodies = [v.heartbeat().model_dump(mode="json") for v in verifiers]
    replies = [client.post("/verification/jobs", json=body) for body in bodies]
    jobs = [job for reply in replies for job in reply.json()["jobs"]]
    assert jobs and {(j["shard"], j["num_shards"], j["checkpoint_every"]) for j in jobs} == {(0, 1, 4)}


def test_silent_provider_is_replaced_before_the_unit_goes_on_chain(
    client: TestClient, service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    providers, verifiers = register_market(client, make_agent)
    keys = {k.address: k for k in [*providers, *verifiers]}
    post_order(client, ledger, make_agent(), clock, total_steps=20)
    (match,) = service.matching.match_pending()
    lost = match.selected[0]
    clock.now += 20
    for address in keys:
        if address != lost:
            pull(client, keys[address])
    clock.now += 15  # the lost one is 35 s silent (> 30 s timeout), the others 15 s
    swept = service.agents.sweep()
    assert swept.lost_agents == [lost] and swept.dropped_replicas == 1
    (refill,) = service.matching.match_pending()
    assert refill.complete and len(refill.selected) == 1 and refill.selected[0] != lost
    status = service.orders.order_status(_order_id(service))
    assert lost not in status.units[0].providers and len(status.units[0].providers) == 3
    assert service.matching.match_pending() == []  # nothing left to match


def test_failed_unit_is_retried_under_a_new_unit_key(
    client: TestClient, service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    providers, _ = register_market(client, make_agent)
    keys = {k.address: k for k in providers}
    post_order(client, ledger, make_agent(), clock, total_steps=20)
    service.matching.match_pending()
    accept_offered(client, keys)
    drain_outbox(service)
    clock.now += 4000  # nobody commits; past commit + reveal + verdict windows
    for key in providers:
        pull(client, key)
    assert service.agents.sweep().expiring_units == 1
    drain_outbox(service)
    assert len(ledger.effects("UnitExpired")) == 1
    assert service.orders.advance_orders() == 1
    units = service.orders.order_status(_order_id(service)).units
    assert [u.state for u in units] == ["failed", "pending"] and units[1].attempt == 1


def test_settlement_intent_has_one_effect_when_sent_twice_or_concurrently(
    client: TestClient, service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    no_audit(service)
    providers, _ = register_market(client, make_agent)
    post_order(client, ledger, make_agent(), clock, total_steps=20)
    service.matching.match_pending()
    run_unit(client, service, {k.address: k for k in providers}, {"default": "0x" + "31" * 32})
    with service.store.transaction() as session:
        (finalize,) = [
            e for e in service.store.outbox_in(session, ["confirmed", "sent"]) if e.action == "finalize"
        ]
        entry_id = finalize.id
        # simulate a redelivered task whose first run crashed after sending but before recording
        finalize.state = "pending"
        session.add(finalize)
    assert entry_id is not None
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(service.outbox.send_outbox_entry(entry_id)))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(ledger.effects("UnitFinalized")) == 1  # the chain saw one finalize
    with service.store.transaction() as session:
        assert service.store.get_outbox(session, entry_id).state in ("confirmed", "sent")
    assert service.outbox.send_outbox_entry(entry_id).sent is False


def test_chain_events_confirm_what_another_relayer_did(
    client: TestClient, service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    providers, _ = register_market(client, make_agent)
    keys = {k.address: k for k in providers}
    post_order(client, ledger, make_agent(), clock, total_steps=20)
    service.matching.match_pending()
    accept_offered(client, keys)
    with service.store.transaction() as session:
        (entry,) = service.store.outbox_in(session, ["pending"])
        payload = json.loads(entry.payload_json)
    # someone else relays the same signatures first
    ledger.assign(payload["order_id"], payload["unit_key"], payload["providers"], payload["verifiers"], [])
    assert service.sync.sync_chain_events() == 2  # the order's posting, then that assignment
    status = service.orders.order_status(_order_id(service))
    assert status.units[0].state == "committing" and status.units[0].chain_unit_id == 1
    assert service.outbox.pending_outbox() == []
    assert len(ledger.effects("UnitAssigned")) == 1


# --- bad input: 4xx, a clear message, and nothing changes --------------------------------------------


def test_bad_input_is_refused_with_4xx_and_changes_nothing(
    client: TestClient,
    service: MarketService,
    store: MarketStore,
    ledger: LedgerChain,
    make_agent: Any,
    clock: Clock,
) -> None:
    providers, _ = register_market(client, make_agent)
    agent = providers[0]
    buyer = make_agent()
    good_heartbeat = agent.heartbeat()
    assert client.post("/agents/heartbeat", json=good_heartbeat.model_dump(mode="json")).status_code == 200

    spec = order_spec(buyer.address, clock)
    ledger.add_order(
        chain_order_for(spec, 5, price_per_replica=chain_order_for(spec, 5).price_per_replica - 1)
    )
    unknown = order_spec(buyer.address, clock, recipe="gpt-17")
    wrong_chain = sign_message(
        Heartbeat(agent=agent.address, nonce=10**6, timestamp=clock.now), agent.account.key, 1
    )
    forged = good_heartbeat.model_copy(
        update={"message": good_heartbeat.message.model_copy(update={"nonce": 10**6})}
    )
    stranger = make_agent()

    cases: list[tuple[str, str, Any, int, str]] = [
        (
            "malformed body",
            "/agents/heartbeat",
            {"message": {"agent": "0x12"}, "signature": "0x00"},
            422,
            "agent",
        ),
        (
            "extra field",
            "/agents/heartbeat",
            {**good_heartbeat.model_dump(mode="json"), "extra": 1},
            422,
            "extra",
        ),
        ("not json", "/orders", "{{{", 422, "JSON"),
        ("replayed heartbeat", "/agents/heartbeat", good_heartbeat.model_dump(mode="json"), 409, "nonce"),
        (
            "older timestamp",
            "/agents/heartbeat",
            agent.heartbeat(nonce=10**5, timestamp=clock.now - 1).model_dump(mode="json"),
            409,
            "older",
        ),
        ("other chain id", "/agents/heartbeat", wrong_chain.model_dump(mode="json"), 401, "signed by"),
        ("tampered message", "/agents/heartbeat", forged.model_dump(mode="json"), 401, "signed by"),
        (
            "unknown agent",
            "/agents/heartbeat",
            stranger.heartbeat().model_dump(mode="json"),
            404,
            "not registered",
        ),
        (
            "unknown recipe",
            "/orders",
            OrderRequest(spec=unknown, chain_order_id=6).model_dump(mode="json"),
            400,
            "unknown recipe",
        ),
        (
            "underfunded order",
            "/orders",
            OrderRequest(spec=spec, chain_order_id=5).model_dump(mode="json"),
            402,
            "need",
        ),
        (
            "no such chain order",
            "/orders",
            OrderRequest(spec=spec, chain_order_id=77).model_dump(mode="json"),
            400,
            "no order 77",
        ),
        (
            "negative price",
            "/orders",
            {"spec": {**spec.model_dump(mode="json"), "max_price_per_pflop": -1}, "chain_order_id": 5},
            422,
            "greater",
        ),
        (
            "uint256 overflow",
            "/orders",
            {"spec": {**spec.model_dump(mode="json"), "max_price_per_pflop": 2**256}, "chain_order_id": 5},
            422,
            "less",
        ),
        ("unknown order", "/orders/999", None, 404, "does not exist"),
    ]
    before = snapshot(store)
    for name, path, body, expected, needle in cases:
        if body is None:
            response = client.get(path)
        elif isinstance(body, str):
            response = client.post(path, content=body, headers={"content-type": "application/json"})
        else:
            response = client.post(path, json=body)
        assert response.status_code == expected, (name, response.text)
        assert needle.lower() in response.text.lower(), (name, response.text)
        assert snapshot(store) == before, f"{name} changed the store"


def test_bad_settlement_forms_are_refused_and_change_nothing(
    client: TestClient,
    service: MarketService,
    store: MarketStore,
    ledger: LedgerChain,
    make_agent: Any,
    clock: Clock,
) -> None:
    providers, _ = register_market(client, make_agent)
    keys = {k.address: k for k in providers}
    post_order(client, ledger, make_agent(), clock, total_steps=20)
    (match,) = service.matching.match_pending()
    chosen, outsider = keys[match.selected[0]], next(k for a, k in keys.items() if a not in match.selected)
    (assignment,) = pull(client, chosen)
    good = chosen.accept(assignment["unit_id"], assignment["chain_order_id"], assignment["unit_key"])
    by_other_key = outsider.accept(
        assignment["unit_id"], assignment["chain_order_id"], assignment["unit_key"]
    )
    before = snapshot(store)
    cases = [
        ("accept signed by another key", good.model_copy(update={"signature": by_other_key.signature}), 401),
        ("accept by a provider not on the unit", by_other_key, 404),
        ("accept with a changed nonce", good.model_copy(update={"nonce": 5}), 401),
    ]
    for name, sub, expected in cases:
        response = client.post("/assignments/accept", json=sub.model_dump(mode="json"))
        assert response.status_code == expected, (name, response.text)
        assert snapshot(store) == before, name
    assert client.post("/assignments/accept", json=good.model_dump(mode="json")).status_code == 200
    again = client.post("/assignments/accept", json=good.model_dump(mode="json"))
    assert again.status_code == 409 and "proposed" in again.text
    commit = {
        "unit_id": assignment["unit_id"],
        "provider": chosen.address,
        "commitment": "0x" + "00" * 32,
        "deadline": clock.now + 60,
        "signature": good.signature,
    }
    response = client.post("/assignments/commit", json=commit)
    assert response.status_code == 409 and "committing" in response.text  # not on chain yet


def test_openapi_lists_every_route() -> None:
    from market.api import create_app as make

    schema = make(None).openapi()  # type: ignore[arg-type]
    paths = set(schema["paths"])
    assert {
        "/agents/register",
        "/agents/heartbeat",
        "/agents/offer",
        "/agents/plants",
        "/assignments/accept",
        "/assignments/commit",
        "/assignments/reveal",
        "/verification/jobs",
        "/verification/verdict",
        "/verification/evidence",
        "/orders",
        "/orders/{order_id}",
        "/orders/{order_id}/peers",
    } <= paths


def test_a_settlement_that_keeps_failing_backs_off_and_is_never_given_up(
    client: TestClient,
    service: MarketService,
    ledger: LedgerChain,
    make_agent: Any,
    clock: Clock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 8 finding 7: an intent that fails every time is retried after 1, 2, 4 ... s (no tight
    requeue) and never dropped, so the unit settles once the chain answers again."""
    no_audit(service)
    providers, _ = register_market(client, make_agent)
    post_order(client, ledger, make_agent(), clock, total_steps=20)
    service.matching.match_pending()
    calls = []

    def rpc_down(unit_id: int, reveals: Any) -> tuple[bool, str]:
        calls.append(clock.now)
        raise ConnectionError("RPC node unreachable")

    monkeypatch.setattr(ledger, "reveal_batch", rpc_down)
    run_unit(
        client, service, {k.address: k for k in providers}, {"default": "0x" + "55" * 32}, drain_after=False
    )
    start = clock.now
    for second in range(64):
        clock.now = start + second
        for _ in range(3):  # several ticks in the same second send nothing more
            for entry_id in service.outbox.pending_outbox():
                service.outbox.send_outbox_entry(entry_id)
    assert [t - start for t in calls] == [0, 1, 3, 7, 15, 31, 63]  # the unit's 3 reveals in one batch
    with service.store.transaction() as session:
        reveals = [e for e in service.store.outbox_in(session, ["pending"]) if e.action.startswith("reveal:")]
        assert len(reveals) == 3
        for entry in reveals:
            assert entry.next_attempt_at == start + 63 + backoff_s(7)
            assert "unreachable" in (entry.last_error or "")
    monkeypatch.undo()
    clock.now = start + 63 + backoff_s(7)
    drain_outbox(service)
    assert len(ledger.effects("UnitFinalized")) == 1


def test_market_client_types_replies_and_refusals(client: TestClient, make_agent: Any) -> None:
    from veritrain.api_client import MarketRefused

    agent = make_agent()
    market = MarketClient(http=client)
    info = market.register(agent.registration())
    assert info.address == agent.address and info.online
    beat = agent.heartbeat()
    assert market.heartbeat(beat).assignments == ()
    with pytest.raises(MarketRefused) as refused:
        market.heartbeat(beat)
    assert refused.value.status == 409 and refused.value.error == "ReplayedMessage"
    with pytest.raises(MarketRefused) as missing:
        market.order_status(12345)
    assert missing.value.status == 404 and "does not exist" in missing.value.detail
    with pytest.raises(MarketRefused) as no_peers:
        market.order_peers(12345)
    assert no_peers.value.status == 404


def test_a_provider_that_never_commits_becomes_a_fault_and_the_unit_still_completes(
    client: TestClient, service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    """A provider lost after the unit went on chain: the others reveal after the commit deadline,
    verifiers mark the silent one as fault (never fraud), the honest ones are accepted."""
    no_audit(service)
    providers, verifiers = register_market(client, make_agent)
    keys = {k.address: k for k in providers}
    post_order(client, ledger, make_agent(), clock, total_steps=20)
    (match,) = service.matching.match_pending()
    for address in match.selected:
        (assignment,) = pull(client, keys[address])
        sub = keys[address].accept(
            assignment["unit_id"], assignment["chain_order_id"], assignment["unit_key"]
        )
        assert client.post("/assignments/accept", json=sub.model_dump(mode="json")).status_code == 200
    drain_outbox(service)
    silent, *working = match.selected
    digest, salt = "0x" + "3c" * 32, "0x" + "0f" * 32
    unit_id, chain_unit = assignment["unit_id"], None
    for address in working:
        (assignment,) = pull(client, keys[address])
        chain_unit = assignment["chain_unit_id"]
        commit = "0x" + commitment(bound(digest), salt, address, chain_unit).hex()
        deadline = clock.now + 600
        signature = keys[address].sign(
            "UnitCommit",
            {"unitId": chain_unit, "provider": address, "commitment": commit, "deadline": deadline},
        )
        body = {
            "unit_id": unit_id,
            "provider": address,
            "commitment": commit,
            "deadline": deadline,
            "signature": signature,
        }
        assert client.post("/assignments/commit", json=body).status_code == 200
    clock.now += service.config.commit_window_s + 1
    for key in [*providers, *verifiers]:
        if key.address != silent:
            pull(client, key)
    service.agents.sweep()
    for address in working:
        (assignment,) = pull(client, keys[address])
        assert assignment["phase"] == "reveal"
        body = {
            "unit_id": unit_id,
            "provider": address,
            "result_digest": bound(digest),
            "salt": salt,
            "state_digest": digest,
            "transcript_root": ROOT,
        }
        assert client.post("/assignments/reveal", json=body).status_code == 200
    clock.now += service.config.reveal_window_s
    for key in [*providers, *verifiers]:
        if key.address != silent:
            pull(client, key)
    service.agents.sweep()
    jobs = [
        client.post("/verification/jobs", json=v.heartbeat().model_dump(mode="json")).json()["jobs"]
        for v in verifiers
    ]
    signers = [v for v, j in zip(verifiers, jobs, strict=True) if j]
    (job,) = next(j for j in jobs if j)
    assert job["reason"] == "missing"
    outcomes = [1 if r["provider"] == silent else 0 for r in job["replicas"]]
    assert job["chain_unit_id"] == chain_unit
    for i, signer in enumerate(signers):  # every assigned verifier: a majority of two is two
        body = verdict_body(signer, job, outcomes, f"0x{i:064x}", clock)
        assert client.post("/verification/verdict", json=body).status_code == 200
    drain_outbox(service)
    assert ledger.effects("VerdictRecorded")[0]["outcomes"] == outcomes
    assert service.orders.advance_orders() == 1
    assert service.orders.order_status(_order_id(service)).state == "completed"


def test_chain_events_confirm_commits_and_reveals_whose_retry_reverted(
    client: TestClient, service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    """A worker that crashed after its commit/reveal landed retries into AlreadyCommitted / AlreadyRevealed;
    the chain's ReplicaCommitted / ReplicaRevealed events must still confirm the intent."""
    no_audit(service)
    providers, _ = register_market(client, make_agent)
    post_order(client, ledger, make_agent(), clock, total_steps=20)
    service.matching.match_pending()
    run_unit(client, service, {k.address: k for k in providers}, {"default": "0x" + "31" * 32})
    with service.store.transaction() as session:
        entries = [
            e
            for e in service.store.outbox_in(session, ["sent", "confirmed"])
            if e.action.startswith(("commit:", "reveal:"))
        ]
        assert len(entries) == 6 and all(e.state == "sent" for e in entries)
        for entry in entries:
            entry.state = "failed"
            session.add(entry)
        entry_ids = [e.id for e in entries]
    service.sync.sync_chain_events()
    with service.store.transaction() as session:
        states = {service.store.get_outbox(session, i).state for i in entry_ids if i is not None}
    assert states == {"confirmed"}


def test_a_slash_on_chain_reaches_matching_at_the_next_sync(
    client: TestClient, service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    """The market read free stake only at registration, so it kept matching a slashed provider."""
    providers, _ = register_market(client, make_agent, providers=4)
    cheater = providers[0]
    ledger.slash(cheater.address, DEFAULT_FREE_STAKE)
    assert service.sync.sync_chain_events() == 1
    assert (candidate := service.matching.pool.get(cheater.address)) is not None and candidate.free_stake == 0
    service.matching.refresh_pool(force=True)  # the store row was updated too, not only the in-memory pool
    assert (candidate := service.matching.pool.get(cheater.address)) is not None and candidate.free_stake == 0
    post_order(client, ledger, make_agent(), clock, total_steps=20)
    (match,) = service.matching.match_pending()
    assert match.complete and cheater.address not in match.selected


def test_a_relayed_settlement_refreshes_the_providers_reputation_at_once(
    client: TestClient, service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    no_audit(service)
    providers, _ = register_market(client, make_agent)
    post_order(client, ledger, make_agent(), clock, total_steps=20)
    service.matching.match_pending()
    run_unit(client, service, {k.address: k for k in providers}, {"default": "0x" + "31" * 32})
    # no sync_chain_events: the relayed finalize itself refreshes its providers (the next round's matching
    # is triggered at once and must not see the old values)
    paid = [a for a in (k.address for k in providers) if ledger.reputation_of(a).valid == 1]
    assert len(paid) == 3
    with service.store.transaction() as session:
        rows = {a: service.store.get_agent(session, a) for a in paid}
        assert all(row.rep_valid == 1 and row.rep_consecutive_valid == 1 for row in rows.values())
    assert all(service.matching.pool.get(a) is not None for a in paid)
    assert {service.matching.pool.get(a).reputation.valid for a in paid} == {1}  # type: ignore[union-attr]


def test_matching_settling_and_advancing_are_triggered_when_work_appears(
    client: TestClient, service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    """Units wait for the next tick (up to 2 s + a 5 s pool refresh) unless the service asks right away."""
    asked: list[str] = []
    service.triggers = Triggers(
        match=lambda refresh: asked.append(f"match(refresh={refresh})"),
        advance=lambda: asked.append("advance"),
        settle=lambda: asked.append("settle"),
    )
    no_audit(service)
    providers, _ = register_market(client, make_agent)
    assert asked == ["match(refresh=True)"] * 10  # 5 registrations + 5 offers reach the worker's pool
    asked.clear()
    post_order(client, ledger, make_agent(), clock, total_steps=40)
    assert asked == ["match(refresh=False)"]
    service.matching.match_pending()
    run_unit(client, service, {k.address: k for k in providers}, {"default": "0x" + "31" * 32})
    # settle: the last accept queued the assign; each of 3 commits and 3 reveals queued its relay; each of
    # the 3 commits recorded from their one batch unblocked the reveals. advance: the reveal batch
    # finalized the unit (its finalize intent is done by it: nothing is left to unblock).
    assert asked == ["match(refresh=False)", *["settle"] * (1 + 3 + 3 + 3), "advance"]
    asked.clear()
    assert service.orders.advance_orders() == 1  # round 1 opens
    assert asked == ["match(refresh=False)"]


def test_diloco_order_runs_m_shards_then_an_aggregate_unit_per_round(
    client: TestClient, service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    from veritrain.diloco import aggregate_result_digest

    no_audit(service)
    providers, _ = register_market(client, make_agent)
    keys = {k.address: k for k in providers}
    order = post_order(client, ledger, make_agent(), clock, shards=2, replicas=1, outer_step="unit")
    assert order["rounds_total"] == 2
    root = "0x" + "77" * 32

    def shard_result(assignment: dict[str, Any]) -> tuple[str, str, str]:
        state = f"0x{assignment['round_index']:02x}{assignment['shard']:02x}" + "cd" * 30
        return bound(state, root), state, root

    def aggregate_output(round_index: int) -> tuple[str, str, str]:
        output, commitment_ = bytes([0xA0 + round_index]) * 32, bytes([0xC0 + round_index]) * 32
        return (
            "0x" + aggregate_result_digest(output, commitment_).hex(),
            "0x" + output.hex(),
            "0x" + commitment_.hex(),
        )

    for round_index in range(2):
        service.matching.match_pending()
        training = run_proposed_units(client, service, keys, shard_result)
        assert sorted((a["kind"], a["shard"], a["num_shards"]) for a in training.values()) == [
            ("train", 0, 2),
            ("train", 1, 2),
        ]
        for assignment in training.values():
            if round_index == 0:
                assert assignment["start_state"]["state_digest"] is None and assignment["previous"] is None
            else:  # θ_1 from the aggregate, the inner moments from the shard's own last result
                assert assignment["start_state"]["state_digest"] == aggregate_output(0)[1]
                assert assignment["start_state"]["holders"]
                assert (
                    assignment["previous"]["state_digest"]
                    == shard_result({**assignment, "round_index": 0})[1]
                )
        assert service.orders.advance_orders() == 1  # both shards accepted: the aggregate unit opens
        service.matching.match_pending()
        aggregate = run_proposed_units(client, service, keys, lambda a, r=round_index: aggregate_output(r))
        ((_, view),) = aggregate.items()
        assert view["kind"] == "aggregate" and view["shard"] == 2 and view["outer"]["lr"] == 0.7
        assert [s["state_digest"] for s in view["shard_results"]] == [
            shard_result({"round_index": round_index, "shard": m})[1] for m in range(2)
        ]
        assert service.orders.advance_orders() == 1

    final = client.get(f"/orders/{order['order_id']}").json()
    assert final["state"] == "completed" and final["current_state_digest"] == aggregate_output(1)[1]
    assert len(ledger.effects("UnitFinalized")) == 6


def _folded_reveal(assignment: dict[str, Any]) -> tuple[str, ...]:
    """A shard unit's reveal in a folded order: its training result and, from round 1 on, the outer step it
    ran first (round r's state "0xe<r>..." over inputs "0xc<r>..."), which its result digest binds."""
    from veritrain.diloco import Fold, folded_result_digest

    r = assignment["round_index"]
    state = f"0x{r:02x}{assignment['shard']:02x}" + "cd" * 30
    if r == 0:
        return bound(state), state, ROOT
    round_state, inputs = bytes([0xE0 + r]) * 32, bytes([0xC0 + r]) * 32
    trained = bytes.fromhex(bound(state)[2:])
    result = "0x" + folded_result_digest(trained, Fold(round_state, inputs)).hex()
    return result, state, ROOT, "0x" + round_state.hex(), "0x" + inputs.hex()


def test_a_folded_order_opens_an_aggregate_unit_only_after_its_last_round(
    client: TestClient, service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    from veritrain.diloco import aggregate_result_digest

    no_audit(service)
    providers, _ = register_market(client, make_agent)
    keys = {k.address: k for k in providers}
    # a folded order on the per-unit path (asked: by default it would go to the round path)
    order = post_order(
        client,
        ledger,
        make_agent(),
        clock,
        settlement="units",
        shards=2,
        replicas=1,
        total_steps=60,
        outer_step="folded",
    )
    assert order["rounds_total"] == 3
    for round_index in range(3):
        service.matching.match_pending()
        training = run_proposed_units(client, service, keys, _folded_reveal)
        assert sorted((a["kind"], a["round_index"], a["shard"]) for a in training.values()) == [
            ("train", round_index, 0),
            ("train", round_index, 1),
        ]
        for assignment in training.values():
            results = [a["state_digest"] for a in assignment["shard_results"]]
            if round_index == 0:
                assert assignment["outer"] is None and results == [] and assignment["previous"] is None
                assert assignment["start_state"]["state_digest"] is None
                continue
            previous_round = [
                _folded_reveal({"round_index": round_index - 1, "shard": m})[1] for m in range(2)
            ]
            # round r runs round r-1's outer step: round r-1's state (round 0's: the genesis), its results
            assert assignment["outer"]["lr"] == 0.7 and results == previous_round
            assert assignment["previous"]["state_digest"] == previous_round[assignment["shard"]]
            start = assignment["start_state"]
            if round_index == 1:
                assert start["state_digest"] is None
            else:  # round 1's state, as round 1's units reported it, served by them
                assert start["state_digest"] == "0x" + "e1" * 32 and start["holders"]
        assert service.orders.advance_orders() == 1
        units = service.orders.order_status(order["order_id"]).units
        assert [u.kind for u in units].count("aggregate") == (1 if round_index == 2 else 0)
    status = service.orders.order_status(order["order_id"])
    assert status.state == "running" and status.rounds_accepted == 2
    assert status.current_state_digest == "0x" + "e2" * 32  # round 2's state: the aggregate's start
    service.matching.match_pending()
    output, commitment_ = bytes([0xA2]) * 32, bytes([0xC9]) * 32
    final = "0x" + output.hex()
    aggregate = run_proposed_units(
        client,
        service,
        keys,
        lambda a: (
            "0x" + aggregate_result_digest(output, commitment_).hex(),
            final,
            "0x" + commitment_.hex(),
        ),
    )
    ((_, view),) = aggregate.items()
    assert view["kind"] == "aggregate" and view["round_index"] == 2 and view["shard"] == 2
    assert view["start_state"]["state_digest"] == "0x" + "e2" * 32 and view["start_state"]["holders"]
    assert [s["state_digest"] for s in view["shard_results"]] == [
        _folded_reveal({"round_index": 2, "shard": m})[1] for m in range(2)
    ]
    assert service.orders.advance_orders() == 1
    done = client.get(f"/orders/{order['order_id']}").json()
    assert done["state"] == "completed" and done["current_state_digest"] == final
    assert len(ledger.effects("UnitFinalized")) == 3 * 2 + 1  # OrderSpec.unit_count


def test_a_folded_unit_s_reveal_must_name_the_outer_step_its_result_binds(
    client: TestClient, service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    no_audit(service)
    providers, _ = register_market(client, make_agent)
    keys = {k.address: k for k in providers}
    post_order(
        client, ledger, make_agent(), clock, settlement="units", shards=2, replicas=1, outer_step="folded"
    )
    order_id = _order_id(service)

    def reveal_again(reveal: Any, status: int) -> None:
        """Every replica waiting to reveal posts ``reveal(assignment)``'s reveal."""
        for key in keys.values():
            for assignment in pull(client, key):
                if assignment["phase"] == "reveal":
                    result, state, root, *fold = reveal(assignment)
                    body = {
                        "unit_id": assignment["unit_id"],
                        "provider": key.address,
                        "result_digest": result,
                    }
                    body |= {"salt": "0x" + "5a" * 32, "state_digest": state, "transcript_root": root}
                    if fold:
                        body |= {"round_state_digest": fold[0], "inputs_commitment": fold[1]}
                    assert client.post("/assignments/reveal", json=body).status_code == status, body

    def with_fold(assignment: dict[str, Any]) -> tuple[str, ...]:  # round 0 runs no outer step
        return (*_folded_reveal(assignment), "0x" + "e0" * 32, "0x" + "c0" * 32)

    def unbound(assignment: dict[str, Any]) -> tuple[str, ...]:
        result, state, root, round_state, _ = _folded_reveal(assignment)
        return result, state, root, round_state, "0x" + "c9" * 32  # not the inputs its result binds

    def bare(assignment: dict[str, Any]) -> tuple[str, ...]:
        result, state, root, *_ = _folded_reveal(assignment)
        return result, state, root

    service.matching.match_pending()
    run_proposed_units(client, service, keys, with_fold, reveal_status=400)
    assert {u.state for u in service.orders.order_status(order_id).units} == {"revealing"}
    reveal_again(_folded_reveal, 200)
    drain_outbox(service)
    assert service.orders.advance_orders() == 1
    service.matching.match_pending()
    run_proposed_units(client, service, keys, unbound, reveal_status=400)
    reveal_again(bare, 400)
    units = service.orders.order_status(order_id).units
    assert [u.state for u in units if u.round_index == 1] == ["revealing", "revealing"]
    reveal_again(_folded_reveal, 200)
    drain_outbox(service)
    units = service.orders.order_status(order_id).units
    assert [u.state for u in units if u.round_index == 1] == ["accepted", "accepted"]


def test_an_aggregate_reveal_that_does_not_open_its_result_is_refused(
    client: TestClient, service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    no_audit(service)
    providers, _ = register_market(client, make_agent)
    keys = {k.address: k for k in providers}
    post_order(client, ledger, make_agent(), clock, shards=2, replicas=1, total_steps=20, outer_step="unit")
    service.matching.match_pending()
    digest = "0x" + "cd" * 32
    run_proposed_units(client, service, keys, lambda a: (bound(digest, ROOT), digest, ROOT))
    assert service.orders.advance_orders() == 1
    service.matching.match_pending()
    # result digest = state digest does not open as sha256(domain, output, inputs commitment): refused
    (view,) = run_proposed_units(
        client, service, keys, lambda a: (digest, digest, "0x" + "77" * 32), reveal_status=400
    ).values()
    assert view["kind"] == "aggregate"
    unit = next(u for u in service.orders.order_status(_order_id(service)).units if u.kind == "aggregate")
    assert unit.state == "revealing"


def test_a_shard_quorum_aggregates_without_a_failed_shard(
    client: TestClient, service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    no_audit(service)
    providers, _ = register_market(client, make_agent)
    keys = {k.address: k for k in providers}
    post_order(
        client,
        ledger,
        make_agent(),
        clock,
        shards=3,
        shard_quorum=2,
        replicas=1,
        total_steps=20,
        outer_step="unit",
    )
    service.matching.match_pending()
    digest = "0x" + "cd" * 32
    run_proposed_units(
        client, service, keys, lambda a: (bound(digest, ROOT), digest, ROOT), silent_shards=(1,)
    )
    assert service.orders.advance_orders() == 0  # shard 1 is still in its commit window
    clock.now += 4000  # past commit + reveal + verdict windows: the silent shard's unit expires
    for key in providers:
        pull(client, key)
    assert service.agents.sweep().expiring_units == 1
    drain_outbox(service)
    assert service.orders.advance_orders() == 1  # quorum 2 accepted, the rest failed: aggregate, no retry
    units = service.orders.order_status(_order_id(service)).units
    assert [(u.shard, u.kind, u.state) for u in units] == [
        (0, "train", "accepted"),
        (1, "train", "failed"),
        (2, "train", "accepted"),
        (3, "aggregate", "pending"),
    ]
    with service.store.transaction() as session:  # what the aggregate's replicas will be told
        unit = service.store.get_unit(session, units[3].unit_id)
        work = service.orders.unit_work(session, service.store.get_order(session, unit.order_id), unit)
    assert [s and s.state_digest for s in work["shard_results"]] == [digest, None, digest]
    assert work["kind"] == "aggregate" and work["outer"].aggregation == "mean"
