"""Celery: a real `veritrain market worker` process executes the market's tasks, on Redis and on the
embedded `filesystem://` broker; duplicate settlement deliveries have one effect on the chain, both on the
file-backed double and on the real contracts of a hardhat node (the worker connects by RPC URL,
deployments file and operator key, as in production)."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agents import CHAIN_ID, Clock
from celery import Celery
from chain_double import LedgerChain
from eth_account.signers.local import LocalAccount
from fastapi.testclient import TestClient
from market_flow import ROOT, bound, post_order, register_market, run_unit

from market.api import create_app
from market.celery_config import celery_settings
from market.chain_adapter import ChainClientSettlement
from market.context import MarketConfig
from market.domain.pricing import escrow_plan
from market.domain.replication import ReplicationPolicy
from market.ports import RegistryRecipeCatalog
from market.service import MarketService
from market.store import MarketStore
from veritrain.chain.backends import HardhatNode, RpcBackend, dev_accounts
from veritrain.chain.client import ChainClient
from veritrain.chain.deployment import MarketParams
from veritrain.messages import (
    AcceptSubmission,
    AgentRole,
    CommitSubmission,
    Offer,
    OrderRequest,
    OrderSpec,
    Registration,
    RevealSubmission,
    sign_message,
)
from veritrain.settings import Settings

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
RESULT_TIMEOUT_S = 60


class Worker:
    """A `veritrain market worker` child process and a client app with the same Celery settings."""

    def __init__(self, settings: Settings, log_path: Path, chain_env: dict[str, str] | None = None) -> None:
        """`chain_env` names the worker's chain; by default the file-backed double under the data dir."""
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("VERITRAIN_")},
            "VERITRAIN_DATA_DIR": str(settings.data_dir),
            "VERITRAIN_DATABASE_URL": settings.database_url,
            "VERITRAIN_BROKER_URL": settings.broker_url,
            "VERITRAIN_RESULT_BACKEND_URL": settings.result_backend_url,
            "VERITRAIN_CELERY_QUEUE": settings.celery_queue,
            **(chain_env or {"VERITRAIN_CHAIN_FACTORY": "chain_double:make_ledger_chain"}),
            "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO)]),
        }
        self.log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "apps", "market", "worker", "--no-beat", "--pool", "solo"],
            cwd=REPO,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.log_path = log_path
        self.app = Celery("veritrain-market-test")
        self.app.config_from_object(celery_settings(settings))

    def call(self, name: str, *args: Any) -> Any:
        return self.app.send_task(name, args=list(args)).get(timeout=RESULT_TIMEOUT_S)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.close()


def market_settings(tmp_path: Path, **overrides: Any) -> Settings:
    fields = {
        "data_dir": tmp_path,
        "database_url": f"sqlite:///{tmp_path / 'market.sqlite3'}",
        "celery_queue": f"veritrain-market-test-{uuid.uuid4().hex[:8]}",
        "chain_id": CHAIN_ID,
        **overrides,
    }
    settings = Settings(**fields)
    settings.ensure_dirs()
    return settings


@pytest.fixture
def live_market(tmp_path: Path, clock: Clock) -> tuple[MarketService, TestClient, LedgerChain, Clock]:
    """A market on a SQLite file in tmp_path, driven in-process; the worker shares the file and ledger.
    The clock is real time here because the worker process uses the real clock."""
    clock.now = int(time.time())
    store = MarketStore(f"sqlite:///{tmp_path / 'market.sqlite3'}")
    store.create_schema()
    ledger = LedgerChain(tmp_path / "ledger.json", CHAIN_ID)
    config = MarketConfig(chain_id=CHAIN_ID, policy=ReplicationPolicy(base_audit_ppm=0, trusted_audit_ppm=0))
    service = MarketService(store, RegistryRecipeCatalog(), ledger, config, clock=clock)
    return service, TestClient(create_app(service)), ledger, clock


def start_worker(
    settings: Settings, tmp_path: Path, chain_env: dict[str, str] | None = None
) -> Iterator[Worker]:
    worker = Worker(settings, tmp_path / "worker.log", chain_env)
    try:
        yield worker
    finally:
        worker.stop()
        if settings.broker_url.startswith("redis://"):
            clear_queue(settings)


def clear_queue(settings: Settings) -> None:
    """Leave the shared Redis as we found it: drop this test's queue and its bookkeeping keys."""
    import redis

    client = redis.Redis.from_url(settings.broker_url)
    for key in client.scan_iter(f"*{settings.celery_queue}*"):
        client.delete(key)
    client.close()


@pytest.mark.redis
def test_worker_on_redis_matches_and_settles_each_intent_once(
    tmp_path: Path, redis_url: str, live_market: Any, make_agent: Any
) -> None:
    service, client, ledger, clock = live_market
    settings = market_settings(tmp_path, broker_url=redis_url, result_backend_url=redis_url)
    for worker in start_worker(settings, tmp_path):
        providers, _ = register_market(client, make_agent)
        post_order(client, ledger, make_agent(), clock, total_steps=20)

        assert worker.call("market.match_units") == 1  # the worker matched the unit
        run_unit(
            client,
            service,
            {k.address: k for k in providers},
            {"default": "0x" + "42" * 32},
            drain_after=False,
        )
        pending = service.outbox.pending_outbox()
        assert len(pending) == 7  # 3 commits, 3 reveals, finalize

        outcomes: list[dict[str, Any]] = []
        for _ in range(10):  # every intent delivered twice at once; order-dependent ones wait a round
            entries = service.outbox.pending_outbox()
            if not entries:
                break
            results = [
                worker.app.send_task("market.send_settlement", args=[e]) for e in entries for _ in (1, 2)
            ]
            outcomes.extend(r.get(timeout=RESULT_TIMEOUT_S) for r in results)
        assert service.outbox.pending_outbox() == []
        assert len(ledger.effects("ReplicaCommitted")) == 3 and len(ledger.effects("ReplicaRevealed")) == 3
        assert len(ledger.effects("UnitFinalized")) == 1  # two deliveries, one effect
        # one commitBatch and one revealBatch (which finalized the unit): the other entries rode along
        assert sum(1 for o in outcomes if o["sent"]) == 2
        # the finalize queued an advance itself (no tick here: --no-beat); the solo worker ran it first
        assert worker.call("market.advance_orders") == 0
        assert service.orders.order_status(1).state == "completed"


def test_worker_on_the_embedded_filesystem_broker_runs_tasks(
    tmp_path: Path, live_market: Any, make_agent: Any
) -> None:
    service, client, ledger, clock = live_market
    settings = market_settings(tmp_path)  # filesystem:// broker and file:// results under tmp_path
    assert settings.uses_filesystem_broker and settings.result_backend_url.startswith("file://")
    for worker in start_worker(settings, tmp_path):
        register_market(client, make_agent)
        post_order(client, ledger, make_agent(), clock, total_steps=20)
        assert worker.call("market.match_units") == 1
        assert worker.call("market.sync_chain_events") == 1  # the order's posting
        swept = worker.call("market.sweep_heartbeats")
        assert swept["lost_agents"] == []
        status = service.orders.order_status(1)
        assert status.state == "running" and status.units[0].state == "proposed"


# --- a worker process settling on the real contracts of a hardhat node ------------------------------------

TOKEN = 10**18
REAL_PARAMS = MarketParams(
    commit_window=600,
    reveal_window=600,
    verdict_window=1200,
    min_verifiers=1,
    provider_collateral=TOKEN,
    slash_amount=TOKEN // 2,
    verifier_collateral=TOKEN,
    withhold_penalty=TOKEN // 2,
    spot_check_ppm=0,  # the fast path, deterministically
    solo_spot_check_ppm=0,
    probation_streak=0,
)


@dataclass
class RealChain:
    """Contracts deployed on a fresh hardhat node, with the deployments file and operator key a worker
    process needs, and the test's own client (it signs for the parties and reads the chain)."""

    node: HardhatNode
    client: ChainClient
    deployments: Path
    operator: LocalAccount
    buyer: LocalAccount
    providers: list[LocalAccount]
    verifiers: list[LocalAccount]

    def worker_env(self) -> dict[str, str]:
        return {
            "VERITRAIN_CHAIN_RPC_URL": self.node.url,
            "VERITRAIN_DEPLOYMENTS_FILE": str(self.deployments),
            "VERITRAIN_OPERATOR_KEY": "0x" + bytes(self.operator.key).hex(),
        }

    def count(self, name: str) -> int:
        return sum(1 for event in self.client.events() if event.name == name)


@pytest.fixture
def real_chain(tmp_path: Path) -> Iterator[RealChain]:
    """Its own node (not the session's), so the wall clock and block time agree for the market's deadlines."""
    with HardhatNode(log_path=tmp_path / "hardhat.log") as node:
        backend = node.backend()
        deployer, operator, buyer, *parties = dev_accounts(8)
        deployments = tmp_path / "deployments.json"
        client = ChainClient.deploy(
            backend, deployer, operator=operator, params=REAL_PARAMS, save_to=deployments
        )
        client.mint(buyer, 1_000 * TOKEN)
        for party in parties:
            client.mint(party, 10 * TOKEN)
            client.approve(party, client.deployment.stake_manager, 10 * TOKEN)
            client.stake(party, 10 * TOKEN)
        yield RealChain(node, client, deployments, operator, buyer, list(parties[:3]), list(parties[3:]))
        backend.close()


def sign_up(service: MarketService, chain: RealChain) -> None:
    now = int(time.time())
    nonce = itertools.count(1)
    for account in chain.providers + chain.verifiers:
        role = AgentRole.PROVIDER if account in chain.providers else AgentRole.VERIFIER
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
        service.agents.register(sign_message(registration, account.key, chain.client.chain_id))
        if role == AgentRole.PROVIDER:
            offer = Offer(
                agent=account.address,
                nonce=next(nonce),
                timestamp=now,
                price_per_pflop=10**17,
                expires_at=now + 3600,
            )
            service.agents.post_offer(sign_message(offer, account.key, chain.client.chain_id))


def escrow_order(service: MarketService, chain: RealChain) -> int:
    """The buyer escrows an order on chain and registers it with the market; returns the market's id."""
    client = chain.client
    spec = OrderSpec(
        buyer=chain.buyer.address,
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
    plan = escrow_plan(spec, RegistryRecipeCatalog().lookup(spec.recipe).flops_per_step)
    client.approve(chain.buyer, client.deployment.job_market, plan.total)
    chain_order_id, _ = client.post_order(
        chain.buyer,
        spec.spec_hash(),
        plan.units,
        plan.replicas,
        plan.price_per_replica,
        plan.verifier_fee_per_unit,
        spec.deadline,
    )
    order = service.orders.post_order(OrderRequest(spec=spec, chain_order_id=chain_order_id))
    assert order.id is not None
    return order.id


def deliver_twice(worker: Worker, service: MarketService) -> list[dict[str, Any]]:
    """Every pending outbox entry delivered twice at once, round after round, until none is pending."""
    outcomes: list[dict[str, Any]] = []
    for _ in range(10):
        entries = service.outbox.pending_outbox()
        if not entries:
            return outcomes
        results = [worker.app.send_task("market.send_settlement", args=[e]) for e in entries for _ in (1, 2)]
        outcomes.extend(r.get(timeout=RESULT_TIMEOUT_S) for r in results)
    raise AssertionError(f"outbox did not drain: {service.outbox.pending_outbox()}")


@pytest.mark.redis
@pytest.mark.chain
@pytest.mark.node_backend
def test_worker_settles_on_the_real_contracts_once_per_duplicate_delivery(
    tmp_path: Path, redis_url: str, real_chain: RealChain
) -> None:
    chain, client = real_chain, real_chain.client
    settings = market_settings(
        tmp_path, broker_url=redis_url, result_backend_url=redis_url, chain_id=client.chain_id
    )
    # The test's service only validates and queues; every transaction is sent by the worker process.
    port = ChainClientSettlement(
        ChainClient.connect(RpcBackend(chain.node.url), chain.deployments, relayer=chain.operator)
    )
    config = MarketConfig(
        chain_id=client.chain_id, policy=ReplicationPolicy(base_audit_ppm=0, trusted_audit_ppm=0)
    )
    store = MarketStore(settings.database_url)
    store.create_schema()
    service = MarketService(store, RegistryRecipeCatalog(), port, config)
    sign_up(service, chain)
    order_id = escrow_order(service, chain)

    for worker in start_worker(settings, tmp_path, chain.worker_env()):
        assert worker.call("market.match_units") == 1
        (unit,) = service.orders.order_status(order_id).units
        with store.transaction() as session:
            unit_key = store.get_unit(session, unit.unit_id).unit_key
        chosen = [p for p in chain.providers if p.address in unit.providers]
        deadline = client.now() + 3600
        chain_order_id = service.orders.order_status(order_id).chain_order_id
        for provider in chosen:
            signed = client.sign_accept(provider, chain_order_id, unit_key, deadline)
            service.assignments.accept(
                AcceptSubmission(
                    unit_id=unit.unit_id,
                    provider=provider.address,
                    nonce=signed.nonce,
                    deadline=deadline,
                    signature="0x" + signed.signature.hex(),
                )
            )
        deliver_twice(worker, service)  # assign
        assert chain.count("UnitAssigned") == 1
        chain_unit = service.orders.order_status(order_id).units[0].chain_unit_id
        assert chain_unit is not None

        state, salt = "0x" + "5e" * 32, "0x" + "a7" * 32
        digest = bound(state)
        for provider in chosen:
            commitment = client.commitment(digest, salt, provider, chain_unit)
            signed = client.sign_unit_commit(provider, chain_unit, commitment, deadline)
            service.assignments.commit(
                CommitSubmission(
                    unit_id=unit.unit_id,
                    provider=provider.address,
                    commitment="0x" + commitment.hex(),
                    deadline=deadline,
                    signature="0x" + signed.signature.hex(),
                )
            )
        for provider in chosen:
            service.assignments.reveal(
                RevealSubmission(
                    unit_id=unit.unit_id,
                    provider=provider.address,
                    result_digest=digest,
                    salt=salt,
                    state_digest=state,
                    transcript_root=ROOT,
                )
            )
        assert len(service.outbox.pending_outbox()) == 7  # 3 commits, 3 reveals, finalize
        outcomes = deliver_twice(worker, service)
        # two deliveries of each entry; one commitBatch, one revealBatch that finalized the unit
        assert sum(1 for o in outcomes if o["sent"]) == 2
        assert chain.count("ReplicaCommitted") == 3 and chain.count("ReplicaRevealed") == 3
        assert chain.count("UnitFinalized") == 1
        price = client.get_order(chain_order_id).price_per_replica
        for provider in chosen:
            assert client.credits(provider) == price

        # A redelivered finalize whose first run crashed after sending, before recording: the worker
        # sends it again, the contract refuses (UnitAlreadySettled) and the intent counts as confirmed.
        with store.transaction() as session:
            (finalize,) = [e for e in store.outbox_in(session, ["sent"]) if e.action == "finalize"]
            finalize.state = "pending"
            session.add(finalize)
            entry_id = finalize.id
        first, second = (worker.app.send_task("market.send_settlement", args=[entry_id]) for _ in (1, 2))
        results = [first.get(timeout=RESULT_TIMEOUT_S), second.get(timeout=RESULT_TIMEOUT_S)]
        assert [r["state"] for r in results] == ["confirmed", "confirmed"]
        assert not any(r["sent"] for r in results)
        assert "UnitAlreadySettled" in results[0]["detail"]
        assert chain.count("UnitFinalized") == 1  # still one effect on chain

        assert worker.call("market.sync_chain_events") > 0
        assert worker.call("market.advance_orders") == 0  # the settled finalize already triggered it
        assert service.orders.order_status(order_id).state == "completed"
