"""Truth before money: the chain holds a verdict's fraud replicas (collateral locked, no slash) until the
unit's truth is fixed; the market relays `settle_held` (VerdictAppeals.settleVerdict) through its outbox.
On the chain double (an appeal window on the double's own clock), SQLite and PostgreSQL."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agents import Clock
from chain_double import LedgerChain
from fastapi.testclient import TestClient
from market_flow import drain_outbox, post_order, register_market, run_unit, verdict_body

from market.api import create_app
from market.context import MarketConfig
from market.domain.replication import ReplicationPolicy
from market.outbox import OUTBOX_BACKOFF_MAX_S, SETTLE_HELD, TRUTH_WAIT_MAX_S
from market.service import MarketService
from market.store import OutboxRow

APPEAL_WINDOW_S = 3600
HONEST, FORGED = "0x" + "11" * 32, "0x" + "66" * 32


@dataclass(frozen=True)
class Verdicted:
    """A unit settled by its two verifiers' verdict, whose chain event the market has not synced yet."""

    unit_id: int
    chain_unit: int
    cheat: str
    outcomes: list[int]


def verdicted_unit(
    service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock, cheat_outcome: int = 2
) -> Verdicted:
    """One 3-replica unit with one replica off the others' result, judged `cheat_outcome` by both verifiers
    (the relayed verdict lands on the double)."""
    service.config = MarketConfig(
        chain_id=service.config.chain_id,
        min_verifiers=1,
        verifiers_per_unit=2,
        policy=ReplicationPolicy(base_audit_ppm=0, trusted_audit_ppm=0),
    )
    ledger.set_appeal_window(APPEAL_WINDOW_S)
    client = TestClient(create_app(service))
    providers, verifiers = register_market(client, make_agent)
    post_order(client, ledger, make_agent(), clock, total_steps=20)
    (match,) = service.matching.match_pending()
    cheat = match.selected[1]
    keys = {k.address: k for k in providers}
    unit_id = run_unit(client, service, keys, {"default": HONEST, cheat: FORGED})
    jobs = [job for v in verifiers for job in client.post("/verification/jobs", json=_beat(v)).json()["jobs"]]
    job = jobs[0]
    outcomes = [cheat_outcome if r["provider"] == cheat else 0 for r in job["replicas"]]
    for i, verifier in enumerate(verifiers):
        body = verdict_body(verifier, job, outcomes, f"0x{i + 1:064x}", clock)
        assert client.post("/verification/verdict", json=body).status_code == 200
    drain_outbox(service)
    assert len(ledger.effects("VerdictRecorded")) == 1
    return Verdicted(unit_id, int(job["chain_unit_id"]), cheat, outcomes)


def _beat(agent: Any) -> dict[str, Any]:
    return dict(agent.heartbeat().model_dump(mode="json"))


def held_entry(service: MarketService, unit_id: int) -> OutboxRow | None:
    with service.store.transaction() as session:
        return service.store.outbox_entry(session, unit_id, SETTLE_HELD)


def agent_facts(service: MarketService, address: str) -> tuple[int, int, int]:
    """What matching knows of an agent: (free stake, bonded stake, fraud count)."""
    with service.store.transaction() as session:
        agent = service.store.get_agent(session, address)
        return agent.free_stake, agent.bonded_stake, agent.rep_fraud


def test_a_fraud_verdict_queues_the_held_settlement_which_waits_for_the_truth_then_lands_once(
    service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    unit = verdicted_unit(service, ledger, make_agent, clock)
    assert held_entry(service, unit.unit_id) is None  # the sync queues it, from the chain's verdict
    service.sync.sync_chain_events()
    entry = held_entry(service, unit.unit_id)
    assert entry is not None and entry.state == "pending"
    assert json.loads(entry.payload_json) == {"unit_id": unit.chain_unit, "outcomes": unit.outcomes}
    service.sync.sync_chain_events()  # the same event again queues nothing new
    with service.store.transaction() as session:
        queued = [e for e in service.store.outbox_in(session, ["pending"], 100) if e.action == SETTLE_HELD]
        assert len(queued) == 1

    # the appeal window is open: refused, and waits with a backoff (blocking nothing of the unit)
    drain_outbox(service)
    entry = held_entry(service, unit.unit_id)
    assert entry is not None and entry.state == "retrying" and "TruthNotFixed" in str(entry.last_error)
    assert entry.next_attempt_at > clock.now and service.outbox.pending_outbox() == []
    assert ledger.effects("HeldSettled") == []
    assert ledger.free_stake(unit.cheat) == ledger.bonded_stake(unit.cheat) - 10**18  # collateral held

    for _ in range(12):  # however long the window, the wait between free reads stays short
        clock.now = entry.next_attempt_at
        drain_outbox(service)
        entry = held_entry(service, unit.unit_id)
        assert entry is not None and entry.state == "retrying"
        assert entry.next_attempt_at - clock.now <= TRUTH_WAIT_MAX_S

    ledger.advance_time(APPEAL_WINDOW_S)  # unappealed: the verdict is the unit's truth
    clock.now += TRUTH_WAIT_MAX_S
    drain_outbox(service)
    entry = held_entry(service, unit.unit_id)
    assert entry is not None and entry.state == "sent" and entry.attempts == 14
    (slashed,) = ledger.effects("ReplicaSlashed")
    assert slashed["provider"] == unit.cheat and len(ledger.effects("HeldSettled")) == 1
    # the relay re-read the cheat at once: matching sees its slashed, released stake and its fraud
    bonded = ledger.bonded_stake(unit.cheat)
    assert agent_facts(service, unit.cheat) == (bonded, bonded, 1)
    service.sync.sync_chain_events()
    assert held_entry(service, unit.unit_id).state == "confirmed"  # type: ignore[union-attr]


def test_a_verdict_without_fraud_holds_nothing_and_queues_no_settlement(
    service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    unit = verdicted_unit(service, ledger, make_agent, clock, cheat_outcome=1)  # a fault: unpaid, not held
    service.sync.sync_chain_events()
    assert held_entry(service, unit.unit_id) is None
    assert ledger.effects("FraudHeld") == []


def test_a_held_settlement_someone_else_sent_confirms_the_entry_and_refreshes_the_cheat(
    service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    """settleVerdict is permissionless: whoever lands it, the sync's HeldSettled confirms the market's
    entry, and re-reads the held providers' stake and reputation for matching."""
    unit = verdicted_unit(service, ledger, make_agent, clock)
    service.sync.sync_chain_events()
    drain_outbox(service)  # TruthNotFixed: retrying
    before = agent_facts(service, unit.cheat)
    ledger.advance_time(APPEAL_WINDOW_S)
    ledger.settle_verdict(unit.chain_unit, unit.outcomes)  # another relayer
    service.sync.sync_chain_events()
    assert held_entry(service, unit.unit_id).state == "confirmed"  # type: ignore[union-attr]
    bonded = ledger.bonded_stake(unit.cheat)
    assert agent_facts(service, unit.cheat) == (bonded, bonded, 1) and bonded < before[1]
    clock.now += OUTBOX_BACKOFF_MAX_S
    assert service.outbox.pending_outbox() == []  # nothing more to send
    assert len(ledger.effects("HeldSettled")) == 1


def test_a_held_settlement_the_fixed_truth_refuses_ends_reverted_and_is_never_retried(
    service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    """Any refusal but TruthNotFixed on a verdicted unit can never change (here the payload's outcomes are
    not the verdict's): the entry ends reverted, off the queue. A settlement that lands later (say an
    appeal's resolve) still confirms it."""
    unit = verdicted_unit(service, ledger, make_agent, clock)
    service.sync.sync_chain_events()
    with service.store.transaction() as session:
        entry = service.store.outbox_entry(session, unit.unit_id, SETTLE_HELD)
        assert entry is not None
        entry.payload_json = json.dumps({"unit_id": unit.chain_unit, "outcomes": [0] * len(unit.outcomes)})
        session.add(entry)
    ledger.advance_time(APPEAL_WINDOW_S)
    drain_outbox(service)
    entry = held_entry(service, unit.unit_id)
    assert entry is not None and entry.state == "reverted" and "OutcomesMismatch" in str(entry.last_error)
    clock.now += 10 * OUTBOX_BACKOFF_MAX_S
    assert service.outbox.pending_outbox() == []
    assert service.outbox.send_outbox_entry(entry.id or 0).detail == "already done"
    assert ledger.effects("HeldSettled") == []

    ledger.settle_verdict(unit.chain_unit, unit.outcomes)
    service.sync.sync_chain_events()
    assert held_entry(service, unit.unit_id).state == "confirmed"  # type: ignore[union-attr]


def test_a_settled_verdict_does_not_wait_for_its_held_settlement(
    service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    """The unit and its order move on at the verdict: only money waits for the truth."""
    unit = verdicted_unit(service, ledger, make_agent, clock)
    service.sync.sync_chain_events()
    drain_outbox(service)
    assert held_entry(service, unit.unit_id).state == "retrying"  # type: ignore[union-attr]
    with service.store.transaction() as session:
        assert service.store.get_unit(session, unit.unit_id).state == "accepted"
        states = {r.provider: r.state for r in service.store.replicas_of(session, unit.unit_id)}
    assert states[unit.cheat] == "fraud"
    assert service.orders.advance_orders() == 1
