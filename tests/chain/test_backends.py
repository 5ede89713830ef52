"""Backends: the hardhat node launcher starts and stops its own process; unreachable URLs fail typed."""

from __future__ import annotations

import os
import signal

import pytest
import requests

from veritrain.chain.backends import (
    HARDHAT_CHAIN_ID,
    HardhatNode,
    InProcessBackend,
    RpcBackend,
    dev_accounts,
    free_port,
)
from veritrain.chain.errors import RpcUnavailable

pytestmark = pytest.mark.chain


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still "exists" for kill(0): look at its state
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.node_backend
def test_hardhat_node_starts_answers_and_is_stopped_by_pid() -> None:
    with HardhatNode() as node:
        pid = node.pid
        assert pid is not None and _process_exists(pid)
        backend = node.backend()
        assert backend.chain_id == HARDHAT_CHAIN_ID
        funded = dev_accounts(1)[0].address
        assert backend.w3.eth.get_balance(funded) > 0
        before = backend.latest_timestamp()
        assert backend.advance_time(1000) >= before + 1000
    assert not _process_exists(pid)
    assert node.pid is None
    node.stop()  # idempotent


@pytest.mark.node_backend
def test_a_frozen_hardhat_node_does_not_answer_and_thaws_with_its_state() -> None:
    """The chaos bench's EVM-node fault: SIGSTOP freezes the node, chain and all; SIGCONT brings it back
    with every block it had (a restart would be a new, empty chain)."""
    with HardhatNode() as node:
        backend = node.backend()
        backend.advance_time(100)
        height = backend.w3.eth.block_number
        ask = {"jsonrpc": "2.0", "id": 1, "method": "eth_blockNumber"}
        node.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(requests.RequestException):
                requests.post(node.url, json=ask, timeout=1)
        finally:
            node.send_signal(signal.SIGCONT)
        assert backend.w3.eth.block_number == height
    with pytest.raises(RpcUnavailable, match="not running"):
        node.send_signal(signal.SIGCONT)


def test_rpc_backend_to_a_dead_port_raises_rpc_unavailable() -> None:
    with pytest.raises(RpcUnavailable):
        RpcBackend(f"http://127.0.0.1:{free_port()}", timeout=1.0)


def test_in_process_backend_funds_the_same_dev_accounts() -> None:
    with InProcessBackend(accounts=3) as backend:
        for account in dev_accounts(3):
            assert backend.w3.eth.get_balance(account.address) > 0
        snapshot = backend.snapshot()
        start = backend.latest_timestamp()
        assert backend.advance_time(3600) >= start + 3600
        backend.revert(snapshot)
        assert backend.latest_timestamp() == start


@pytest.mark.node_backend
def test_hardhat_node_that_does_not_answer_in_time_is_stopped_with_a_clear_error() -> None:
    node = HardhatNode(startup_timeout=0.05)
    with pytest.raises(RpcUnavailable, match="did not answer eth_chainId") as caught:
        node.start()
    assert "log" in str(caught.value)
    assert node.pid is None
