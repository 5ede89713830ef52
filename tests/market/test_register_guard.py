"""Issue 8 finding 11: /agents/register refuses a replay before it spends any RPC call, and a flood of
registrations from one client is rate limited. SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from chain_double import LedgerChain
from fastapi.testclient import TestClient

from market.api import REGISTER_BURST, create_app
from market.service import MarketService


@pytest.fixture
def counted(ledger: LedgerChain, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The chain reads the market makes, by method name."""
    calls: list[str] = []
    for name in ("free_stake", "reputation_of"):
        real = getattr(ledger, name)

        def counting(account: str, real: Any = real, name: str = name) -> Any:
            calls.append(name)
            return real(account)

        monkeypatch.setattr(ledger, name, counting)
    return calls


def test_a_replayed_registration_costs_no_rpc_call(
    service: MarketService, make_agent: Any, counted: list[str]
) -> None:
    client = TestClient(create_app(service))
    body = make_agent().registration().model_dump(mode="json")
    assert client.post("/agents/register", json=body).status_code == 200
    before = len(counted)
    replay = client.post("/agents/register", json=body)
    assert replay.status_code == 409 and replay.json()["error"] == "ReplayedMessage"
    assert len(counted) == before


def test_a_registration_flood_from_one_client_is_rate_limited(
    service: MarketService, make_agent: Any, counted: list[str]
) -> None:
    client = TestClient(create_app(service))
    codes = [
        client.post("/agents/register", json=make_agent().registration().model_dump(mode="json")).status_code
        for _ in range(REGISTER_BURST + 10)
    ]
    assert codes.count(200) == REGISTER_BURST and codes.count(429) == 10  # the market clock stands still
    assert len(counted) == 2 * REGISTER_BURST
