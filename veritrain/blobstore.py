"""A local content-addressed blob folder: datasets, checkpoints and PoL transcripts by sha256.

A blob's name is the sha256 hex of its bytes, so a blob is immutable, deduplicated, and any copy can
be checked against its name. Files live at ``<root>/<d[0:2]>/<d[2:4]>/<d>`` (fan-out keeps
directories small). Writes go to a temporary file in the same filesystem, are fsynced, then renamed
into place and the directory fsynced: a crash leaves either the whole blob or nothing under its name.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, BinaryIO

from veritrain.errors import BlobNotFound, DigestMismatch, InvalidDigest

__all__ = ["BlobStore", "check_digest", "sha256_hex"]

_DIGEST_RE = re.compile(r"[0-9a-f]{64}")
_COPY_CHUNK = 1 << 20


def check_digest(digest: str) -> str:
    """Return `digest` if it is 64 lowercase hex characters; raise InvalidDigest otherwise.

    Digests come from other parties and become file paths, so nothing else may pass (no "../")."""
    if not isinstance(digest, str) or not _DIGEST_RE.fullmatch(digest):
        raise InvalidDigest(f"not a sha256 hex digest: {digest!r:.80}")
    return digest


def sha256_hex(data: bytes | bytearray | memoryview) -> str:
    """The content address of `data`."""
    return hashlib.sha256(data).hexdigest()


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class BlobStore:
    """Content-addressed blobs under one root directory (safe to share between processes)."""

    def __init__(self, root: str | os.PathLike[str], *, verify_on_read: bool = False) -> None:
        self.root = Path(root)
        self.verify_on_read = verify_on_read
        self._tmp_dir = self.root / "tmp"
        self._tmp_dir.mkdir(parents=True, exist_ok=True)

    def _blob_path(self, digest: str) -> Path:
        check_digest(digest)
        return self.root / digest[0:2] / digest[2:4] / digest

    def path(self, digest: str) -> Path:
        """Path of a stored blob (read-only use); BlobNotFound if absent."""
        blob_path = self._blob_path(digest)
        if not blob_path.is_file():
            raise BlobNotFound(f"blob {digest} not in store {self.root}")
        return blob_path

    def has(self, digest: str) -> bool:
        return self._blob_path(digest).is_file()

    def size(self, digest: str) -> int:
        return self.path(digest).stat().st_size

    def open(self, digest: str) -> BinaryIO:
        """Open a stored blob for streaming reads (the caller verifies, e.g. a remote receiver)."""
        return self.path(digest).open("rb")

    def get(self, digest: str, *, verify: bool | None = None) -> bytes:
        """The blob's bytes; with verification (default: the store's `verify_on_read`) a blob whose bytes
        no longer hash to its name raises DigestMismatch instead of being returned."""
        data = self.path(digest).read_bytes()
        if (self.verify_on_read if verify is None else verify) and sha256_hex(data) != digest:
            raise DigestMismatch(f"stored blob {digest} is corrupt (hashes to {sha256_hex(data)})")
        return data

    def put(self, data: bytes | bytearray | memoryview, *, expected_digest: str | None = None) -> str:
        """Store `data` and return its digest; with `expected_digest`, refuse bytes that do not match it."""
        digest = sha256_hex(data)
        self._check_expected(digest, expected_digest)
        if not self.has(digest):
            self._install(self._write_tmp(lambda handle: handle.write(data)), digest)
        return digest

    def put_file(self, source: str | os.PathLike[str], *, expected_digest: str | None = None) -> str:
        """Copy a file into the store (streaming: the file need not fit in memory); return its digest."""
        hasher = hashlib.sha256()

        def copy(handle: IO[bytes]) -> None:
            with open(source, "rb") as src:
                while chunk := src.read(_COPY_CHUNK):
                    hasher.update(chunk)
                    handle.write(chunk)

        tmp_path = self._write_tmp(copy)
        digest = hasher.hexdigest()
        try:
            self._check_expected(digest, expected_digest)
        except DigestMismatch:
            tmp_path.unlink(missing_ok=True)
            raise
        self._install(tmp_path, digest)
        return digest

    @staticmethod
    def _check_expected(digest: str, expected_digest: str | None) -> None:
        if expected_digest is not None and check_digest(expected_digest) != digest:
            raise DigestMismatch(f"bytes hash to {digest}, expected {expected_digest}")

    def _write_tmp(self, fill: Callable[[IO[bytes]], object]) -> Path:
        """A fully written, fsynced temporary file in the store (same filesystem, so rename is atomic)."""
        with tempfile.NamedTemporaryFile(dir=self._tmp_dir, prefix="put-", delete=False) as handle:
            tmp_path = Path(handle.name)
            try:
                fill(handle)
                handle.flush()
                os.fsync(handle.fileno())
            except BaseException:
                tmp_path.unlink(missing_ok=True)
                raise
        return tmp_path

    def _install(self, tmp_path: Path, digest: str) -> None:
        """Rename a complete temporary file to its content address (or drop it if another writer won)."""
        final = self._blob_path(digest)
        try:
            if final.is_file():
                return
            final.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(tmp_path, 0o444)
            os.replace(tmp_path, final)
            _fsync_dir(final.parent)
        finally:
            tmp_path.unlink(missing_ok=True)

    def remove(self, digest: str) -> None:
        """Delete a blob (a state kept for someone else and released); absent already is fine. A reader that
        opened it keeps its bytes until it closes the file."""
        self._blob_path(digest).unlink(missing_ok=True)
