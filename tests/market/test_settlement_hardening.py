"""Issue 8: settlement against an adversary, on the real contracts (in-process EVM) and PostgreSQL.

Each test plays one attack from the issue through the market's own code paths; the chain is the source of
truth, so the market must end where the chain says, and never stall or pay out on its own say-so.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from eth_account.signers.local import LocalAccount
from fastapi.testclient import TestClient
from market_flow import snapshot

from apps.order import order_view, status_lines
from apps.protocol_harness import STAKE, ChainMarket, Result, funded_accounts, result
from market.api import create_app
from market.ports import SettlementPort
from market.store import MarketStore
from veritrain.api_client import MarketClient
from veritrain.chain.backends import HardhatNode, InProcessBackend
from veritrain.chain.client import ChainClient, UnitState
from veritrain.chain.deployment import MarketParams
from veritrain.chain.errors import UnitFinalizable
from veritrain.errors import UnboundResult

pytestmark = [pytest.mark.chain, pytest.mark.postgres]

# Chain spot checks off: these tests settle unanimous units on the fast path.
NO_SPOT_CHECKS = MarketParams(spot_check_ppm=0, solo_spot_check_ppm=0, probation_streak=0)


@pytest.fixture
def market(request: pytest.FixtureRequest, fresh_postgres_url: str) -> Iterator[ChainMarket]:
    """The market over fresh contracts; `request.param` (indirect) is its verifiers per unit (default 2)."""
    verifiers_per_unit = int(getattr(request, "param", 2))
    with InProcessBackend() as backend:
        accounts = list(backend.dev_accounts(9))
        client = ChainClient.deploy(backend, accounts[0], params=NO_SPOT_CHECKS)
        funded_accounts(client, accounts)
        store = MarketStore(fresh_postgres_url)
        store.create_schema()
        try:
            yield ChainMarket(
                client,
                store,
                accounts[1],
                accounts[2:6],
                accounts[6:9],
                verifiers_per_unit=verifiers_per_unit,
            )
        finally:
            store.dispose()


def _assigned_and_committed(
    market: ChainMarket, *, send_commits: bool = True
) -> tuple[int, int, list[LocalAccount], Result]:
    """An order whose one unit is assigned on chain and every replica committed to the honest result (the
    commits sent when `send_commits`): (order id, unit id, its providers, that result)."""
    order_id = market.post_order()
    unit_id, chosen = market.match_and_accept()
    market.send_outbox()  # assign
    honest = result("honest")
    for provider in chosen:
        market.commit(unit_id, provider, honest)
    if send_commits:
        market.send_outbox()  # commits
    return order_id, unit_id, chosen, honest


def test_sync_applies_a_finalize_revealed_around_the_market_and_keeps_going(market: ChainMarket) -> None:
    """Finding 5: the providers reveal straight on chain while the market still has every replica as
    committed. Their reveal cannot finalize (the fast path is the operator's until the verdict deadline):
    sync takes the reveals as the chain says, decides the unit, the market's finalize settles it, and later
    events still apply."""
    _, unit_id, chosen, honest = _assigned_and_committed(market)
    assert market.unit(unit_id).state == "revealing"
    assert not market.reveal_on_chain(unit_id, {p.address: honest for p in chosen}, sender=chosen[0])

    # a later event of another kind: a provider stakes more (matching must see it)
    late = market.providers[-1] if market.providers[-1] not in chosen else chosen[0]
    market.client.approve(late, market.client.deployment.stake_manager, 10**18)
    market.client.stake(late, 10**18)

    market.service.sync.sync_chain_events()
    assert market.unit(unit_id).state == "finalizing"
    assert market.send_outbox() == ["sent"]  # the market's finalize
    market.service.sync.sync_chain_events()
    assert market.unit(unit_id).state == "accepted"
    assert market.replica_states(unit_id) == ["accepted"] * 3
    with market.store.transaction() as session:
        assert {r.result_digest for r in market.store.replicas_of(session, unit_id)} == {honest.digest}
        assert market.store.get_agent(session, late.address).free_stake == market.client.free_stake(late)
        assert market.store.cursor(session).next_block == market.client.w3.eth.block_number + 1
    assert market.service.outbox.pending_outbox() == []
    chain_unit = market.unit(unit_id).chain_unit_id
    assert chain_unit is not None and market.client.get_unit(chain_unit).state == UnitState.FINALIZED


def _copied_reveal_batch(market: ChainMarket) -> tuple[int, int, list[LocalAccount], LocalAccount]:
    """A committed honest unit every provider revealed to the market, whose reveal batch a bystander copied
    and landed first: it revealed every replica but did not finalize. (unit id, chain unit, providers,
    the copier)."""
    _, unit_id, chosen, honest = _assigned_and_committed(market)
    for provider in chosen:
        market.service.assignments.reveal(market.reveal_submission(unit_id, provider, honest))
    assert market.unit(unit_id).state == "finalizing"
    copier = next(p for p in market.providers if p not in chosen)
    assert not market.reveal_on_chain(unit_id, {p.address: honest for p in chosen}, sender=copier)
    chain_unit = market.chain_unit(unit_id)
    assert market.client.get_unit(chain_unit).state == UnitState.REVEALING
    return unit_id, chain_unit, chosen, copier


def test_a_copied_reveal_batch_landing_first_cannot_finalize_and_the_market_still_settles(
    market: ChainMarket,
) -> None:
    """The market's pending `revealBatch` carries every salt, so anyone can copy it and land it first. The
    copy reveals but cannot finalize (the fast path is the operator's until the verdict deadline); the
    market's own batch then reverts, sync confirms the reveals from the chain's events, and the market's
    finalize settles the unit: every provider is paid."""
    unit_id, chain_unit, chosen, copier = _copied_reveal_batch(market)
    market.send_outbox()  # the market's batch: AlreadyRevealed, retried later
    market.service.sync.sync_chain_events()  # the copy's events confirm the market's reveals
    market.send_outbox()  # the finalize
    market.service.sync.sync_chain_events()
    assert market.client.get_unit(chain_unit).state == UnitState.FINALIZED
    assert market.unit(unit_id).state == "accepted"
    price = market.client.get_order(market.client.get_unit(chain_unit).order_id).price_per_replica
    assert all(market.client.credits(p) == price for p in chosen)
    assert market.client.credits(copier) == 0


def test_an_expiry_queued_for_a_finalizable_unit_waits_for_the_finalize_that_pays_the_providers(
    market: ChainMarket,
) -> None:
    """A copied reveal batch reveals every replica (no finalize: the fast path is the operator's) and the
    market's finalize does not land before the verdict deadline (its relay down), so the sweep queues an
    expiry as well. The expiry waits behind the unit's finalize, and an expiry sent by anyone else (the
    buyer) is refused (`UnitFinalizable`: it would hand the providers' pay back); once the finalize lands
    the unit is accepted, every provider paid, and the expiry is done with."""
    unit_id, chain_unit, chosen, _ = _copied_reveal_batch(market)
    market.send_outbox(skip=lambda action: action.startswith("finalize"))  # its own batch: AlreadyRevealed
    market.service.sync.sync_chain_events()  # the copy's reveals confirm the market's
    market.client.advance_time(market.client.get_unit(chain_unit).verdict_deadline - market.client.now() + 1)
    market.heartbeats()
    market.service.agents.sweep()
    assert "expire" in market.outbox_states(unit_id)
    market.send_outbox(skip=lambda action: action.startswith("finalize"))
    assert market.outbox_states(unit_id)["expire"] == "pending"  # behind the finalize
    with pytest.raises(UnitFinalizable):
        market.client.expire_unit(chain_unit, sender=market.buyer)
    assert market.client.get_unit(chain_unit).state == UnitState.REVEALING
    market.send_outbox()  # the finalize lands; the expiry meets a settled unit
    market.service.sync.sync_chain_events()
    assert market.client.get_unit(chain_unit).state == UnitState.FINALIZED
    assert market.unit(unit_id).state == "accepted"
    assert market.outbox_states(unit_id)["expire"] not in ("pending", "retrying", "failed")
    price = market.client.get_order(market.client.get_unit(chain_unit).order_id).price_per_replica
    assert all(market.client.credits(p) == price for p in chosen)


def test_a_settlement_that_reverts_applies_what_the_chain_did(market: ChainMarket) -> None:
    """Finding 6: the buyer calls `expireUnit` the moment the verdict deadline passes, before the market's
    reveals (whose batch would finalize the unit) land. They revert, and so does the finalize; the market
    re-reads the chain and fails the unit, so the round does not advance on a unit that paid nobody (it
    retries the unit under a new key)."""
    order_id, unit_id, chosen, honest = _assigned_and_committed(market, send_commits=False)
    for provider in chosen:
        market.service.assignments.reveal(market.reveal_submission(unit_id, provider, honest))
    assert market.unit(unit_id).state == "finalizing"
    market.send_outbox(skip=lambda action: action.startswith(("reveal", "finalize")))  # commits land
    chain_unit = market.unit(unit_id).chain_unit_id
    assert chain_unit is not None
    verdict_deadline = market.client.get_unit(chain_unit).verdict_deadline
    market.client.advance_time(verdict_deadline - market.client.now() + 1)
    market.client.expire_unit(chain_unit, sender=market.buyer)

    assert market.send_outbox() == ["reverted"] * 4  # the 3 reveals (one batch), then the finalize
    assert market.unit(unit_id).state == "failed"
    assert "accepted" not in market.replica_states(unit_id)
    assert market.service.orders.advance_orders() == 1  # a new attempt, not the next round
    status = market.service.orders.order_status(order_id)
    assert status.rounds_accepted == 0 and status.current_state_digest is None
    assert [u.state for u in status.units] == ["failed", "pending"]
    assert all(market.client.credits(p) == 0 for p in chosen)
    market.service.sync.sync_chain_events()  # the chain's own events agree
    assert market.unit(unit_id).state == "failed"


def test_a_reported_state_must_be_bound_to_the_revealed_result(market: ChainMarket) -> None:
    """Finding 8: a replica reveals its committed result digest but reports another state digest (to steer
    the next round). The market refuses it with a typed error and stores nothing."""
    _, unit_id, chosen, honest = _assigned_and_committed(market, send_commits=False)
    steering = market.reveal_submission(unit_id, chosen[0], honest).model_copy(
        update={"state_digest": result("steered").state_digest}
    )
    before = snapshot(market.store)
    with pytest.raises(UnboundResult, match="state_digest"):
        market.service.assignments.reveal(steering)
    assert snapshot(market.store) == before


def test_the_next_round_never_starts_from_a_state_nobody_bound(market: ChainMarket) -> None:
    """Finding 8: every replica revealed straight on chain, so the market holds no reported state bound to
    the accepted digest: the round retries the unit instead of starting round 1 from an unbound digest."""
    order_id, unit_id, chosen, honest = _assigned_and_committed(market)
    assert not market.reveal_on_chain(unit_id, {p.address: honest for p in chosen}, sender=chosen[0])
    market.service.sync.sync_chain_events()
    market.send_outbox()  # the market's finalize
    market.service.sync.sync_chain_events()
    assert market.service.orders.advance_orders() == 1
    status = market.service.orders.order_status(order_id)
    assert status.rounds_accepted == 0 and status.current_state_digest is None
    assert [(u.round_index, u.state) for u in status.units] == [(0, "accepted"), (0, "pending")]


@pytest.mark.parametrize("market", [3], indirect=True)
def test_a_verifier_whose_signature_contradicts_the_verdict_is_slashed_once(market: ChainMarket) -> None:
    """Finding 4: of a unit's 3 verifiers two sign the truth (the cheating replica is fraud) and a lazy one
    signs accept for all. Once the verdict settles, the market queues the lazy verifier's own signature and
    relays it when the unit's appeal window has passed unappealed (before that the chain's truth is not
    fixed and no transaction is sent): the chain slashes it exactly once (bounty to the market's sender),
    even when the relay is retried; the two who agreed keep every token."""
    order_id = market.post_order()
    unit_id, chosen = market.match_and_accept()
    market.send_outbox()  # assign
    honest, cheat = result("honest"), result("cheat")
    results = [honest, honest, cheat]
    for provider, res in zip(chosen, results, strict=True):
        market.commit(unit_id, provider, res)
    for provider, res in zip(chosen, results, strict=True):
        market.service.assignments.reveal(market.reveal_submission(unit_id, provider, res))
    assert market.unit(unit_id).state == "verifying"
    market.send_outbox()  # commits and reveals land
    chain_unit = market.unit(unit_id).chain_unit_id
    assert chain_unit is not None
    by_address = {v.address: v for v in market.verifiers}
    first, lazy, second = (by_address[a] for a in json.loads(market.unit(unit_id).verifiers_json))
    assert market.client.verifiers_of(chain_unit) == [first.address, lazy.address, second.address]
    stakes = {v.address: market.client.stake_of(v).bonded for v in (first, lazy, second)}
    truth, lazy_outcomes = [0, 0, 2], [0, 0, 0]
    market.sign_verdict(unit_id, first, truth)
    market.sign_verdict(unit_id, lazy, lazy_outcomes)
    market.sign_verdict(unit_id, second, truth)  # the majority: the verdict relay is queued
    assert market.send_outbox() == ["sent"]
    assert market.client.get_unit(chain_unit).state == UnitState.VERDICTED
    assert not any(a.startswith("slash_verifier") for a in market.outbox_states(unit_id))

    market.service.sync.sync_chain_events()  # the chain's verdict: the lazy signature contradicts it
    action = f"slash_verifier:{lazy.address}"
    assert [a for a in market.outbox_states(unit_id) if a.startswith("slash_verifier")] == [action]
    operator = market.client.relayer
    assert operator is not None
    tokens_before = market.client.token_balance(operator)
    assert market.send_outbox() == []  # TruthNotFixed: the appeal window is open, nothing was sent
    assert market.outbox_states(unit_id)[action] == "retrying"
    assert market.outbox_states(unit_id)["settle_held"] == "retrying"  # the cheat's slash waits too
    appeal_closes = market.client.get_unit(chain_unit).verdict_deadline
    appeal_closes += market.client.deployment.appeal_params.appeal_window
    market.client.advance_time(appeal_closes - market.client.now() + 1)
    assert market.send_outbox() == ["sent", "sent"]  # the held fraud's settlement, then the slash
    market.service.sync.sync_chain_events()
    assert market.outbox_states(unit_id)[action] == "confirmed"
    assert market.outbox_states(unit_id)["settle_held"] == "confirmed"

    collateral = market.client.deployment.appeal_params.verifier_slash
    bounty = collateral * market.client.deployment.appeal_params.bounty_bps // 10_000
    assert market.client.token_balance(operator) == tokens_before + bounty
    assert market.client.stake_of(lazy).bonded == stakes[lazy.address] - collateral
    for agreed in (first, second):  # never touched: stake whole and free again
        assert market.client.stake_of(agreed).bonded == stakes[agreed.address]
        assert market.client.free_stake(agreed) == stakes[agreed.address]
    with market.store.transaction() as session:
        job = market.store.job_for_unit(session, unit_id)
        assert job is not None
        slashed = {v.verifier: v.slashed for v in market.store.verdicts_of(session, job.id or 0)}
    assert slashed == {first.address: None, lazy.address: collateral, second.address: None}
    # the buyer sees it in `veritrain order status|watch` (over the market's HTTP API)
    with TestClient(create_app(market.service)) as http:
        lines = status_lines(order_view(MarketClient(http=http), order_id))
    assert any(f"slashed verifiers {lazy.address} (20 VERI)" in line for line in lines), lines

    # a worker that crashed before recording its send retries it: the chain refuses a second slash, the
    # market re-reads it and ends the entry as done; nothing moves twice
    with market.store.transaction() as session:
        entry = market.store.outbox_entry(session, unit_id, action)
        assert entry is not None
        entry.state = "pending"
        session.add(entry)
    assert market.send_outbox() == ["confirmed"]
    slashes = [e for e in market.client.events() if e.name == "VerifierSlashed"]
    assert len(slashes) == 1 and slashes[0].args["reporter"] == operator.address
    assert market.client.stake_of(lazy).bonded == stakes[lazy.address] - collateral
    assert market.client.token_balance(operator) == tokens_before + bounty


@pytest.mark.parametrize("market", [3], indirect=True)
def test_a_colluding_verifier_majority_is_slashed_after_an_appeal_and_the_honest_minority_is_not(
    market: ChainMarket,
) -> None:
    """Finding 4's last attack: two of three verifiers settle accept-all for a cheating replica. The market
    queues the honest minority's signature (it contradicts the verdict) but sends nothing while the appeal
    window is open; the minority appeals, a referee panel overturns the verdict, and the market's sync,
    seeing `AppealDecided`, queues and relays the colluders' own signatures: both are slashed, the
    minority's queued evidence ends reverted and it keeps every token."""
    market.post_order()
    unit_id, chosen = market.match_and_accept()
    market.send_outbox()  # assign
    honest_result, cheat = result("honest"), result("cheat")
    results = [honest_result, honest_result, cheat]
    for provider, res in zip(chosen, results, strict=True):
        market.commit(unit_id, provider, res)
    for provider, res in zip(chosen, results, strict=True):
        market.service.assignments.reveal(market.reveal_submission(unit_id, provider, res))
    market.send_outbox()  # commits and reveals land
    chain_unit = market.unit(unit_id).chain_unit_id
    assert chain_unit is not None
    by_address = {v.address: v for v in market.verifiers}
    honest, *colluders = (by_address[a] for a in json.loads(market.unit(unit_id).verifiers_json))
    truth, colluded = [0, 0, 2], [0, 0, 0]
    market.sign_verdict(unit_id, honest, truth)
    for colluder in colluders:
        market.sign_verdict(unit_id, colluder, colluded)
    assert market.send_outbox() == ["sent"]
    market.service.sync.sync_chain_events()
    minority = f"slash_verifier:{honest.address}"
    assert market.send_outbox() == []  # the truth is not fixed: nothing sent
    assert market.outbox_states(unit_id)[minority] == "retrying"

    client = market.client
    stakes = {v.address: client.stake_of(v).bonded for v in (honest, *colluders)}
    referees = list(client.backend.dev_accounts(12)[9:12])
    for referee in referees:
        client.mint(referee, 1_000 * 10**18)
        client.approve(referee, client.deployment.stake_manager, 2**256 - 1)
        client.stake(referee, 100 * 10**18)
        client.join_referee_pool(referee)
    client.appeal(chain_unit, honest)
    client.draw_panel(chain_unit)
    seated = {r.address: r for r in referees}
    deadline = client.now() + 3600
    for seat in client.get_appeal(chain_unit).panel[:2]:
        client.vote(chain_unit, truth, client.sign_referee_vote(seated[seat], chain_unit, truth, deadline))
    client.resolve_appeal(chain_unit, colluded, truth)

    market.service.sync.sync_chain_events()  # AppealDecided: evidence against the colluders
    operator = client.relayer
    assert operator is not None
    nonce = client.w3.eth.get_transaction_count(operator.address)
    states = market.send_outbox()
    assert sorted(states) == ["reverted", "sent", "sent"]  # the minority's evidence agrees with the truth
    # two slashes sent; the minority's evidence was refused by a read, without a transaction
    assert client.w3.eth.get_transaction_count(operator.address) == nonce + 2
    market.service.sync.sync_chain_events()
    outbox = market.outbox_states(unit_id)
    assert outbox[minority] == "reverted"
    slash = client.deployment.appeal_params.verifier_slash
    for colluder in colluders:
        assert outbox[f"slash_verifier:{colluder.address}"] == "confirmed"
        assert client.stake_of(colluder).bonded == stakes[colluder.address] - slash
    assert client.stake_of(honest).bonded == stakes[honest.address]
    assert client.free_stake(honest) == stakes[honest.address]


WRITES = frozenset(
    {
        "assign",
        "commit_batch",
        "reveal_batch",
        "finalize",
        "submit_verdict",
        "expire_unit",
        "slash_contradicting_verifier",
        "settle_verdict",
    }
)


class Outage:
    """The real port, but every transaction fails while the RPC node is down (reads keep working)."""

    def __init__(self, port: SettlementPort) -> None:
        self.port = port
        self.down = False

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.port, name)
        if name not in WRITES:
            return attribute

        def send(*args: Any) -> Any:
            if self.down:
                raise ConnectionError("RPC node unreachable")
            return attribute(*args)

        return send


def through_outage(market: ChainMarket, outage: Outage, seconds: int, then: int) -> None:
    """The worker's tick: every second of market time it sends what is due; the RPC node is down for the
    first ``seconds`` of ``then``."""
    for tick in range(then):
        outage.down = tick < seconds
        market.send_outbox()
        market.offset += 1


def test_a_ten_second_rpc_outage_strands_no_unit(fresh_postgres_url: str) -> None:
    """Finding 7: sends fail for 10 s while assigning and again while finalizing; backoff retries them
    after the outage, so the unit settles instead of staying in ASSIGNING or FINALIZING forever."""
    outage: Outage | None = None

    def wrap(port: SettlementPort) -> SettlementPort:
        nonlocal outage
        outage = Outage(port)
        return outage  # type: ignore[return-value]

    with InProcessBackend() as backend:
        accounts = list(backend.dev_accounts(9))
        client = ChainClient.deploy(backend, accounts[0], params=NO_SPOT_CHECKS)
        funded_accounts(client, accounts)
        store = MarketStore(fresh_postgres_url)
        store.create_schema()
        market = ChainMarket(client, store, accounts[1], accounts[2:6], accounts[6:9], wrap=wrap)
        assert outage is not None
        market.post_order()
        unit_id, chosen = market.match_and_accept()
        through_outage(market, outage, seconds=10, then=60)
        assert market.unit(unit_id).state == "committing"
        honest = result("honest")
        for provider in chosen:
            market.commit(unit_id, provider, honest)
        for provider in chosen:
            market.service.assignments.reveal(market.reveal_submission(unit_id, provider, honest))
        through_outage(market, outage, seconds=10, then=60)
        assert market.unit(unit_id).state == "accepted"
        assert all(market.client.credits(p) > 0 for p in chosen)
        store.dispose()


def test_a_verifier_that_unstaked_below_the_minimum_is_never_picked(market: ChainMarket) -> None:
    """Finding 7: the contract refuses an assignment naming a verifier whose bonded stake fell below the
    minimum; matching must see the unstake (through the event sync) and pick others."""
    market.service.config = replace(market.service.config, verifiers_per_unit=3)  # all, if eligible
    gone = market.verifiers[1]
    market.client.request_unstake(gone, STAKE - market.client.params.verifier_collateral + 1)
    market.service.sync.sync_chain_events()
    market.post_order()
    unit_id, _ = market.match_and_accept()
    assert gone.address not in json.loads(market.unit(unit_id).verifiers_json)
    market.send_outbox()
    assert market.unit(unit_id).state == "committing"


@pytest.mark.node_backend
def test_sync_waits_for_confirmations_and_survives_a_reorg(
    hardhat_node: HardhatNode, fresh_postgres_url: str
) -> None:
    """Finding 11: events are applied only N = 2 blocks deep. A block the chain drops (evm_revert, as in
    a reorg) was never applied, and the block that replaces it at the same height is."""
    backend = hardhat_node.backend()
    accounts = list(backend.dev_accounts(9))
    client = ChainClient.deploy(backend, accounts[0], params=NO_SPOT_CHECKS)
    funded_accounts(client, accounts)
    store = MarketStore(fresh_postgres_url)
    store.create_schema()
    market = ChainMarket(client, store, accounts[1], accounts[2:6], accounts[6:9])
    market.service.config = replace(market.service.config, confirmations=2)
    dropped, kept = market.providers[0], market.providers[1]
    market.service.sync.sync_chain_events()
    snapshot_id = backend.snapshot()
    client.approve(dropped, client.deployment.stake_manager, 10**18)
    client.stake(dropped, 10**18)  # the head block: not deep enough yet
    market.service.sync.sync_chain_events()
    backend.revert(snapshot_id)  # the reorg: the stake never happened
    client.approve(kept, client.deployment.stake_manager, 10**18)
    client.stake(kept, 10**18)  # what the chain holds at those heights now
    client.advance_time(1)
    client.advance_time(1)  # two blocks on top
    market.service.sync.sync_chain_events()
    with store.transaction() as session:
        for account in (dropped, kept):
            assert store.get_agent(session, account.address).free_stake == client.free_stake(account)
        assert store.cursor(session).next_block == client.w3.eth.block_number - 2 + 1
    store.dispose()
