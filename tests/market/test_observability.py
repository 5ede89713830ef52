"""What the market shows: signed reported losses, /metrics families, the dashboard's data and page."""

from __future__ import annotations

import re
from typing import Any

import pytest
from agents import CHAIN_ID, AgentKey, Clock
from chain_double import LedgerChain
from fastapi.testclient import TestClient
from market_flow import drain_outbox, post_order, pull, register_market, run_unit, snapshot, verdict_body
from prometheus_client.parser import text_string_to_metric_families

from market.api import create_app
from market.context import MarketConfig
from market.domain.replication import ReplicationPolicy
from market.service import MarketService
from veritrain.messages import Progress, sign_message


@pytest.fixture
def client(service: MarketService) -> TestClient:
    service.config = MarketConfig(
        chain_id=CHAIN_ID,
        min_verifiers=1,
        verifiers_per_unit=2,
        policy=ReplicationPolicy(base_audit_ppm=0, trusted_audit_ppm=0),
    )
    return TestClient(create_app(service))


def progress(
    key: AgentKey, unit_id: int, steps: tuple[int, ...], losses: tuple[float, ...]
) -> dict[str, Any]:
    message = Progress(
        agent=key.address,
        nonce=next(key.nonces),
        timestamp=key.clock.now,
        unit_id=unit_id,
        steps=steps,
        losses_e6=tuple(round(loss * 10**6) for loss in losses),
    )
    return sign_message(message, key.account.key, CHAIN_ID).model_dump(mode="json")


def scrape(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics as {(name, sorted labels): value}."""
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_only_a_replica_holder_reports_losses_and_they_form_the_order_curve(
    client: TestClient, service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    providers, _ = register_market(client, make_agent)
    keys = {k.address: k for k in providers}
    order = post_order(client, ledger, make_agent(), clock, total_steps=40)  # 2 rounds of 20 steps
    (match,) = service.matching.match_pending()
    holder, other = keys[match.selected[0]], next(k for a, k in keys.items() if a not in match.selected)
    unit_id = pull(client, holder)[0]["unit_id"]

    ok = client.post("/agents/progress", json=progress(holder, unit_id, (1, 2, 3), (2.5, 2.25, 2.0)))
    assert ok.status_code == 200, ok.text
    before = snapshot(service.store)
    refused = [
        client.post("/agents/progress", json=progress(other, unit_id, (4,), (1.0,))),  # holds no replica
        client.post("/agents/progress", json=progress(holder, unit_id, (21,), (1.0,))),  # beyond the unit
        client.post("/agents/progress", json=progress(holder, 10**6, (1,), (1.0,))),  # no such unit
    ]
    assert [r.status_code for r in refused] == [404, 400, 404]
    replay = progress(holder, unit_id, (4,), (1.0,))
    replay["message"]["nonce"] = 1
    replay = sign_message(Progress.model_validate(replay["message"]), holder.account.key, CHAIN_ID)
    assert client.post("/agents/progress", json=replay.model_dump(mode="json")).status_code == 409
    assert snapshot(service.store) == before  # a refusal changes nothing
    # a resent point is not stored twice
    assert client.post("/agents/progress", json=progress(holder, unit_id, (3,), (2.0,))).status_code == 200

    data = client.get("/dashboard/data").json()
    (shown,) = [o for o in data["orders"] if o["id"] == order["order_id"]]
    assert shown["loss"] == [[1, 2.5], [2, 2.25], [3, 2.0]]
    assert shown["rounds"][0]["units"] == [unit_id]
    assert {r["provider"] for r in data["units"][str(unit_id)]["replicas"]} == set(match.selected)


def test_metrics_and_dashboard_follow_a_unit_through_verification(
    client: TestClient, service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    providers, verifiers = register_market(client, make_agent)
    keys = {k.address: k for k in providers}
    post_order(client, ledger, make_agent(), clock, total_steps=20)
    start = scrape(client)
    for family in (
        "veritrain_units",
        "veritrain_orders",
        "veritrain_outbox_lag_seconds",
        "veritrain_chain_sync_lag_blocks",
    ):
        assert any(name == family for name, _ in start), family
    assert value(start, "veritrain_units", state="pending") == 1

    (match,) = service.matching.match_pending()
    cheat = match.selected[1]
    unit_id = run_unit(client, service, keys, {"default": "0x" + "11" * 32, cheat: "0x" + "66" * 32})
    jobs = {
        v.address: client.post("/verification/jobs", json=v.heartbeat().model_dump(mode="json")).json()
        for v in verifiers
    }
    signer = next(v for v in verifiers if jobs[v.address]["jobs"])
    (job,) = jobs[signer.address]["jobs"]
    outcomes = [2 if r["provider"] == cheat else 0 for r in job["replicas"]]
    mid = scrape(client)
    assert value(mid, "veritrain_units", state="verifying") == 1
    assert value(mid, "veritrain_verification_jobs", state="open") == 1

    for i, each in enumerate(v for v in verifiers if jobs[v.address]["jobs"]):  # the majority of two: both
        body = verdict_body(each, job, outcomes, f"0x{i:064x}", clock)
        assert client.post("/verification/verdict", json=body).status_code == 200
    drain_outbox(service)
    end = scrape(client)
    assert (
        value(end, "veritrain_units", state="accepted") == 1
        and value(end, "veritrain_units", state="pending") == 0
    )
    assert value(end, "veritrain_matches_total") == value(start, "veritrain_matches_total") + 3
    assert value(end, "veritrain_match_passes_total", outcome="chosen") >= 1
    assert value(end, "veritrain_verdicts_total", outcome="fraud") == 1
    assert value(end, "veritrain_verdicts_total", outcome="accept") == 2
    assert value(end, "veritrain_verdict_signatures_total") == 2
    assert value(end, "veritrain_settlement_transactions_total", action="verdict") == 1
    assert value(end, "veritrain_settlement_transactions_total", action="assign") == 1
    assert value(end, "veritrain_outbox_lag_seconds") == 0

    data = client.get("/dashboard/data").json()
    unit = data["units"][str(unit_id)]
    assert unit["state"] == "accepted"
    verdicts = unit["verification"]["verdicts"]
    assert signer.address in {verdict["verifier"] for verdict in verdicts} and len(verdicts) == 2
    for verdict in verdicts:
        assert verdict["outcomes"] == ["fraud" if o == 2 else "accept" for o in outcomes]
    assert unit["settlement"][0]["action"] == "assign"
    assert {v["address"]: v["jobs_done"] for v in data["verifiers"]}[signer.address] == 1
    prices = {p["address"]: p["price_per_pflop"] for p in data["providers"]}
    assert set(prices) == set(keys) and all(price is not None for price in prices.values())
    assert not any("signature" in key or "salt" in key or "p2p" in key for key in _keys(data))


def test_dashboard_page_is_self_contained(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    # no external script, style, font or image: the machine and CI have no internet
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page.text)
    assert "@import" not in page.text and "dashboard/data" in page.text


def _keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()
