"""The compiled contracts shipped inside the package (veritrain/contracts_data/<Name>.json).

Why committed: Python users and CI need no Solidity compiler; a test recompiles with Hardhat and checks
that the committed bytecode and ABI are exactly what the sources give.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from veritrain.chain.errors import DeploymentError

CONTRACTS_DATA_DIR = Path(__file__).resolve().parent.parent / "contracts_data"
# contract name -> the source file (contracts/<file>.sol) that defines it
CONTRACT_SOURCES = {
    "VeriToken": "VeriToken",
    "StakeManager": "StakeManager",
    "JobMarket": "JobMarket",
    "JobMarketExtension": "JobMarket",
    "JobMarketRoundsExtension": "JobMarket",
    "AdminTimelock": "AdminTimelock",
    "VerdictAppeals": "VerdictAppeals",
}
CONTRACT_NAMES = tuple(CONTRACT_SOURCES)


@dataclass(frozen=True)
class ContractData:
    """ABI and creation bytecode of one contract."""

    name: str
    abi: tuple[dict[str, Any], ...]
    bytecode: bytes
    deployed_bytecode: bytes

    def errors(self) -> list[dict[str, Any]]:
        return [item for item in self.abi if item.get("type") == "error"]


def _hex_bytes(value: Any, what: str) -> bytes:
    if isinstance(value, dict):  # some exporters nest {"object": "0x.."}
        value = value.get("object", "")
    if not isinstance(value, str):
        raise DeploymentError(f"{what} is not a hex string")
    text = value[2:] if value.startswith("0x") else value
    try:
        return bytes.fromhex(text)
    except ValueError as err:
        raise DeploymentError(f"{what} is not valid hex (unlinked library?): {err}") from err


@functools.lru_cache(maxsize=16)
def load_contract(name: str, data_dir: Path = CONTRACTS_DATA_DIR) -> ContractData:
    """ABI + bytecode of `name` from the package data; DeploymentError if missing or malformed."""
    path = data_dir / f"{name}.json"
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise DeploymentError(
            f"{path} is missing: run `node scripts/export-abi.js` after compiling"
        ) from None
    except json.JSONDecodeError as err:
        raise DeploymentError(f"{path} is not JSON: {err}") from err
    if "abi" not in raw or "bytecode" not in raw:
        raise DeploymentError(f"{path} lacks 'abi' or 'bytecode'")
    return ContractData(
        name=name,
        abi=tuple(raw["abi"]),
        bytecode=_hex_bytes(raw["bytecode"], f"{name}.bytecode"),
        deployed_bytecode=_hex_bytes(raw.get("deployedBytecode", "0x"), f"{name}.deployedBytecode"),
    )


def load_all(data_dir: Path = CONTRACTS_DATA_DIR) -> dict[str, ContractData]:
    return {name: load_contract(name, data_dir) for name in CONTRACT_NAMES}
