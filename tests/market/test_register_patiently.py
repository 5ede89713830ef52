"""Agents wait for a market that is not up yet or too busy to answer, and stop at a real refusal."""

from __future__ import annotations

import httpx
import pytest

from veritrain.agentkit import register_patiently
from veritrain.api_client import MarketClient, MarketRefused
from veritrain.errors import MarketError


def market_answering(*answers: int | Exception) -> tuple[MarketClient, list[int]]:
    """A client whose market answers every request with each of ``answers`` in turn (a status code or
    a transport error), and the list of calls it saw."""
    calls: list[int] = []

    def handle(request: httpx.Request) -> httpx.Response:
        calls.append(len(calls))
        answer = answers[min(len(calls) - 1, len(answers) - 1)]
        if isinstance(answer, Exception):
            raise answer
        if answer >= 400:
            return httpx.Response(
                answer, json={"error": "Busy" if answer != 400 else "BadSignature", "detail": "x"}
            )
        return httpx.Response(200, json={"ok": True})

    http = httpx.Client(base_url="http://market", transport=httpx.MockTransport(handle))
    return MarketClient(http=http), calls


def register(client: MarketClient) -> object:
    """Any call through the client's public API goes the same way as a registration (same error mapping)."""
    return client.dashboard_data()


class FakeTime:
    """Sleeping advances the clock (no real waiting in a unit test of the retry policy)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def clock(self) -> float:
        return self.now


def test_an_unreachable_then_busy_market_is_waited_for_with_backoff() -> None:
    client, calls = market_answering(httpx.ConnectError("refused"), httpx.ReadTimeout("slow"), 503, 429, 200)
    time = FakeTime()
    assert register_patiently(lambda: register(client), sleep=time.sleep, clock=time.clock) == {"ok": True}
    assert len(calls) == 5
    assert time.slept == [0.5, 1.0, 2.0, 4.0]


def test_a_refusal_is_final() -> None:
    client, calls = market_answering(400)
    time = FakeTime()
    with pytest.raises(MarketRefused) as refused:
        register_patiently(lambda: register(client), sleep=time.sleep, clock=time.clock)
    assert refused.value.status == 400 and len(calls) == 1 and time.slept == []


def test_patience_runs_out() -> None:
    client, calls = market_answering(httpx.ConnectError("refused"))
    time = FakeTime()
    with pytest.raises(MarketError, match="unreachable"):
        register_patiently(lambda: register(client), patience_s=3.0, sleep=time.sleep, clock=time.clock)
    assert time.slept == [0.5, 1.0]  # the next wait (2 s) would end past 3 s of patience
    assert len(calls) == 3
