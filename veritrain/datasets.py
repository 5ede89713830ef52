"""Recipe datasets: real text and images that every machine already has, as content-addressed blobs.

Why blobs: an order names its dataset by sha256 of canonical bytes, so "the same data" is checkable by
anybody. A dataset is built from its canonical blob (``dataset_from_blob``), whether that blob was read
from local files (``load_dataset``) or received over the data plane.

- ``python-stdlib-3.11``: a fixed, sorted list of CPython 3.11 standard-library sources, concatenated
  (each file preceded by a ``# file: <name>`` line), capped at ``STDLIB_CORPUS_CAP`` bytes. The files were
  picked because they are byte-identical in 3.11.2 and 3.11.7; another Python's text yields another digest,
  i.e. another dataset, and ``load_dataset(..., expected_digest=...)`` refuses it.
- ``python-stdlib-tree``: every ``.py`` file of this interpreter's standard library (tests, caches and
  installed packages excluded), sorted by relative path, each preceded by ``# file: <path>``, capped at
  ``STDLIB_TREE_CAP`` bytes — ~11.6 MiB on CPython 3.11.7, the corpus of the real-size recipe. Its digest
  depends on the interpreter's exact version, so the order pins the digest and a provider whose local tree
  differs gets the blob by digest from a peer (``load_dataset(..., fetch=...)``).
- ``sklearn-digits``: the 1797 8×8 images (pixel values 0–16) and labels shipped inside scikit-learn as
  ``sklearn/datasets/data/digits.csv.gz``; read straight from the package files (importing sklearn is slow
  and unnecessary). Canonical blob: per sample 64 pixel bytes then 1 label byte.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.util
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from veritrain.errors import DatasetMismatch, DatasetUnavailable, InvalidInput

if TYPE_CHECKING:
    import torch

STDLIB_DATASET = "python-stdlib-3.11"
DIGITS_DATASET = "sklearn-digits"
STDLIB_FILES: tuple[str, ...] = (
    "copy.py",
    "csv.py",
    "difflib.py",
    "fractions.py",
    "functools.py",
    "glob.py",
    "graphlib.py",
    "heapq.py",
    "numbers.py",
    "operator.py",
    "pprint.py",
    "queue.py",
    "shlex.py",
    "string.py",
    "textwrap.py",
)
STDLIB_CORPUS_CAP = 320 * 1024
STDLIB_TREE_DATASET = "python-stdlib-tree"
STDLIB_TREE_CAP = 32 * 1024 * 1024
STDLIB_TREE_EXCLUDED = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
)
DIGITS_PIXELS = 64
DIGITS_SAMPLES = 1797
DIGITS_MAX_PIXEL = 16
DIGITS_CLASSES = 10


@dataclass(frozen=True)
class Dataset:
    """A dataset in memory: its name, the sha256 of its canonical blob, and its tensors (read-only by use)."""

    name: str
    digest: bytes
    tensors: dict[str, torch.Tensor]

    @property
    def digest_hex(self) -> str:
        return self.digest.hex()

    def __len__(self) -> int:
        return int(next(iter(self.tensors.values())).shape[0])


def stdlib_corpus_bytes(stdlib_dir: Path | None = None) -> bytes:
    """The canonical blob of ``python-stdlib-3.11`` read from this interpreter's standard library."""
    directory = Path(stdlib_dir or sysconfig.get_paths()["stdlib"])
    parts: list[bytes] = []
    for name in sorted(STDLIB_FILES):
        path = directory / name
        try:
            parts.append(f"# file: {name}\n".encode() + path.read_bytes())
        except OSError as error:
            raise DatasetUnavailable(f"{STDLIB_DATASET}: cannot read {path}: {error}") from error
    return b"".join(parts)[:STDLIB_CORPUS_CAP]


def stdlib_tree_bytes(stdlib_dir: Path | None = None) -> bytes:
    """The canonical blob of ``python-stdlib-tree`` read from this interpreter's standard library."""
    directory = Path(stdlib_dir or sysconfig.get_paths()["stdlib"])
    try:
        paths = sorted(
            (path.relative_to(directory).as_posix(), path)
            for path in directory.rglob("*.py")
            if path.is_file() and not STDLIB_TREE_EXCLUDED & set(path.relative_to(directory).parts)
        )
        parts = [f"# file: {name}\n".encode() + path.read_bytes() for name, path in paths]
    except OSError as error:
        raise DatasetUnavailable(f"{STDLIB_TREE_DATASET}: cannot read {directory}: {error}") from error
    if not parts:
        raise DatasetUnavailable(f"{STDLIB_TREE_DATASET}: no Python sources under {directory}")
    return b"".join(parts)[:STDLIB_TREE_CAP]


def digits_blob() -> bytes:
    """The canonical blob of ``sklearn-digits`` from the installed scikit-learn's bundled CSV."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:
        raise DatasetUnavailable(f"{DIGITS_DATASET}: scikit-learn is not installed (pip install it)")
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
    try:
        text = gzip.decompress(path.read_bytes()).decode("ascii")
    except (OSError, UnicodeDecodeError) as error:
        raise DatasetUnavailable(f"{DIGITS_DATASET}: cannot read {path}: {error}") from error
    blob = bytearray()
    for line in text.splitlines():
        if line.strip():
            blob.extend(int(float(value)) for value in line.split(","))
    return bytes(blob)


def dataset_from_blob(name: str, blob: bytes) -> Dataset:
    """Build a named dataset from its canonical bytes (validated: wrong sizes or values are refused)."""
    import torch

    digest = hashlib.sha256(blob).digest()
    raw = torch.frombuffer(bytearray(blob), dtype=torch.uint8) if blob else torch.empty(0, dtype=torch.uint8)
    if name in (STDLIB_DATASET, STDLIB_TREE_DATASET):
        if len(blob) < 2:
            raise InvalidInput(f"{name}: corpus of {len(blob)} bytes is too short")
        return Dataset(name=name, digest=digest, tensors={"tokens": raw})  # bytes; batches widen them
    if name == DIGITS_DATASET:
        row = DIGITS_PIXELS + 1
        if len(blob) == 0 or len(blob) % row:
            raise InvalidInput(f"{name}: blob of {len(blob)} bytes is not whole {row}-byte samples")
        samples = raw.reshape(-1, row)
        pixels, labels = samples[:, :DIGITS_PIXELS], samples[:, DIGITS_PIXELS]
        if int(pixels.max()) > DIGITS_MAX_PIXEL or int(labels.max()) >= DIGITS_CLASSES:
            raise InvalidInput(f"{name}: pixel above {DIGITS_MAX_PIXEL} or label above {DIGITS_CLASSES - 1}")
        images = pixels.to(torch.float32) / float(DIGITS_MAX_PIXEL)
        return Dataset(name=name, digest=digest, tensors={"images": images, "labels": labels.to(torch.int64)})
    raise InvalidInput(f"unknown dataset {name!r}; known: {sorted(DATASET_BLOBS)}")


DATASET_BLOBS = {
    STDLIB_DATASET: stdlib_corpus_bytes,
    STDLIB_TREE_DATASET: stdlib_tree_bytes,
    DIGITS_DATASET: digits_blob,
}


def dataset_blob(name: str) -> bytes:
    """The canonical blob of a registered dataset, built from this machine's files."""
    try:
        builder = DATASET_BLOBS[name]
    except KeyError:
        raise InvalidInput(f"unknown dataset {name!r}; known: {sorted(DATASET_BLOBS)}") from None
    return builder()


@functools.cache
def _load_cached(name: str) -> Dataset:
    return dataset_from_blob(name, dataset_blob(name))


_FETCHED: dict[tuple[str, bytes], Dataset] = {}


def load_dataset(
    name: str, expected_digest: bytes | None = None, fetch: Callable[[bytes], bytes] | None = None
) -> Dataset:
    """A registered dataset (cached per process), refused unless its digest is `expected_digest`.

    Built from local files when they give that digest; otherwise, if `fetch` is given, from
    ``fetch(expected_digest)`` — the blob another party holds (e.g. a corpus from another Python version),
    checked against the digest before use. Without `fetch` a local mismatch raises DatasetMismatch.
    """
    if expected_digest is not None and (name, expected_digest) in _FETCHED:
        return _FETCHED[name, expected_digest]
    try:
        local = _load_cached(name)
    except DatasetUnavailable:
        if fetch is None or expected_digest is None:
            raise
        local_digest = "unavailable"
    else:
        if expected_digest is None or local.digest == expected_digest:
            return local
        local_digest = local.digest.hex()
    if fetch is None:
        raise DatasetMismatch(
            f"{name}: local content digest {local_digest} != expected {expected_digest.hex()}"
        )
    blob = fetch(expected_digest)
    if hashlib.sha256(blob).digest() != expected_digest:
        raise DatasetMismatch(f"{name}: fetched blob does not hash to {expected_digest.hex()}")
    dataset = _FETCHED[name, expected_digest] = dataset_from_blob(name, blob)
    return dataset
