"""Custody of live states: an accepted result is kept by an agent besides its producer before the order
relies on it (the next round waits for that, bounded), is listed as a holder, and is released when the
order no longer needs it. With k = 1 the producer is otherwise the result's only holder, and a producer
gone for good used to stall the order ("no holder served blob")."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from agents import CHAIN_ID, AgentKey, Clock
from chain_double import LedgerChain
from fastapi.testclient import TestClient
from market_flow import ROOT, bound, post_order, pull, register_market, run_proposed_units, run_unit, snapshot

from market.api import create_app
from market.context import MarketConfig
from market.domain.custody import Custodian, custodians_needed, may_rely_on, pick_custodians
from market.domain.replication import ReplicationPolicy
from market.service import MarketService
from veritrain.agentkit import CustodyKeeper
from veritrain.blobstore import BlobStore, sha256_hex
from veritrain.errors import AgentError
from veritrain.messages import Custody, CustodyReport, StateSource, sign_message

WAIT_S = 30


@pytest.fixture
def client(service: MarketService, ledger: LedgerChain) -> TestClient:
    ledger.spot_check_ppm = 0
    service.config = MarketConfig(
        chain_id=CHAIN_ID,
        min_verifiers=1,
        verifiers_per_unit=1,
        custody_wait_s=WAIT_S,
        policy=ReplicationPolicy(base_audit_ppm=0, trusted_audit_ppm=0),
    )
    return TestClient(create_app(service))


def custody_of(client: TestClient, key: AgentKey, verifier: bool = False) -> list[dict[str, Any]]:
    """The custody list of an agent's heartbeat (verifiers: of its verification-jobs pull)."""
    route = "/verification/jobs" if verifier else "/agents/heartbeat"
    response = client.post(route, json=key.heartbeat().model_dump(mode="json"))
    assert response.status_code == 200, response.text
    return list(response.json()["custody"])


def report(client: TestClient, key: AgentKey, digest: str) -> Any:
    message = CustodyReport(
        agent=key.address, nonce=next(key.nonces), timestamp=key.clock.now, state_digest=digest
    )
    signed = sign_message(message, key.account.key, CHAIN_ID)
    return client.post("/agents/custody", json=signed.model_dump(mode="json"))


def addr(key: AgentKey) -> str:
    return f"/ip4/127.0.0.1/tcp/4001/p2p/{key.address}"


def round_units(client: TestClient, order_id: int, round_index: int) -> list[dict[str, Any]]:
    status = client.get(f"/orders/{order_id}").json()
    return [u for u in status["units"] if u["round_index"] == round_index]


def test_an_accepted_k1_result_is_kept_by_a_second_agent_before_the_next_round_starts_from_it(
    client: TestClient, service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    providers, verifiers = register_market(client, make_agent, providers=3, verifiers=1)
    keys = {k.address: k for k in providers}
    everyone = [*providers, *verifiers]
    order = post_order(client, ledger, make_agent(), clock, replicas=1, total_steps=40)
    first = "0x" + "a1" * 32
    (match,) = service.matching.match_pending()
    producer = keys[match.selected[0]]
    run_unit(client, service, keys, {"default": first})

    assert service.orders.advance_orders() == 1  # round 0 closes ...
    assert round_units(client, order["order_id"], 1) == []  # ... but round 1 waits for a second holder
    asked = {k.address: custody_of(client, k, verifier=k in verifiers) for k in everyone}
    custodians = [k for k in everyone if asked[k.address]]
    assert len(custodians) == 1 and custodians[0] is not producer
    custodian = custodians[0]
    assert asked[custodian.address] == [
        {"state": {"state_digest": first, "holders": [addr(producer)]}, "held": False}
    ]

    # only an agent that was asked may report, and a refused report changes nothing
    bystander = next(k for k in everyone if k not in (producer, custodian))
    before = snapshot(service.store)
    assert report(client, bystander, first).status_code == 404
    assert report(client, custodian, "0x" + "ee" * 32).status_code == 404
    assert snapshot(service.store) == before

    assert report(client, custodian, first).status_code == 200
    assert custody_of(client, custodian, verifier=custodian in verifiers)[0]["held"] is True
    assert service.orders.advance_orders() == 1  # round 1 opens now
    (match,) = service.matching.match_pending()
    (assignment,) = pull(client, keys[match.selected[0]])
    holders = assignment["start_state"]["holders"]
    assert assignment["start_state"]["state_digest"] == first
    assert addr(custodian) in holders and (addr(producer) in holders or match.selected[0] == producer.address)

    run_unit(client, service, keys, {"default": "0x" + "b2" * 32})
    assert service.orders.advance_orders() == 1
    assert client.get(f"/orders/{order['order_id']}").json()["state"] == "completed"
    for key in everyone:  # the order ended: every custody is released
        assert custody_of(client, key, verifier=key in verifiers) == []


def test_the_next_round_waits_at_most_custody_wait_s_and_a_silent_custodian_is_replaced(
    client: TestClient, service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    providers, verifiers = register_market(client, make_agent, providers=3, verifiers=1)
    keys = {k.address: k for k in providers}
    everyone = [*providers, *verifiers]
    order = post_order(client, ledger, make_agent(), clock, replicas=1, total_steps=40)
    first = "0x" + "c3" * 32
    service.matching.match_pending()
    run_unit(client, service, keys, {"default": first})
    service.orders.advance_orders()

    def asked() -> list[AgentKey]:
        return [k for k in everyone if custody_of(client, k, verifier=k in verifiers)]

    (silent,) = asked()
    clock.now += WAIT_S - 1
    service.orders.advance_orders()
    assert round_units(client, order["order_id"], 1) == []
    clock.now += 1
    service.orders.advance_orders()  # nobody reported in time: the order goes on with the producer alone
    (unit,) = round_units(client, order["order_id"], 1)
    assert unit["state"] == "pending"

    clock.now += service.config.custody_timeout_s  # the silent custodian no longer counts: one more is asked
    service.orders.advance_orders()
    now_asked = asked()
    assert silent in now_asked and len(now_asked) == 2
    fresh = next(k for k in now_asked if k is not silent)
    assert report(client, fresh, first).status_code == 200
    (match,) = service.matching.match_pending()
    (assignment,) = pull(client, keys[match.selected[0]])
    assert addr(fresh) in assignment["start_state"]["holders"]
    assert addr(silent) not in assignment["start_state"]["holders"]  # asked, never reported: not listed


def test_each_shards_accepted_result_is_kept_too_and_listed_for_the_aggregate_unit(
    client: TestClient, service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    # M = 2, k = 1: a shard's last accepted result carries its inner AdamW state into the shard's next
    # unit, so it is a live state of its own, kept beside its one producer like the round's start
    providers, verifiers = register_market(client, make_agent, providers=3, verifiers=1)
    keys = {k.address: k for k in providers}
    everyone = [*providers, *verifiers]
    order = post_order(
        client, ledger, make_agent(), clock, shards=2, replicas=1, total_steps=40, outer_step="unit"
    )
    service.matching.match_pending()
    results = {0: "0x" + "d0" * 32, 1: "0x" + "d1" * 32}
    run_proposed_units(
        client, service, keys, lambda a: (bound(results[a["shard"]]), results[a["shard"]], ROOT)
    )
    producers = {u["shard"]: u["providers"][0] for u in round_units(client, order["order_id"], 0)}
    assert service.orders.advance_orders() == 1  # both shards accepted: the aggregate unit opens

    asked = {k.address: custody_of(client, k, verifier=k in verifiers) for k in everyone}
    for shard, digest in results.items():
        custodians = [
            k for k in everyone if any(c["state"]["state_digest"] == digest for c in asked[k.address])
        ]
        assert len(custodians) == 1 and custodians[0].address != producers[shard]
        assert report(client, custodians[0], digest).status_code == 200
    service.matching.match_pending()
    (aggregate,) = [x for k in providers for x in pull(client, k) if x["kind"] == "aggregate"]
    for shard, source in enumerate(aggregate["shard_results"]):  # its producer, then its custodian
        assert source["state_digest"] == results[shard] and len(source["holders"]) == 2
        assert source["holders"][0] == f"/ip4/127.0.0.1/tcp/4001/p2p/{producers[shard]}"


def test_custody_domain_rules() -> None:
    now = 1000
    held = Custodian("0xa", 0, held=True, online=True)
    fetching = Custodian("0xb", now - 10, held=False, online=True)
    stale = Custodian("0xc", now - 60, held=False, online=True)
    gone = Custodian("0xd", 0, held=True, online=False)
    assert custodians_needed([held], 1, now, 60) == 0
    assert custodians_needed([fetching], 1, now, 60) == 0
    assert custodians_needed([stale, gone], 1, now, 60) == 1
    assert custodians_needed([held], 2, now, 60) == 1
    # never a producer nor an agent already asked; the least loaded first, then by address
    picked = pick_custodians(2, ["0x1", "0x2", "0x3", "0x4"], {"0x1"}, {"0x2": 3, "0x4": 1})
    assert picked == ["0x3", "0x4"]
    assert pick_custodians(1, ["0x1"], {"0x1"}, {}) == []
    assert may_rely_on([], now, 30)  # nobody could be asked
    assert may_rely_on([fetching, held], now, 30)
    assert not may_rely_on([fetching], now, 30)
    assert may_rely_on([Custodian("0xb", now - 30, held=False, online=True)], now, 30)


class FakePlane:
    """The part of BlobPlane the keeper uses: a store, and fetch_any serving from ``remote``."""

    def __init__(self, root: Path, remote: dict[str, bytes]) -> None:
        self.store = BlobStore(root)
        self.remote = remote
        self.fetched = threading.Event()

    def fetch_any(self, holders: list[str], digest: str) -> bytes:
        if digest not in self.remote:
            raise AgentError(f"no holder served blob {digest}")
        self.store.put(self.remote[digest], expected_digest=digest)
        self.fetched.set()
        return self.remote[digest]


def test_the_agent_keeps_what_it_is_asked_reports_it_and_deletes_only_what_it_fetched_for_custody(
    tmp_path: Path,
) -> None:
    kept, own = b"a state kept for another order", b"this agent's own result"
    plane = FakePlane(tmp_path / "blobs", {sha256_hex(kept): kept})
    own_digest = plane.store.put(own)
    keeper = CustodyKeeper(plane, tmp_path)  # type: ignore[arg-type]

    def ask(*blobs: bytes, held: bool = False) -> tuple[Custody, ...]:
        return tuple(
            Custody(state=StateSource(state_digest="0x" + sha256_hex(b), holders=("peer",)), held=held)
            for b in blobs
        )

    assert keeper.update(ask(kept, own)) == ["0x" + own_digest]  # held already: report at once
    assert plane.fetched.wait(5)
    for _ in range(50):  # the background fetch records its pin just after storing
        if (tmp_path / "custody").exists() and sha256_hex(kept) in (tmp_path / "custody").read_text():
            break
        threading.Event().wait(0.05)
    assert sorted(keeper.update(ask(kept, own))) == sorted(["0x" + own_digest, "0x" + sha256_hex(kept)])
    assert keeper.update(ask(kept, own, held=True)) == []
    # a restarted agent remembers what it pinned; released, the pinned blob goes and its own result stays
    keeper = CustodyKeeper(plane, tmp_path)  # type: ignore[arg-type]
    assert keeper.update(()) == []
    assert not plane.store.has(sha256_hex(kept)) and plane.store.has(own_digest)
