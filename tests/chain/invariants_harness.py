"""A thin, fast driver of the real contracts on the in-process EVM for the invariant state machine.

Why not go through every layer of `veritrain.chain`: the state machine sends thousands of transactions
per run, so it talks to eth-tester directly (fixed gas, no estimate, unlocked tester accounts) and
reuses the client's pieces where they matter for correctness: the typed error classes (so a revert
is asserted as the same exception callers catch) and the EIP-712 typed data (so signatures match).
One deployment is snapshotted once and every Hypothesis example starts from `reset()`.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from eth_abi import decode as abi_decode
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_tester import EthereumTester, PyEVMBackend
from eth_tester.exceptions import TransactionFailed
from web3 import EthereumTesterProvider, Web3
from web3.contract import Contract

from veritrain.chain import eip712
from veritrain.chain.artifacts import load_contract
from veritrain.chain.errors import ContractReverted, UnknownRevert
from veritrain.chain.revert import RevertDecoder, revert_data

REPO_ROOT = Path(__file__).resolve().parents[2]
CONTRACT_NAMES = ("VeriToken", "StakeManager", "JobMarket")
TX_GAS = 3_000_000
# Every example starts at this instant. py-evm stamps a new block max(wall clock, parent + 1), so a chain
# whose clock trailed the wall clock would start each example at a different time, and a replay could
# take another path (CI once saw hypothesis report that as a flaky strategy). Far enough ahead that the
# wall clock never reaches it, and well inside the contracts' uint40/uint64 time fields.
CLOCK_ANCHOR = 3_000_000_000

Artifacts = Mapping[str, Mapping[str, Any]]


class HarnessError(AssertionError):
    """The harness itself could not do what a test needs (deploy failed, mutant does not compile)."""


@dataclass(frozen=True)
class MarketParams:
    """Small round numbers so the model's arithmetic is easy to read in a failing example."""

    unbonding_period: int = 500
    commit_window: int = 100
    reveal_window: int = 100
    verdict_window: int = 100
    min_verifiers: int = 2
    provider_collateral: int = 1_000
    slash_amount: int = 600
    bounty_bps: int = 2_500
    verifier_collateral: int = 500
    # No random draws: block hashes (the seed) change from run to run, and Hypothesis needs the same
    # steps to behave the same; units are drawn by requestVerification (and the model still checks
    # RevealTooEarly and the seed rule). The draw itself is tested in JobMarket.draw.test.js.
    spot_check_ppm: int = 0
    solo_spot_check_ppm: int = 0
    withhold_penalty: int = 400


def load_package_artifacts() -> dict[str, dict[str, Any]]:
    """ABI + bytecode as exported by scripts/export-abi.js into the Python package."""
    artifacts: dict[str, dict[str, Any]] = {}
    for name in CONTRACT_NAMES:
        data = load_contract(name)
        artifacts[name] = {"abi": list(data.abi), "bytecode": "0x" + data.bytecode.hex()}
    return artifacts


ORIGINAL = "--original"
_compiled: dict[str, dict[str, dict[str, Any]]] = {}


def compile_variants(
    mutant_ids: Sequence[str | None], processes: int = 1
) -> dict[str | None, dict[str, Any]]:
    """Compile the contracts unmutated (None) and with each seeded bug via scripts/compile-mutant.js.

    One node process compiles several variants (loading the wasm compiler is much of the cost);
    `processes` > 1 splits the list over that many processes. Results are cached for the session.
    """
    wanted = [ORIGINAL if mutant_id is None else mutant_id for mutant_id in mutant_ids]
    missing = [variant for variant in dict.fromkeys(wanted) if variant not in _compiled]
    groups = [missing[i::processes] for i in range(processes) if missing[i::processes]]
    with ThreadPoolExecutor(max_workers=max(1, len(groups))) as pool:
        for result in pool.map(_run_compiler, groups):
            _compiled.update(result)
    return {mutant_id: _compiled[variant] for mutant_id, variant in zip(mutant_ids, wanted, strict=True)}


def compile_variant(mutant_id: str | None) -> dict[str, Any]:
    return compile_variants([mutant_id])[mutant_id]


def _run_compiler(variants: list[str]) -> dict[str, dict[str, Any]]:
    completed = subprocess.run(
        ["node", str(REPO_ROOT / "scripts" / "compile-mutant.js"), *variants],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if completed.returncode != 0:
        raise HarnessError(f"compile-mutant {variants} failed:\n{completed.stderr}")
    result: dict[str, dict[str, Any]] = json.loads(completed.stdout)
    return result


@dataclass(frozen=True)
class TxOutcome:
    """What one transaction did: `error` if it reverted (then no receipt), else its `receipt`."""

    error: ContractReverted | None
    receipt: Mapping[str, Any] | None


def _abi_type(item: Mapping[str, Any]) -> str:
    kind = str(item["type"])
    if kind.startswith("tuple"):
        return f"({','.join(_abi_type(component) for component in item['components'])}){kind[5:]}"
    return kind


@dataclass(frozen=True)
class Actor:
    """A tester account: it sends transactions (unlocked in eth-tester) and signs EIP-712 messages."""

    label: str
    account: LocalAccount

    @property
    def address(self) -> str:
        return str(self.account.address)


class Chain:
    """eth-tester with the three contracts deployed once; `reset()` returns to the deployed state."""

    def __init__(self, artifacts: Artifacts, params: MarketParams, labels: Sequence[str]) -> None:
        self.params = params
        self.tester = EthereumTester(PyEVMBackend())
        self.w3 = Web3(EthereumTesterProvider(self.tester))
        keys = [key.to_bytes() for key in self.tester.backend.account_keys]
        if len(labels) + 1 > len(keys):
            raise HarnessError(f"eth-tester has {len(keys)} accounts, need {len(labels) + 1}")
        self.deployer = Actor("deployer", Account.from_key(keys[0]))
        self.actors = {
            label: Actor(label, Account.from_key(key)) for label, key in zip(labels, keys[1:], strict=False)
        }
        self.decoder = RevertDecoder([artifacts[name]["abi"] for name in CONTRACT_NAMES])
        self._view_cache: dict[tuple[str, str, tuple[Any, ...]], tuple[str, list[str]]] = {}
        self._snapshot: int | None = None
        self.storage_layouts: dict[str, Any] = {}
        self.token, self.stakes, self.market = self._deploy(artifacts)
        self.chain_id = int(self.w3.eth.chain_id)
        self.market_domain = eip712.market_domain(self.chain_id, self.market.address)
        self.stake_domain = eip712.stake_domain(self.chain_id, self.stakes.address)

    def _deploy(self, artifacts: Artifacts) -> tuple[Contract, Contract, Contract]:
        p = self.params
        operator = self.actors["operator"].address
        token = self._deploy_one(artifacts["VeriToken"], [])
        stakes = self._deploy_one(
            artifacts["StakeManager"], [token.address, p.unbonding_period, self.deployer.address]
        )
        market_params = (
            p.commit_window,
            p.reveal_window,
            p.verdict_window,
            p.min_verifiers,
            p.bounty_bps,
            p.provider_collateral,
            p.slash_amount,
            p.verifier_collateral,
            p.spot_check_ppm,
            p.solo_spot_check_ppm,
            p.withhold_penalty,
        )
        market = self._deploy_one(
            artifacts["JobMarket"], [token.address, stakes.address, operator, market_params]
        )
        role = self.view(stakes, "MARKET_ROLE")
        for holder in (
            market.address,
            self.deployer.address,
        ):  # the deployer slashes directly as a 2nd market
            outcome = self.transact(self.deployer, stakes, "grantRole", [role, holder])
            if outcome.error is not None:
                raise HarnessError(f"grantRole failed: {outcome.error}")
        return token, stakes, market

    def _deploy_one(self, artifact: Mapping[str, Any], args: list[Any]) -> Contract:
        factory = self.w3.eth.contract(abi=artifact["abi"], bytecode=artifact["bytecode"])
        tx_hash = factory.constructor(*args).transact({"from": self.deployer.address, "gas": 15_000_000})
        receipt = self.w3.eth.get_transaction_receipt(tx_hash)
        if receipt["status"] != 1:
            raise HarnessError(
                f"deploying failed with args {args} (runtime code over the EIP-170 24,576-byte limit?)"
            )
        return cast(Contract, self.w3.eth.contract(address=receipt["contractAddress"], abi=artifact["abi"]))

    # ---- snapshots and time ----

    def mark_initial_state(self) -> None:
        """Move the clock to CLOCK_ANCHOR and snapshot: each example then starts at the same instant."""
        if self.now() < CLOCK_ANCHOR:
            self.tester.time_travel(CLOCK_ANCHOR)
        self._snapshot = self.tester.take_snapshot()

    def reset(self) -> None:
        if self._snapshot is None:
            raise HarnessError("mark_initial_state() was never called")
        self.tester.revert_to_snapshot(self._snapshot)

    def now(self) -> int:
        """Timestamp the next transaction executes at (each mined transaction adds one second)."""
        return int(self.tester.get_block_by_number("pending")["timestamp"])

    def pending_block(self) -> int:
        """Number of the block the next transaction lands in."""
        return int(self.tester.get_block_by_number("pending")["number"])

    def block_hash(self, number: int) -> bytes:
        return bytes.fromhex(self.tester.get_block_by_number(number)["hash"].removeprefix("0x"))

    def advance(self, seconds: int) -> None:
        self.tester.time_travel(self.now() + seconds)

    # ---- transactions and views ----

    def transact(
        self, sender: Actor, contract: Contract, fn: str, args: Sequence[Any], *, expect_revert: bool = False
    ) -> TxOutcome:
        """Run `fn` from `sender`: the decoded typed error if it reverted, else its receipt.

        A revert the model predicts is checked with a call (nothing mined, so time does not move);
        otherwise the transaction is sent, and only if it failed is it replayed as a call to decode why.
        """
        data = contract.encode_abi(fn, list(args))
        tx = {"from": sender.address, "to": contract.address, "gas": TX_GAS, "data": data}
        if expect_revert:
            error = self._call_error(tx)
            if error is not None:
                return TxOutcome(error, None)
        tx_hash = self.tester.send_transaction(tx)
        receipt = self.tester.get_transaction_receipt(tx_hash)
        if receipt["status"] == 1:
            return TxOutcome(None, receipt)
        error = self._call_error(tx) or UnknownRevert(
            "UnknownRevert", {"note": "transaction failed, call did not"}
        )
        return TxOutcome(error, None)

    def _call_error(self, tx: Mapping[str, Any]) -> ContractReverted | None:
        try:
            self.tester.call(dict(tx), "pending")
        except TransactionFailed as exc:
            return self.decoder.decode(revert_data(exc))
        return None

    def view(self, contract: Contract, fn: str, *args: Any) -> Any:
        """A read-only call, encoded once per (function, arguments) and decoded with eth_abi (fast path)."""
        key = (contract.address, fn, args)
        encoded = self._view_cache.get(key)
        if encoded is None:
            outputs = contract.get_function_by_name(fn).abi["outputs"]
            encoded = (contract.encode_abi(fn, list(args)), [_abi_type(item) for item in outputs])
            self._view_cache[key] = encoded
        data, output_types = encoded
        raw = self.tester.call(
            {"from": self.deployer.address, "to": contract.address, "data": data}, "latest"
        )
        values = abi_decode(output_types, bytes.fromhex(raw[2:]) if isinstance(raw, str) else raw)
        return values[0] if len(values) == 1 else values

    def view_struct(self, contract: Contract, fn: str, *args: Any) -> dict[str, Any]:
        """A view returning one struct, as {member name: value} (names from the ABI)."""
        components = contract.get_function_by_name(fn).abi["outputs"][0]["components"]
        return dict(zip((c["name"] for c in components), self.view(contract, fn, *args), strict=True))

    # ---- EIP-712 (the client's encoder, so these signatures are the ones the contracts check) ----

    def sign_market(self, signer: Actor, primary: str, message: Mapping[str, Any]) -> bytes:
        return eip712.sign_typed(signer.account, self.market_domain, primary, message)

    def sign_stake(self, signer: Actor, primary: str, message: Mapping[str, Any]) -> bytes:
        return eip712.sign_typed(signer.account, self.stake_domain, primary, message)
