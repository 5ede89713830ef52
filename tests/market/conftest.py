"""Fixtures for the market tests: stores on SQLite and a fresh PostgreSQL database, a chain double,
signing agents and a settable clock."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from eth_account import Account

HERE = Path(__file__).parent
if str(HERE) not in sys.path:  # chain_double is imported by name here and in worker processes
    sys.path.insert(0, str(HERE))

from agents import CHAIN_ID, AgentKey, Clock  # noqa: E402
from chain_double import LedgerChain  # noqa: E402

from market.context import MarketConfig  # noqa: E402
from market.ports import RegistryRecipeCatalog  # noqa: E402
from market.service import MarketService  # noqa: E402
from market.store import MarketStore  # noqa: E402
from veritrain.chain.backends import HardhatNode  # noqa: E402


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'market.sqlite3'}"
    return str(request.getfixturevalue("fresh_postgres_url"))


@pytest.fixture
def store(store_url: str) -> Iterator[MarketStore]:
    market_store = MarketStore(store_url)
    market_store.create_schema()
    yield market_store
    market_store.dispose()


@pytest.fixture
def ledger(tmp_path: Path) -> LedgerChain:
    return LedgerChain(tmp_path / "ledger.json", CHAIN_ID)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def service(store: MarketStore, ledger: LedgerChain, clock: Clock) -> MarketService:
    config = MarketConfig(chain_id=CHAIN_ID, min_verifiers=1, verifiers_per_unit=2)
    return MarketService(store, RegistryRecipeCatalog(), ledger, config, clock=clock)


@pytest.fixture
def make_agent(clock: Clock) -> Callable[..., AgentKey]:
    def make(operator: str = "") -> AgentKey:
        return AgentKey(Account.create(), clock, operator)

    return make


@pytest.fixture(scope="session")
def hardhat_node() -> Iterator[HardhatNode]:
    """One real `hardhat node` for the session's market tests, started and stopped by its own PID."""
    with HardhatNode() as node:
        yield node
