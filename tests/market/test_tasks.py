"""Celery: a real `veritrain market worker` process executes the market's tasks, on Redis and on the
embedded `filesystem://` broker; duplicate settlement deliveries have one effect on the chain."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import CHAIN_ID, Clock
from celery import Celery
from chain_double import LedgerChain
from fastapi.testclient import TestClient
from market_flow import post_order, register_market, run_unit

from market.api import create_app
from market.celery_config import celery_settings
from market.domain.replication import ReplicationPolicy
from market.ports import RegistryRecipeCatalog
from market.service import MarketConfig, MarketService
from market.store import MarketStore
from veritrain.settings import Settings

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
RESULT_TIMEOUT_S = 60


class Worker:
    """A `veritrain market worker` child process and a client app with the same Celery settings."""

    def __init__(self, settings: Settings, log_path: Path) -> None:
        env = {
            **os.environ,
            "VERITRAIN_DATA_DIR": str(settings.data_dir),
            "VERITRAIN_DATABASE_URL": settings.database_url,
            "VERITRAIN_BROKER_URL": settings.broker_url,
            "VERITRAIN_RESULT_BACKEND_URL": settings.result_backend_url,
            "VERITRAIN_CELERY_QUEUE": settings.celery_queue,
            "VERITRAIN_CHAIN_FACTORY": "chain_double:make_ledger_chain",
            "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO)]),
        }
        self.log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "veritrain", "market", "worker", "--no-beat", "--pool", "solo"],
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


def start_worker(settings: Settings, tmp_path: Path) -> Iterator[Worker]:
    worker = Worker(settings, tmp_path / "worker.log")
    try:
        yield worker
    finally:
        worker.stop()


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
        pending = service.pending_outbox()
        assert len(pending) == 7  # 3 commits, 3 reveals, finalize

        outcomes: list[dict[str, Any]] = []
        for _ in range(10):  # every intent delivered twice at once; order-dependent ones wait a round
            entries = service.pending_outbox()
            if not entries:
                break
            results = [
                worker.app.send_task("market.send_settlement", args=[e]) for e in entries for _ in (1, 2)
            ]
            outcomes.extend(r.get(timeout=RESULT_TIMEOUT_S) for r in results)
        assert service.pending_outbox() == []
        assert len(ledger.effects("Committed")) == 3 and len(ledger.effects("Revealed")) == 3
        assert len(ledger.effects("UnitFinalized")) == 1  # two deliveries, one effect
        assert sum(1 for o in outcomes if o["sent"]) == 7
        assert worker.call("market.advance_orders") == 1
        assert service.order_status(1).state == "completed"
    import redis

    client_redis = redis.Redis.from_url(redis_url)  # leave the shared Redis as we found it
    for key in client_redis.scan_iter(f"*{settings.celery_queue}*"):
        client_redis.delete(key)
    client_redis.close()


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
        assert worker.call("market.sync_chain_events") == 0
        swept = worker.call("market.sweep_heartbeats")
        assert swept["lost_agents"] == []
        status = service.order_status(1)
        assert status.state == "running" and status.units[0].state == "proposed"
