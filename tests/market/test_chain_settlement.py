"""The market service settling on the real contracts (in-process EVM) through `market.chain_adapter`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from eth_account.signers.local import LocalAccount
from market_flow import ROOT, bound

from market.chain_adapter import ChainClientSettlement
from market.context import MarketConfig
from market.domain.pricing import escrow_plan
from market.domain.replication import ReplicationPolicy
from market.ports import RegistryRecipeCatalog
from market.service import MarketService
from market.store import MarketStore
from veritrain.chain.backends import InProcessBackend
from veritrain.chain.client import ChainClient, UnitState
from veritrain.errors import OrderMismatch
from veritrain.messages import (
    AcceptSubmission,
    AgentRole,
    CommitSubmission,
    Heartbeat,
    Offer,
    OrderRequest,
    OrderSpec,
    Registration,
    RevealSubmission,
    sign_message,
)

pytestmark = pytest.mark.chain
STAKE = 200 * 10**18


@pytest.fixture
def chain() -> Iterator[tuple[ChainClient, list[LocalAccount]]]:
    with InProcessBackend() as backend:
        accounts = list(backend.dev_accounts(8))
        client = ChainClient.deploy(backend, accounts[0])
        for account in accounts[1:]:
            client.mint(account, 10_000 * 10**18)
        for account in accounts[2:]:  # providers and verifiers stake
            client.approve(account, client.deployment.stake_manager, STAKE)
            client.stake(account, STAKE)
        yield client, accounts


def test_order_settles_on_the_contracts_and_pays_every_replica(
    chain: tuple[ChainClient, list[LocalAccount]], tmp_path: Path
) -> None:
    client, accounts = chain
    _, buyer, *workers = accounts
    providers, verifiers = workers[:4], workers[4:]
    store = MarketStore(f"sqlite:///{tmp_path / 'market.sqlite3'}")
    store.create_schema()
    config = MarketConfig(
        chain_id=client.chain_id,
        verifier_quorum=client.params.verifier_quorum,
        policy=ReplicationPolicy(base_audit_ppm=0, trusted_audit_ppm=0),
    )
    service = MarketService(store, RegistryRecipeCatalog(), ChainClientSettlement(client), config)
    nonce = iter(range(1, 10_000))
    now = int(time.time())
    for account in providers + verifiers:
        role = AgentRole.PROVIDER if account in providers else AgentRole.VERIFIER
        registration = Registration(
            agent=account.address,
            nonce=next(nonce),
            timestamp=now,
            role=role,
            operator=account.address,
            memory_mb=8192,
            gflops=100,
            hardware_class="cpu",
            recipes=("digits-mlp",),
        )
        service.agents.register(sign_message(registration, account.key, client.chain_id))
        if role == AgentRole.PROVIDER:
            offer = Offer(
                agent=account.address,
                nonce=next(nonce),
                timestamp=now,
                price_per_pflop=10**17,
                expires_at=now + 3600,
            )
            service.agents.post_offer(sign_message(offer, account.key, client.chain_id))

    spec = OrderSpec(
        buyer=buyer.address,
        recipe="digits-mlp",
        dataset_digest="0x" + "cd" * 32,
        total_steps=10,
        unit_steps=10,
        replicas=3,
        seed=3,
        max_price_per_pflop=10**18,
        verifier_fee_per_unit=10**15,
        deadline=client.now() + 86_400,
    )
    plan = escrow_plan(spec, RegistryRecipeCatalog().lookup("digits-mlp").flops_per_step)
    client.approve(buyer, client.deployment.job_market, plan.total)
    order_id, _ = client.post_order(
        buyer,
        spec.spec_hash(),
        plan.units,
        plan.replicas,
        plan.price_per_replica,
        plan.verifier_fee_per_unit,
        spec.deadline,
    )
    other_spec = spec.model_copy(update={"seed": 4})
    with pytest.raises(OrderMismatch, match="spec_hash"):  # the chain order escrows another spec
        service.orders.post_order(OrderRequest(spec=other_spec, chain_order_id=order_id))
    order = service.orders.post_order(OrderRequest(spec=spec, chain_order_id=order_id))

    (match,) = service.matching.match_pending()
    assert match.complete
    by_address: dict[str, LocalAccount] = {a.address: a for a in providers}
    chosen = [by_address[a] for a in match.selected]
    unit_key = service.orders.order_status(order.id or 0).units[0]
    with store.transaction() as session:
        unit_row = store.get_unit(session, unit_key.unit_id)
    deadline = client.now() + 3600
    for provider in chosen:
        signed = client.sign_accept(provider, order_id, unit_row.unit_key, deadline)
        service.assignments.accept(
            AcceptSubmission(
                unit_id=unit_key.unit_id,
                provider=provider.address,
                nonce=signed.nonce,
                deadline=deadline,
                signature="0x" + signed.signature.hex(),
            )
        )
    drain(service)
    chain_unit = service.orders.order_status(order.id or 0).units[0].chain_unit_id
    assert chain_unit is not None and client.get_unit(chain_unit).state == UnitState.COMMITTING

    state, salt = "0x" + "5e" * 32, "0x" + "a7" * 32
    digest = bound(state)
    for provider in chosen:
        commitment = client.commitment(digest, salt, provider, chain_unit)
        signed = client.sign_commit(provider, chain_unit, commitment, deadline)
        service.assignments.commit(
            CommitSubmission(
                unit_id=unit_key.unit_id,
                provider=provider.address,
                commitment="0x" + commitment.hex(),
                nonce=signed.nonce,
                deadline=deadline,
                signature="0x" + signed.signature.hex(),
            )
        )
    for provider in chosen:
        service.assignments.reveal(
            RevealSubmission(
                unit_id=unit_key.unit_id,
                provider=provider.address,
                result_digest=digest,
                salt=salt,
                state_digest=state,
                transcript_root=ROOT,
            )
        )
    drain(service)
    assert client.get_unit(chain_unit).state == UnitState.FINALIZED
    for provider in chosen:
        assert client.credits(provider) == plan.price_per_replica
    assert service.sync.sync_chain_events() > 0
    assert service.outbox.pending_outbox() == []
    assert service.orders.advance_orders() == 1
    assert service.orders.order_status(order.id or 0).state == "completed"
    # a heartbeat after settlement carries no more work for the providers
    beat = Heartbeat(agent=chosen[0].address, nonce=next(nonce) + 100, timestamp=int(time.time()))
    assert service.agents.heartbeat(sign_message(beat, chosen[0].key, client.chain_id)).assignments == ()


def drain(service: MarketService) -> None:
    for _ in range(10):
        pending = service.outbox.pending_outbox()
        if not pending:
            return
        for entry_id in pending:
            result = service.outbox.send_outbox_entry(entry_id)
            assert result.state != "dead", result
    raise AssertionError("outbox did not drain")
