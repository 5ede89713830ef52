"""Regressions (found by `veritrain bench chaos` with lossy agent links): a chain read that failed inside an
agent's heartbeat tick (sign_commit reads the JobMarket nonce) raised RpcUnavailable out of run_forever,
which ended the heartbeat thread, and the agent exited with code 0 in the middle of its unit; and with
that fixed, `ChainClient.now()` raised requests' raw ConnectionError, which did the same. The loop must
log a chain outage and tick again, and every transport failure of an RPC backend must be RpcUnavailable.
Also found by the smoke: a provider restarted while its link was partitioned exited at once ("cannot
start: RpcUnavailable"); an agent's start now waits for the chain as it waits for the market."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from apps.faultproxy import FaultProxy, LinkMode
from node.agent import ProviderAgent
from verifier.agent import VerifierAgent
from veritrain.agentkit import chain_patiently
from veritrain.chain.backends import RpcBackend
from veritrain.chain.errors import RpcUnavailable


class Counter:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def labels(self, outcome: str) -> Counter:
        self.counts[outcome] = self.counts.get(outcome, 0) + 1
        return self

    def inc(self) -> None:
        return None


@pytest.mark.parametrize("run_forever", [ProviderAgent.run_forever, VerifierAgent.run_forever])
def test_a_chain_outage_in_a_tick_does_not_end_the_agents_loop(run_forever: Any) -> None:
    stop, ticks, heartbeats = threading.Event(), [], Counter()

    def tick() -> None:
        ticks.append(len(ticks))
        if len(ticks) == 1:
            raise RpcUnavailable("the node stopped answering: Connection reset by peer")
        stop.set()

    agent = SimpleNamespace(tick=tick, _stop=stop, metrics=SimpleNamespace(heartbeats=heartbeats))
    run_forever(agent)
    assert ticks == [0, 1]  # the loop went on after the outage
    assert heartbeats.counts == {"error": 1, "ok": 1}


def test_a_reset_or_refused_rpc_connection_is_rpc_unavailable_for_every_call() -> None:
    with FaultProxy() as proxy:
        (port,) = proxy.open("agent", [("127.0.0.1", 9)])  # discard port: nothing listens, refused
        backend = RpcBackend(f"http://127.0.0.1:{port}", timeout=2.0, check=False)
        with pytest.raises(RpcUnavailable):
            backend.latest_timestamp()  # ChainClient.now()
        proxy.set_mode("agent", LinkMode("partition"))
        with pytest.raises(RpcUnavailable):
            _ = backend.w3.eth.block_number


def test_an_agent_start_waits_for_an_unreachable_chain_and_gives_up_after_its_patience() -> None:
    with FaultProxy() as proxy:
        (port,) = proxy.open("agent", [("127.0.0.1", 9)])
        proxy.set_mode("agent", LinkMode("partition"))
        url = f"http://127.0.0.1:{port}"
        slept: list[float] = []
        attempts: list[int] = []

        def connect() -> str:
            attempts.append(len(attempts))
            if len(attempts) < 3:
                RpcBackend(url, timeout=2.0)  # the agent's connect_chain: raises RpcUnavailable
            return "connected"

        assert chain_patiently(connect, sleep=slept.append, clock=lambda: sum(slept)) == "connected"
        assert slept == [0.5, 1.0] and len(attempts) == 3

        slept.clear()
        with pytest.raises(RpcUnavailable):
            chain_patiently(
                lambda: RpcBackend(url, timeout=2.0),
                patience_s=3.0,
                sleep=slept.append,
                clock=lambda: sum(slept),
            )
        assert slept == [0.5, 1.0]  # the next wait (2 s) would end past 3 s of patience

    with pytest.raises(ValueError):  # anything but an unreachable chain is not retried
        chain_patiently(lambda: int("x"), sleep=slept.append)
