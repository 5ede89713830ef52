"""Helpers that drive the market through its HTTP API like agents and a buyer would."""

from __future__ import annotations

from typing import Any

from agents import AgentKey, Clock, chain_order_for, order_spec
from chain_double import LedgerChain
from fastapi.testclient import TestClient
from sqlalchemy import text

from market.service import MarketService
from market.store import MarketStore
from veritrain.chain.eip712 import commitment, outcomes_hash
from veritrain.messages import AgentRole, OrderRequest
from veritrain.pol import result_digest

ROOT = "0x" + "77" * 32  # the transcript root every test replica reports


def bound(state_digest: str, root: str = ROOT) -> str:
    """The result digest a replica reporting ``state_digest`` and ``root`` commits to."""
    return "0x" + result_digest(bytes.fromhex(state_digest[2:]), bytes.fromhex(root[2:])).hex()


def snapshot(store: MarketStore) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every market table, for 'nothing changed' assertions."""
    from sqlmodel import SQLModel

    with store.engine.connect() as conn:
        return {
            name: sorted(tuple(str(v) for v in row) for row in conn.execute(text(f'SELECT * FROM "{name}"')))
            for name in SQLModel.metadata.tables
        }


def register_market(
    client: TestClient, make_agent: Any, providers: int = 5, verifiers: int = 2
) -> tuple[list[AgentKey], list[AgentKey]]:
    provider_keys = [make_agent() for _ in range(providers)]
    verifier_keys = [make_agent() for _ in range(verifiers)]
    for i, key in enumerate(provider_keys):
        assert (
            client.post("/agents/register", json=key.registration().model_dump(mode="json")).status_code
            == 200
        )
        offer = key.offer(price_per_pflop=10**17 + i)
        assert client.post("/agents/offer", json=offer.model_dump(mode="json")).status_code == 200
    for key in verifier_keys:
        body = key.registration(AgentRole.VERIFIER).model_dump(mode="json")
        assert client.post("/agents/register", json=body).status_code == 200
    return provider_keys, verifier_keys


def post_order(
    client: TestClient,
    ledger: LedgerChain,
    buyer: AgentKey,
    clock: Clock,
    chain_order_id: int = 1,
    settlement: str | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    spec = order_spec(buyer.address, clock, **overrides)
    ledger.add_order(chain_order_for(spec, chain_order_id))
    request = OrderRequest.model_validate(
        {"spec": spec, "chain_order_id": chain_order_id, "settlement": settlement}
    )
    response = client.post("/orders", json=request.model_dump(mode="json"))
    assert response.status_code == 201, response.text
    return dict(response.json())


def pull(client: TestClient, key: AgentKey) -> list[dict[str, Any]]:
    response = client.post("/agents/heartbeat", json=key.heartbeat().model_dump(mode="json"))
    assert response.status_code == 200, response.text
    return list(response.json()["assignments"])


def accept_offered(client: TestClient, keys: dict[str, AgentKey]) -> None:
    """Every provider signs the Accept of every unit offered to it."""
    for key in keys.values():
        for assignment in pull(client, key):
            sub = key.accept(assignment["unit_id"], assignment["chain_order_id"], assignment["unit_key"])
            assert client.post("/assignments/accept", json=sub.model_dump(mode="json")).status_code == 200


def drain_outbox(service: MarketService) -> None:
    for _ in range(20):
        pending = service.outbox.pending_outbox()
        if not pending:
            return
        for entry_id in pending:
            service.outbox.send_outbox_entry(entry_id)
    raise AssertionError("outbox did not drain")


def run_unit(
    client: TestClient,
    service: MarketService,
    keys: dict[str, AgentKey],
    results: dict[str, str],
    drain_after: bool = True,
) -> int:
    """Drive one proposed unit through accept, assign, commit and reveal; returns the market unit id.
    ``results`` maps providers (or "default") to the state digest each reports."""
    selected = [a for a in keys if any(x["phase"] == "accept" for x in pull(client, keys[a]))]
    unit_id = 0
    for address in selected:
        key = keys[address]
        (assignment,) = [x for x in pull(client, key) if x["phase"] == "accept"]
        unit_id = assignment["unit_id"]
        sub = key.accept(unit_id, assignment["chain_order_id"], assignment["unit_key"])
        assert client.post("/assignments/accept", json=sub.model_dump(mode="json")).status_code == 200
    drain_outbox(service)  # assign
    salts = {}
    for address in selected:
        key = keys[address]
        (assignment,) = [x for x in pull(client, key) if x["phase"] == "run"]
        chain_unit = assignment["chain_unit_id"]
        salt = "0x" + f"{int(address, 16) % 997:064x}"
        salts[address] = salt
        digest = bound(results.get(address, results["default"]))
        commit = "0x" + commitment(digest, salt, address, chain_unit).hex()
        deadline = key.clock.now + 600
        signature = key.sign(
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
    for address in selected:
        key = keys[address]
        (assignment,) = [x for x in pull(client, key) if x["phase"] == "reveal"]
        state = results.get(address, results["default"])
        body = {
            "unit_id": unit_id,
            "provider": address,
            "result_digest": bound(state),
            "salt": salts[address],
            "state_digest": state,
            "transcript_root": ROOT,
        }
        assert client.post("/assignments/reveal", json=body).status_code == 200, body
    if drain_after:
        drain_outbox(service)  # commits, reveals, finalize
    return unit_id


def run_proposed_units(
    client: TestClient,
    service: MarketService,
    keys: dict[str, Any],
    reveal: Any,
    reveal_status: int = 200,
    silent_shards: tuple[int, ...] = (),
) -> dict[int, dict[str, Any]]:
    """Drive every proposed unit (k = 1) through accept, commit and reveal; ``reveal(assignment)`` gives
    (result digest, state digest, transcript root), and for a folded shard unit also its outer step's
    (round state digest, inputs commitment); the providers of ``silent_shards`` accept and then never
    commit. Returns each unit's assignment as its provider saw it."""
    seen: dict[int, dict[str, Any]] = {}
    owner: dict[int, Any] = {}
    for key in keys.values():
        for assignment in pull(client, key):
            if assignment["phase"] == "accept":
                seen[assignment["unit_id"]], owner[assignment["unit_id"]] = assignment, key
                sub = key.accept(assignment["unit_id"], assignment["chain_order_id"], assignment["unit_key"])
                assert client.post("/assignments/accept", json=sub.model_dump(mode="json")).status_code == 200
    drain_outbox(service)
    salt = "0x" + "5a" * 32
    owner = {u: key for u, key in owner.items() if seen[u]["shard"] not in silent_shards}
    for unit_id, key in owner.items():
        (assignment,) = [x for x in pull(client, key) if x["unit_id"] == unit_id and x["phase"] == "run"]
        result, *_ = reveal(assignment)
        commit = "0x" + commitment(result, salt, key.address, assignment["chain_unit_id"]).hex()
        deadline = key.clock.now + 600
        message = {"unitId": assignment["chain_unit_id"], "provider": key.address, "commitment": commit}
        signature = key.sign("UnitCommit", {**message, "deadline": deadline})
        body = {**message, "unit_id": unit_id, "deadline": deadline, "signature": signature}
        del body["unitId"]
        assert client.post("/assignments/commit", json=body).status_code == 200, body
    for unit_id, key in owner.items():
        result, state, root, *fold = reveal(seen[unit_id])
        body = {"unit_id": unit_id, "provider": key.address, "result_digest": result, "salt": salt}
        body |= {"state_digest": state, "transcript_root": root}
        if fold:
            body |= {"round_state_digest": fold[0], "inputs_commitment": fold[1]}
        response = client.post("/assignments/reveal", json=body)
        assert response.status_code == reveal_status, response.text
    drain_outbox(service)
    return seen


def verdict_body(
    signer: AgentKey, job: dict[str, Any], outcomes: list[int], reasons: str, clock: Clock
) -> dict[str, Any]:
    """A verifier's signed verdict on a pulled job, as the body of POST /verification/verdict."""
    deadline = clock.now + 600
    signature = signer.sign(
        "Verdict",
        {
            "unitId": job["chain_unit_id"],
            "outcomesHash": outcomes_hash(outcomes),
            "deadline": deadline,
        },
    )
    return {
        "job_id": job["job_id"],
        "verifier": signer.address,
        "outcomes": outcomes,
        "reasons_hash": reasons,
        "deadline": deadline,
        "signature": signature,
    }
