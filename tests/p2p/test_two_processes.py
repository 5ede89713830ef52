"""The blob protocol between two OS processes (as between real agents), including a server restart."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from veritrain.blobstore import BlobStore
from veritrain.errors import BlobNotFound
from veritrain.p2p import CHUNK_BYTES, P2PNode, load_or_create_peer_key, peer_id_of
from veritrain.p2p.process import start_server_process, stop_server_process


def test_fetch_from_another_process_and_after_its_restart(tmp_path: Path, client: P2PNode) -> None:
    store = BlobStore(tmp_path / "blobs")
    data = os.urandom(8 * (1 << 20))
    digest = store.put(data)
    key_file = tmp_path / "server.key"
    expected_peer_id = peer_id_of(load_or_create_peer_key(key_file))

    process, address = start_server_process(store.root, str(key_file))
    try:
        assert address.endswith(f"/p2p/{expected_peer_id}")
        assert client.fetch(address, digest) == data  # first fetch pays for the dial
        started = time.perf_counter()
        assert client.fetch(address, digest) == data
        seconds = time.perf_counter() - started
        print(
            f"\n8 MiB over loopback between two processes: {8 / seconds:.1f} MiB/s ({CHUNK_BYTES} B chunks)"
        )
        with pytest.raises(BlobNotFound):
            client.fetch(address, "ee" * 32)
        assert client.connections_opened == 1
    finally:
        assert stop_server_process(process) == 0

    # The agent restarts (new port, same key file): same peer id, and the client gets through again.
    process, new_address = start_server_process(store.root, str(key_file))
    try:
        assert new_address.endswith(f"/p2p/{expected_peer_id}")
        assert client.fetch(new_address, digest, timeout=30) == data
    finally:
        assert stop_server_process(process) == 0
