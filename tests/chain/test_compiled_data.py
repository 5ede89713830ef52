"""The ABI + bytecode committed in veritrain/contracts_data are exactly what a fresh Hardhat compile gives."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from veritrain.chain.artifacts import CONTRACT_SOURCES, load_contract
from veritrain.chain.backends import find_repo_root

pytestmark = pytest.mark.chain


def test_fresh_hardhat_compile_matches_committed_contract_data(tmp_path: Path) -> None:
    root = find_repo_root()
    # A throw-away config reusing the project's config (compiler recipe, settings) but writing artifacts
    # and cache into tmp_path, so this test never touches the shared artifacts/ folder.
    config = tmp_path / "hardhat.config.js"
    config.write_text(
        f"const base = require({json.dumps(str(root / 'hardhat.config.js'))});\n"
        "module.exports = { ...base, paths: { ...base.paths,"
        f" root: {json.dumps(str(root))},"
        f" artifacts: {json.dumps(str(tmp_path / 'artifacts'))},"
        f" cache: {json.dumps(str(tmp_path / 'cache'))} }} }};\n"
    )
    env = dict(os.environ, HARDHAT_DISABLE_TELEMETRY_PROMPT="true")
    result = subprocess.run(
        [str(root / "node_modules" / ".bin" / "hardhat"), "--config", str(config), "compile", "--quiet"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for name, source in CONTRACT_SOURCES.items():
        fresh = json.loads(
            (tmp_path / "artifacts" / "contracts" / f"{source}.sol" / f"{name}.json").read_text()
        )
        committed = load_contract(name)
        assert list(committed.abi) == fresh["abi"], f"{name}: ABI differs from the sources"
        assert committed.bytecode == bytes.fromhex(fresh["bytecode"][2:]), (
            f"{name}: creation bytecode differs"
        )
        if committed.deployed_bytecode:
            assert committed.deployed_bytecode == bytes.fromhex(fresh["deployedBytecode"][2:]), name
