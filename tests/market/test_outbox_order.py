"""Issue 8 finding 11: the outbox keeps a unit's intents in order however long the queue is, and a late
failure never undoes what the chain sync already confirmed. SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

from agents import Clock
from chain_double import LedgerChain
from fastapi.testclient import TestClient
from market_flow import drain_outbox, post_order, pull, register_market, run_unit

from market.api import create_app
from market.context import MarketConfig
from market.domain.replication import ReplicationPolicy
from market.service import MarketService


def no_audit(service: MarketService) -> TestClient:
    service.config = MarketConfig(
        chain_id=service.config.chain_id,
        min_verifiers=1,
        verifiers_per_unit=2,
        policy=ReplicationPolicy(base_audit_ppm=0, trusted_audit_ppm=0),
    )
    return TestClient(create_app(service))


def test_a_unit_waits_for_its_earlier_intents_behind_a_thousand_others(
    service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    client = no_audit(service)
    providers, _ = register_market(client, make_agent)
    post_order(client, ledger, make_agent(), clock, chain_order_id=1, total_steps=20)
    post_order(client, ledger, make_agent(), clock, chain_order_id=2, total_steps=20)
    first, second = service.matching.match_pending()
    with service.store.transaction() as session:  # 1,000 older intents of another unit, backing off
        for i in range(1000):
            entry = service.store.enqueue(session, second.unit_id, f"noise:{i}", {}, clock.now)
            entry.next_attempt_at = clock.now + 86_400
            session.add(entry)
    keys = {k.address: k for k in providers}
    run_unit(client, service, {a: keys[a] for a in first.selected}, {"default": "0x" + "44" * 32}, False)
    with service.store.transaction() as session:
        finalize = service.store.outbox_entry(session, first.unit_id, "finalize")
        assert finalize is not None and finalize.id is not None
    result = service.outbox.send_outbox_entry(finalize.id)
    assert not result.sent and "waiting for earlier actions" in result.detail
    assert ledger.effects("UnitFinalized") == []


def test_a_late_failure_does_not_overwrite_what_the_sync_confirmed(
    service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    """The reveal batch lands and finalizes the unit, the sync confirms it, then the sender's RPC call
    times out: its reveals and the finalize stay confirmed, and nothing is sent again."""
    client = no_audit(service)
    providers, _ = register_market(client, make_agent)
    post_order(client, ledger, make_agent(), clock, total_steps=20)
    (match,) = service.matching.match_pending()
    keys = {k.address: k for k in providers}
    real_reveal_batch = ledger.reveal_batch

    def landed_then_timed_out(unit_id: int, reveals: Any) -> tuple[bool, str]:
        real_reveal_batch(unit_id, reveals)
        service.sync.sync_chain_events()
        raise TimeoutError("the RPC node did not answer in time")

    ledger.reveal_batch = landed_then_timed_out  # type: ignore[method-assign]
    run_unit(client, service, {a: keys[a] for a in match.selected}, {"default": "0x" + "45" * 32})
    with service.store.transaction() as session:
        states = {e.action.split(":")[0]: e.state for e in service.store.outbox_in(session, ["confirmed"])}
        assert states == {
            "assign": "confirmed",
            "commit": "confirmed",
            "reveal": "confirmed",
            "finalize": "confirmed",
        }
        assert service.store.outbox_in(session, ["pending", "sending", "retrying", "sent"]) == []
        assert service.store.get_unit(session, match.unit_id).state == "accepted"
    assert len(ledger.effects("UnitFinalized")) == 1


def test_an_assign_past_its_accept_deadline_fails_the_unit_and_its_retry_runs(
    service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    """Found by `veritrain bench chaos`: the chain refused an assign whose Accept signatures had expired,
    the outbox retried it forever and the unit (and its order) stayed in ASSIGNING for good."""
    from veritrain.chain.errors import error_class

    client = no_audit(service)
    providers, _ = register_market(client, make_agent)
    order = post_order(client, ledger, make_agent(), clock, total_steps=20)
    (match,) = service.matching.match_pending()
    keys = {k.address: k for k in providers}
    real_assign = ledger.assign

    def expired(*args: Any, **kwargs: Any) -> int:
        raise error_class("SignatureExpired")("SignatureExpired", {"deadline": 1, "now": 2})

    ledger.assign = expired  # type: ignore[method-assign]
    for address in match.selected:
        (assignment,) = [x for x in pull(client, keys[address]) if x["phase"] == "accept"]
        sub = keys[address].accept(
            assignment["unit_id"], assignment["chain_order_id"], assignment["unit_key"]
        )
        assert client.post("/assignments/accept", json=sub.model_dump(mode="json")).status_code == 200
    drain_outbox(service)
    with service.store.transaction() as session:
        entry = service.store.outbox_entry(session, match.unit_id, "assign")
        assert entry is not None and entry.state == "reverted" and "SignatureExpired" in str(entry.last_error)
        assert service.store.get_unit(session, match.unit_id).state == "failed"
        assert {r.state for r in service.store.replicas_of(session, match.unit_id)} == {"dropped"}
    assert ledger.effects("UnitAssigned") == []

    ledger.assign = real_assign  # type: ignore[method-assign]
    assert service.orders.advance_orders() == 1  # the retry: a new attempt under a new unit key
    (retry,) = service.matching.match_pending()
    assert retry.unit_id != match.unit_id and len(retry.selected) == match.k
    run_unit(client, service, {a: keys[a] for a in retry.selected}, {"default": "0x" + "46" * 32})
    service.orders.advance_orders()
    assert service.orders.order_status(order["order_id"]).state == "completed"
    assert len(ledger.effects("UnitAssigned")) == 1 and len(ledger.effects("UnitFinalized")) == 1
