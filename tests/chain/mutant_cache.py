"""A content-addressed cache, committed to the repo, of what scripts/compile-mutant.js prints for each
variant of the seeded-mutant check (the unmutated contracts and each mutant of tests/chain/mutants).

Each variant's entry is tests/chain/mutants/compiled/<key>.json.gz, where <key> is a sha256 over everything
the compile reads or is told (`variant_keys`): the format version below; the solc version of node_modules
and Hardhat's (whose config loader resolves the settings); the text of hardhat.config.js (every compiler
setting: optimizer, runs, viaIR, evmVersion; metadata and remappings are not set there, so they are solc's
defaults, fixed by its version) and of scripts/compile-mutant.js (what it passes to solc, the output
selection, which contracts a patch reaches); the names of the contracts compiled; the shipped
veritrain/contracts_data JSON of those contracts (`--reuse-shipped` takes the unpatched bytecode from it);
every contracts/*.sol unpatched and after the variant's patches (path and content), and every library
file they import (node_modules/@openzeppelin/..., path and content). A contract or mutant edited since the
entry was written gives another key, so the entry is not found and the variant is compiled as before.

An entry records its key and a digest of its contracts; one that does not decompress or parse, or whose
recorded key or digest is not what it should be, is a miss, never trusted. A mutant's entry holds only
what differs from the unmutated variant's (usually one contract's bytecode), which keeps the whole cache
small; it names the unmutated entry it was made against, and is used only together with that entry.

`scripts/refresh-mutant-cache` compiles every variant and rewrites the cache (tests/chain/
refresh_mutant_cache.py); run it after changing a contract, a mutant or the compiler settings. Without it
the check still passes, only compiling again what misses. VERITRAIN_MUTANT_CACHE=0 turns lookups off.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import posixpath
import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = REPO_ROOT / "tests" / "chain" / "mutants" / "compiled"
MUTANTS_FILE = REPO_ROOT / "tests" / "chain" / "mutants" / "mutants.json"
ORIGINAL = "--original"  # compile-mutant.js's name for the unmutated variant
# Bump when the entry layout or the key's inputs change: every older entry then misses.
FORMAT = 2
SUFFIX = ".json.gz"
FIELDS = ("abi", "bytecode", "storageLayout")  # what the harness reads of each compiled contract
# An import directive's path: `import "x";`, `import {A} from "x";`, `import * as X from "x";`
IMPORT = re.compile(r'^\s*import\s[^;"]*"([^"]+)"', re.MULTILINE)

Contracts = dict[str, dict[str, Any]]  # contract name -> {"abi", "bytecode", "storageLayout"}


def enabled() -> bool:
    return os.environ.get("VERITRAIN_MUTANT_CACHE", "1") != "0"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def read_sources(root: Path) -> dict[str, str]:
    """contracts/*.sol by unit name, as compile-mutant.js reads them (every top-level source)."""
    return {
        f"contracts/{path.name}": path.read_text(encoding="utf-8")
        for path in sorted((root / "contracts").glob("*.sol"))
    }


def apply_patches(sources: Mapping[str, str], patches: Sequence[Mapping[str, str]]) -> dict[str, str] | None:
    """`sources` with `patches` applied as compile-mutant.js applies them, or None where it would refuse
    (a file it does not know, a `find` absent or occurring more than once): then there is no key, and the
    compile reports the error."""
    patched = dict(sources)
    for patch in patches:
        unit = f"contracts/{patch['file']}"
        text = patched.get(unit)
        if text is None:
            return None
        first = text.find(patch["find"])
        if first < 0 or text.find(patch["find"], first + 1) >= 0:
            return None
        patched[unit] = text[:first] + patch["replace"] + text[first + len(patch["find"]) :]
    return patched


def _read_import(root: Path, unit: str) -> str | None:
    """Where compile-mutant.js's findImport looks: node_modules, then the repo root."""
    for candidate in (root / "node_modules" / unit, root / unit):
        if candidate.is_file():
            return candidate.read_text(encoding="utf-8")
    return None


def imported_files(sources: Mapping[str, str], root: Path) -> dict[str, str | None]:
    """sha256 of every file that `sources` import, transitively, outside `sources` (None: not found)."""
    found: dict[str, str | None] = {}
    pending = list(sources.items())
    while pending:
        unit, text = pending.pop()
        for imported in IMPORT.findall(text):
            target = (
                posixpath.normpath(posixpath.join(posixpath.dirname(unit), imported))
                if imported.startswith(".")
                else imported
            )
            if target in sources or target in found:
                continue
            content = _read_import(root, target)
            found[target] = None if content is None else _digest(content.encode())
            if content is not None:
                pending.append((target, content))
    return found


def _toolchain(root: Path, names: Sequence[str]) -> dict[str, Any]:
    """What every variant's compile shares besides the sources."""

    def version(package: str) -> str:
        return str(json.loads((root / "node_modules" / package / "package.json").read_text())["version"])

    def file_digest(relative: str) -> str:
        return _digest((root / relative).read_bytes())

    return {
        "format": FORMAT,
        "solc": version("solc"),
        "hardhat": version("hardhat"),
        "settings": file_digest("hardhat.config.js"),
        "compiler script": file_digest("scripts/compile-mutant.js"),
        "contracts": list(names),
        "shipped": {name: file_digest(f"veritrain/contracts_data/{name}.json") for name in names},
    }


def variant_keys(
    variants: Iterable[str], names: Sequence[str], root: Path = REPO_ROOT, mutants_file: Path = MUTANTS_FILE
) -> dict[str, str | None]:
    """The cache key of each variant (ORIGINAL or a mutant id) as the files under `root` are now; None for a
    mutant that `mutants_file` lacks or whose patches would not apply (it cannot be cached)."""
    sources = read_sources(root)
    mutants = {mutant["id"]: mutant for mutant in json.loads(mutants_file.read_text())["mutants"]}
    common = {
        **_toolchain(root, names),
        "sources": {unit: _digest(text.encode()) for unit, text in sources.items()},
        "imports": imported_files(sources, root),  # the unpatched compile's (a mutant's untouched contracts)
    }
    libraries: dict[str, dict[str, str | None]] = {}  # by the digest of the patched sources
    keys: dict[str, str | None] = {}
    for variant in variants:
        patches = [] if variant == ORIGINAL else mutants.get(variant, {}).get("patches")
        patched = None if patches is None else apply_patches(sources, patches)
        if patched is None:
            keys[variant] = None
            continue
        patched_digests = {unit: _digest(text.encode()) for unit, text in patched.items()}
        tree = _digest(_canonical(patched_digests))
        if tree not in libraries:
            libraries[tree] = imported_files(patched, root)
        description = {
            **common,
            "variant": variant,
            "patches": patches,
            "patched": patched_digests,
            "patched imports": libraries[tree],
        }
        keys[variant] = _digest(_canonical(description))
    return keys


def delta(original: Contracts, variant: Contracts) -> Contracts:
    """The fields of `variant` that differ from `original`'s, by contract (contracts with none left out)."""
    changed = {
        name: {field: value for field, value in fields.items() if original.get(name, {}).get(field) != value}
        for name, fields in variant.items()
    }
    return {name: fields for name, fields in changed.items() if fields}


def encode_entry(key: str, variant: str, contracts: Contracts, base: str | None) -> bytes:
    """An entry's bytes: gzip (no timestamp, so an unchanged entry rewrites to the same bytes) of its JSON."""
    entry = {
        "format": FORMAT,
        "key": key,
        "variant": variant,
        "base": base,
        "digest": _digest(_canonical(contracts)),
        "contracts": contracts,
    }
    return gzip.compress(_canonical(entry), compresslevel=9, mtime=0)


def decode_entry(blob: bytes, key: str) -> dict[str, Any] | None:
    """The entry in `blob` if it is whole and is the entry of `key`; None otherwise (a miss)."""
    try:
        entry = json.loads(gzip.decompress(blob))
    except (OSError, EOFError, zlib.error, ValueError):  # bad gzip, truncated, bad JSON or UTF-8
        return None
    if not isinstance(entry, dict) or entry.get("format") != FORMAT or entry.get("key") != key:
        return None
    contracts = entry.get("contracts")
    if not isinstance(contracts, dict) or entry.get("digest") != _digest(_canonical(contracts)):
        return None
    return entry


def _complete(contracts: Any, names: Sequence[str]) -> bool:
    return isinstance(contracts, dict) and all(
        isinstance(contracts.get(name), dict) and all(field in contracts[name] for field in FIELDS)
        for name in names
    )


def _read(cache_dir: Path, key: str | None) -> dict[str, Any] | None:
    if key is None:
        return None
    try:
        blob = (cache_dir / f"{key}{SUFFIX}").read_bytes()
    except OSError:
        return None
    return decode_entry(blob, key)


def lookup(
    variants: Iterable[str],
    names: Sequence[str],
    cache_dir: Path = CACHE_DIR,
    root: Path = REPO_ROOT,
    mutants_file: Path = MUTANTS_FILE,
) -> dict[str, Contracts]:
    """The variants among `variants` that the cache holds for the current sources, as compile-mutant.js
    would print them ({contract name: {"abi", "bytecode", "storageLayout"}}); the others are left out."""
    wanted = list(dict.fromkeys(variants))
    if not wanted or not enabled():
        return {}
    try:
        keys = variant_keys([ORIGINAL, *wanted], names, root, mutants_file)
    except (OSError, ValueError, KeyError, TypeError):  # no node_modules, a malformed mutants file: compile
        return {}
    original_entry = _read(cache_dir, keys[ORIGINAL])
    if original_entry is None or original_entry.get("base") is not None:
        return {}
    original: Contracts = original_entry["contracts"]
    if not _complete(original, names):
        return {}
    found: dict[str, Contracts] = {}
    for variant in wanted:
        if variant == ORIGINAL:
            found[variant] = {name: dict(original[name]) for name in names}
            continue
        entry = _read(cache_dir, keys[variant])
        if entry is None or entry.get("base") != keys[ORIGINAL]:
            continue
        changes = entry["contracts"]
        if not all(isinstance(fields, dict) for fields in changes.values()):
            continue
        contracts = {name: {**original[name], **changes.get(name, {})} for name in names}
        if set(changes) <= set(names) and _complete(contracts, names):
            found[variant] = contracts
    return found


def write(
    compiled: Mapping[str, Contracts],
    names: Sequence[str],
    cache_dir: Path = CACHE_DIR,
    root: Path = REPO_ROOT,
    mutants_file: Path = MUTANTS_FILE,
    keys: Mapping[str, str | None] | None = None,
) -> tuple[list[str], list[str]]:
    """Write an entry for every variant of `compiled` (ORIGINAL among them) and remove every entry no
    variant of `compiled` uses. `keys`: as variant_keys gave them when the compile began (the default: as
    they are now). Returns the file names written and removed."""
    if keys is None:
        keys = variant_keys(list(compiled), names, root, mutants_file)
    original_key = keys[ORIGINAL]
    if original_key is None:
        raise ValueError("no key for the unmutated contracts")
    cache_dir.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    for variant, contracts in compiled.items():
        key = keys[variant]
        if key is None:
            raise ValueError(f"mutant {variant}: its patches do not apply, so it has no key")
        if variant == ORIGINAL:
            blob = encode_entry(key, variant, {name: contracts[name] for name in names}, None)
        else:
            blob = encode_entry(key, variant, delta(compiled[ORIGINAL], contracts), original_key)
        path = cache_dir / f"{key}{SUFFIX}"
        path.write_bytes(blob)
        written.append(path.name)
    used = set(written)
    removed = []
    for path in sorted(cache_dir.glob(f"*{SUFFIX}")):
        if path.name not in used:
            path.unlink()
            removed.append(path.name)
    return written, removed
