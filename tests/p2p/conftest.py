"""Fixtures for the data-plane tests: real libp2p hosts on 127.0.0.1, each on its own thread."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount

from veritrain.blobstore import BlobStore
from veritrain.p2p import P2PNode


def p2p_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith("p2p-")]


@pytest.fixture(autouse=True)
def no_leaked_host_threads() -> Iterator[None]:
    """Every test must stop the hosts it starts: no libp2p thread may outlive it."""
    before = set(p2p_threads())
    yield
    leaked = [thread for thread in p2p_threads() if thread not in before]
    assert leaked == [], f"libp2p host threads still running after the test: {leaked}"


@pytest.fixture
def server_store(tmp_path: Path) -> BlobStore:
    return BlobStore(tmp_path / "server-blobs")


@pytest.fixture
def server_account() -> LocalAccount:
    return Account.create()


@pytest.fixture
def client_account() -> LocalAccount:
    return Account.create()


@pytest.fixture
def server(server_store: BlobStore, server_account: LocalAccount) -> Iterator[P2PNode]:
    node = P2PNode(server_account, store=server_store)
    node.start()
    yield node
    node.stop()


@pytest.fixture
def client(client_account: LocalAccount) -> Iterator[P2PNode]:
    node = P2PNode(client_account)
    node.start()
    yield node
    node.stop()
