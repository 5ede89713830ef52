"""The committed cache of compiled mutant variants (tests/chain/mutant_cache.py), on a small made-up repo:
an entry is used only while everything its key covers is unchanged, a damaged entry is a miss, and the
harness compiles exactly the variants the cache misses."""

from __future__ import annotations

import functools
import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.chain import invariants_harness, mutant_cache
from tests.chain.mutant_cache import ORIGINAL

NAMES = ("Token", "Market")
ORIGINAL_SOURCES = {
    "contracts/Token.sol": 'import {ERC20} from "@lib/token/ERC20.sol";\ncontract Token { uint x=1; }\n',
    "contracts/Market.sol": 'import "./Token.sol";\ncontract Market { uint fee = 5; }\n',
}
LIBRARY = {
    "node_modules/@lib/token/ERC20.sol": 'import "../utils/Math.sol";\ncontract ERC20 {}\n',
    "node_modules/@lib/utils/Math.sol": "library Math {}\n",
}
MUTANTS = [
    {"id": "fee-zero", "patches": [{"file": "Market.sol", "find": "fee = 5", "replace": "fee = 0"}]},
    {"id": "x-two", "patches": [{"file": "Token.sol", "find": "x=1", "replace": "x=2"}]},
]


def _contract(name: str, code: str) -> dict[str, Any]:
    return {
        "abi": [{"type": "function", "name": f"{name}Fn"}],
        "bytecode": f"0x{code}",
        "storageLayout": {"storage": [{"label": "x", "slot": "0"}]},
    }


COMPILED = {
    ORIGINAL: {"Token": _contract("Token", "aa"), "Market": _contract("Market", "bb")},
    "fee-zero": {"Token": _contract("Token", "aa"), "Market": _contract("Market", "b0")},
    "x-two": {"Token": _contract("Token", "a2"), "Market": _contract("Market", "b2")},
}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """Every file a key covers, in a layout like the real repo's."""
    files = {
        **ORIGINAL_SOURCES,
        **LIBRARY,
        "node_modules/solc/package.json": json.dumps({"version": "0.8.28"}),
        "node_modules/hardhat/package.json": json.dumps({"version": "2.29.1"}),
        "hardhat.config.js": "module.exports = { solidity: { version: '0.8.28' } };\n",
        "scripts/compile-mutant.js": "// compiles\n",
        "veritrain/contracts_data/Token.json": '{"bytecode": "aa"}',
        "veritrain/contracts_data/Market.json": '{"bytecode": "bb"}',
        "tests/chain/mutants/mutants.json": json.dumps({"mutants": MUTANTS}),
    }
    for relative, text in files.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    return tmp_path


def _mutants_file(repo: Path) -> Path:
    return repo / "tests" / "chain" / "mutants" / "mutants.json"


def _cache(repo: Path) -> Path:
    return repo / "tests" / "chain" / "mutants" / "compiled"


def _keys(repo: Path, variants: list[str] | None = None) -> dict[str, str | None]:
    return mutant_cache.variant_keys(variants or list(COMPILED), NAMES, repo, _mutants_file(repo))


def _write(repo: Path, compiled: dict[str, Any] = COMPILED) -> tuple[list[str], list[str]]:
    return mutant_cache.write(compiled, NAMES, _cache(repo), repo, _mutants_file(repo))


def _lookup(repo: Path, variants: list[str] | None = None) -> dict[str, Any]:
    return mutant_cache.lookup(variants or list(COMPILED), NAMES, _cache(repo), repo, _mutants_file(repo))


def _entry_path(repo: Path, variant: str) -> Path:
    return _cache(repo) / f"{_keys(repo)[variant]}{mutant_cache.SUFFIX}"


def test_written_variants_are_found_as_compiled(repo: Path) -> None:
    written, removed = _write(repo)
    assert len(written) == 3 and removed == []
    assert _lookup(repo) == COMPILED
    # a mutant's entry holds only what differs from the unmutated variant
    fee_zero = json.loads(gzip.decompress(_entry_path(repo, "fee-zero").read_bytes()))
    assert fee_zero["contracts"] == {"Market": {"bytecode": "0xb0"}}
    assert fee_zero["base"] == _keys(repo)[ORIGINAL]


def test_rewriting_unchanged_variants_gives_the_same_bytes(repo: Path) -> None:
    _write(repo)
    before = {path.name: path.read_bytes() for path in _cache(repo).iterdir()}
    _write(repo)
    assert {path.name: path.read_bytes() for path in _cache(repo).iterdir()} == before


def test_keys_differ_by_variant_and_cover_the_patched_sources(repo: Path) -> None:
    keys = _keys(repo)
    assert len(set(keys.values())) == 3 and None not in keys.values()
    assert _keys(repo) == keys  # deterministic


@pytest.mark.parametrize(
    "edited",
    [
        "contracts/Market.sol",  # a contract
        "node_modules/@lib/utils/Math.sol",  # a library file imported through another one
        "hardhat.config.js",  # compiler settings
        "scripts/compile-mutant.js",  # how the compile is run
        "node_modules/solc/package.json",  # compiler version
        "veritrain/contracts_data/Token.json",  # the shipped bytecode --reuse-shipped takes
    ],
)
def test_an_edit_of_what_a_key_covers_misses_every_variant(repo: Path, edited: str) -> None:
    _write(repo)
    path = repo / edited
    # even a blank line: the compile reads the text (of a package.json, the version alone counts)
    path.write_text(path.read_text().replace("0.8.28", "0.8.29") + "\n")
    assert _lookup(repo) == {}


def test_an_edited_mutant_misses_and_the_others_still_hit(repo: Path) -> None:
    _write(repo)
    edited = json.loads(json.dumps(MUTANTS))
    edited[0]["patches"][0]["replace"] = "fee = 1"
    _mutants_file(repo).write_text(json.dumps({"mutants": edited}))
    assert set(_lookup(repo)) == {ORIGINAL, "x-two"}


def test_a_mutant_whose_patch_does_not_apply_has_no_key(repo: Path) -> None:
    patches = [{"file": "Market.sol", "find": "fee", "replace": "cost"}]
    assert mutant_cache.apply_patches(ORIGINAL_SOURCES, patches) is not None
    twice = [{"file": "Market.sol", "find": "ee", "replace": "oo"}]
    assert mutant_cache.apply_patches({"contracts/Market.sol": "fee free"}, twice) is None
    missing = [{"file": "Market.sol", "find": "absent", "replace": ""}]
    assert mutant_cache.apply_patches(ORIGINAL_SOURCES, missing) is None
    unknown = [{"file": "Other.sol", "find": "x", "replace": "y"}]
    assert mutant_cache.apply_patches(ORIGINAL_SOURCES, unknown) is None
    _mutants_file(repo).write_text(json.dumps({"mutants": [{"id": "broken", "patches": missing}]}))
    assert _keys(repo, [ORIGINAL, "broken", "unknown-id"])["broken"] is None
    assert _keys(repo, [ORIGINAL, "unknown-id"])["unknown-id"] is None


def test_imported_files_follow_relative_and_library_imports(repo: Path) -> None:
    found = mutant_cache.imported_files(ORIGINAL_SOURCES, repo)
    assert set(found) == {"@lib/token/ERC20.sol", "@lib/utils/Math.sol"}
    assert None not in found.values()


def _gzip(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def _recorded_key_differs(blob: bytes) -> bytes:
    entry = json.loads(gzip.decompress(blob))
    entry["key"] = "0" * 64
    return _gzip(json.dumps(entry).encode())


def _contents_edited(blob: bytes) -> bytes:
    entry = json.loads(gzip.decompress(blob))
    entry["contracts"]["Market"]["bytecode"] = "0xdead"  # the digest no longer matches
    return _gzip(json.dumps(entry).encode())


def _base_dropped(blob: bytes) -> bytes:
    entry = json.loads(gzip.decompress(blob))
    del entry["base"]  # the digest covers the contracts alone, so it still matches
    return _gzip(json.dumps(entry).encode())


DAMAGE: dict[str, Callable[[bytes], bytes]] = {
    "not gzip": lambda blob: b"not gzip at all",
    "truncated gzip": lambda blob: blob[: len(blob) // 2],
    "gzip of bad JSON": lambda blob: _gzip(b'{"format": 2, "key": '),
    "gzip of bad UTF-8": lambda blob: _gzip(b"\xff\xfe{}"),
    "JSON not an object": lambda blob: _gzip(b"[1, 2]"),
    "recorded key differs": _recorded_key_differs,
    "contents edited": _contents_edited,
    "base dropped": _base_dropped,
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_mutant_entry_is_a_miss(repo: Path, damage: str) -> None:
    _write(repo)
    path = _entry_path(repo, "fee-zero")
    path.write_bytes(DAMAGE[damage](path.read_bytes()))
    assert set(_lookup(repo)) == {ORIGINAL, "x-two"}


@pytest.mark.parametrize("damage", ["truncated gzip", "contents edited"])
def test_a_damaged_unmutated_entry_misses_every_variant(repo: Path, damage: str) -> None:
    """Every mutant's entry is a difference from the unmutated one: without it none can be used."""
    _write(repo)
    path = _entry_path(repo, ORIGINAL)
    path.write_bytes(DAMAGE[damage](path.read_bytes()))
    assert _lookup(repo) == {}


def test_another_variants_entry_under_a_key_is_a_miss(repo: Path) -> None:
    _write(repo)
    _entry_path(repo, "fee-zero").write_bytes(_entry_path(repo, "x-two").read_bytes())
    assert set(_lookup(repo)) == {ORIGINAL, "x-two"}


def test_writing_removes_entries_no_variant_uses(repo: Path) -> None:
    _write(repo)
    stale = _keys(repo)["fee-zero"]
    edited = [MUTANTS[1]]  # fee-zero dropped
    _mutants_file(repo).write_text(json.dumps({"mutants": edited}))
    written, removed = _write(repo, {k: v for k, v in COMPILED.items() if k != "fee-zero"})
    assert removed == [f"{stale}{mutant_cache.SUFFIX}"] and len(written) == 2


def test_lookups_can_be_turned_off(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(repo)
    monkeypatch.setenv("VERITRAIN_MUTANT_CACHE", "0")
    assert _lookup(repo) == {}


def test_the_harness_compiles_only_what_the_cache_misses(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(repo, {k: v for k, v in COMPILED.items() if k != "x-two"})
    compiles: list[list[str]] = []

    def compiler(variants: list[str]) -> dict[str, Any]:
        compiles.append(variants)
        return {variant: COMPILED[variant] for variant in variants}

    lookup = functools.partial(
        mutant_cache.lookup, cache_dir=_cache(repo), root=repo, mutants_file=_mutants_file(repo)
    )
    monkeypatch.setattr(invariants_harness, "_compiled", {})
    monkeypatch.setattr(invariants_harness, "CONTRACT_NAMES", NAMES)
    monkeypatch.setattr(invariants_harness.mutant_cache, "lookup", lookup)
    monkeypatch.setattr(invariants_harness, "_run_compiler", compiler)
    with pytest.warns(UserWarning, match=r"compiling 1 variant\(s\) the committed cache lacks \(x-two\)"):
        found = invariants_harness.compile_variants([None, "fee-zero", "x-two"], processes=2)
    assert compiles == [["x-two"]]  # the hits spawned no compile
    assert found == {None: COMPILED[ORIGINAL], "fee-zero": COMPILED["fee-zero"], "x-two": COMPILED["x-two"]}
    invariants_harness.compile_variants([None, "fee-zero"], cached=False)
    assert compiles == [["x-two"]]  # kept for the session either way


def test_committed_entries_of_the_current_sources_decode() -> None:
    """A committed entry filed under a key of the current sources is whole (a damaged one would be a silent
    miss). Entries of other keys (a contract changed since the last refresh) may be there, unused."""
    mutant_ids = [mutant["id"] for mutant in json.loads(mutant_cache.MUTANTS_FILE.read_text())["mutants"]]
    keys = mutant_cache.variant_keys([ORIGINAL, *mutant_ids], invariants_harness.CONTRACT_NAMES)
    for variant, key in keys.items():
        path = mutant_cache.CACHE_DIR / f"{key}{mutant_cache.SUFFIX}"
        if path.exists():
            assert mutant_cache.decode_entry(path.read_bytes(), str(key)) is not None, (variant, path)
