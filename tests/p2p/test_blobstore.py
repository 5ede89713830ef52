"""The local content-addressed blob folder."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from veritrain.blobstore import BlobStore, check_digest
from veritrain.errors import BlobNotFound, DigestMismatch, InvalidDigest


def test_put_get_and_fan_out_layout(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    data = os.urandom(100_000)
    digest = store.put(data)
    assert digest == hashlib.sha256(data).hexdigest()
    assert store.has(digest)
    assert store.get(digest) == data
    assert store.size(digest) == len(data)
    assert store.path(digest) == tmp_path / "blobs" / digest[:2] / digest[2:4] / digest
    with store.open(digest) as handle:
        assert handle.read() == data
    assert store.put(data) == digest, "putting the same bytes twice is idempotent"
    assert list((tmp_path / "blobs" / "tmp").iterdir()) == [], "no temporary files left behind"


def test_put_file_streams_and_matches_put(tmp_path: Path) -> None:
    source = tmp_path / "weights.bin"
    data = os.urandom(3 * (1 << 20) + 17)
    source.write_bytes(data)
    store = BlobStore(tmp_path / "blobs")
    digest = store.put_file(source)
    assert digest == hashlib.sha256(data).hexdigest()
    assert store.get(digest, verify=True) == data
    assert BlobStore(tmp_path / "other").put(data) == digest


def test_expected_digest_is_enforced(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    wrong = hashlib.sha256(b"something else").hexdigest()
    with pytest.raises(DigestMismatch):
        store.put(b"payload", expected_digest=wrong)
    source = tmp_path / "f"
    source.write_bytes(b"payload")
    with pytest.raises(DigestMismatch):
        store.put_file(source, expected_digest=wrong)
    assert not store.has(hashlib.sha256(b"payload").hexdigest())
    assert list((tmp_path / "tmp").iterdir()) == []


def test_verify_on_read_catches_corruption(tmp_path: Path) -> None:
    store = BlobStore(tmp_path, verify_on_read=True)
    digest = store.put(b"original bytes")
    path = store.path(digest)
    path.chmod(0o644)
    path.write_bytes(b"tampered bytes")
    with pytest.raises(DigestMismatch):
        store.get(digest)
    assert store.get(digest, verify=False) == b"tampered bytes"
    assert BlobStore(tmp_path).get(digest) == b"tampered bytes", "verification is opt-in per store"


@pytest.mark.parametrize(
    "digest", ["", "../../etc/passwd", "A" * 64, "0" * 63, "0" * 65, "g" * 64, "0" * 62 + "/x", 42]
)
def test_invalid_digests_never_become_paths(tmp_path: Path, digest: object) -> None:
    store = BlobStore(tmp_path)
    with pytest.raises(InvalidDigest):
        check_digest(digest)  # type: ignore[arg-type]
    with pytest.raises(InvalidDigest):
        store.has(digest)  # type: ignore[arg-type]
    with pytest.raises(InvalidDigest):
        store.get(digest)  # type: ignore[arg-type]


def test_missing_blob_is_typed(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    absent = "ab" * 32
    assert not store.has(absent)
    for call in (store.get, store.path, store.size):
        with pytest.raises(BlobNotFound):
            call(absent)


def test_concurrent_writers_of_the_same_blob(tmp_path: Path) -> None:
    data = os.urandom(1 << 20)
    digests: list[str] = []
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            digests.append(BlobStore(tmp_path).put(data))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(set(digests)) == 1
    assert BlobStore(tmp_path).get(digests[0], verify=True) == data
    assert list((tmp_path / "tmp").iterdir()) == []
