"""A thin, fast driver of the real contracts on a `hardhat node` (EDR) for the invariant state machine.

Why a node and not the in-process EVM: py-evm is pure Python and cost ~0.15 s per transaction, which put
the soak's 256 × 500 examples at ~4 CPU-hours; EDR (Rust) runs one in well under a millisecond, so the
JSON-RPC round trips are the cost, and this driver keeps them few: raw JSON-RPC over one kept-alive
connection (no web3 middleware), fixed gas (no estimate), the dev accounts the node unlocks, the clock
kept here and handed to the node (`evm_setNextBlockTimestamp`) so every example sees the same
timestamps, and storage read in batches (`storage_words`). It reuses the client's pieces where they
matter for correctness: the typed error classes (so a revert is asserted as the same exception callers
catch) and the EIP-712 typed data (so signatures match). One node per process; each `Chain` starts from
the node's pristine state, deploys once, and every Hypothesis example starts from `reset()`.
"""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

from eth_abi import decode as abi_decode
from eth_abi import encode as abi_encode
from eth_account.signers.local import LocalAccount
from eth_utils import keccak
from web3 import Web3
from web3.contract import Contract

from tests.chain import mutant_cache
from tests.chain.mutant_cache import ORIGINAL
from veritrain.chain import eip712
from veritrain.chain.artifacts import load_contract
from veritrain.chain.backends import HardhatNode, dev_accounts
from veritrain.chain.errors import ContractReverted, UnknownRevert
from veritrain.chain.revert import RevertDecoder, abi_signature, canonical_type

REPO_ROOT = Path(__file__).resolve().parents[2]
# What every variant deploys, compile-mutant.js compiles and the mutant cache holds: a mutant of any of
# them runs in place of the original (VerdictAppeals alone settles JobMarket's held fraud: settleHeld).
APPEALS_NAME = "VerdictAppeals"
CONTRACT_NAMES = (
    "VeriToken",
    "StakeManager",
    "JobMarket",
    "JobMarketExtension",
    "JobMarketRoundsExtension",
    APPEALS_NAME,
)
TX_GAS = 3_000_000
# Every example starts at this instant, and every block's timestamp is set by the harness, never taken
# from the wall clock: an example that started at another time could take another path on replay (CI once
# saw hypothesis report that as a flaky strategy on py-evm, which stamped blocks by the wall clock). Ahead
# of the node's genesis (the wall clock) and well inside the contracts' uint40/uint64 time fields.
CLOCK_ANCHOR = 3_000_000_000

Artifacts = Mapping[str, Mapping[str, Any]]


class HarnessError(AssertionError):
    """The harness itself could not do what a test needs (deploy failed, mutant does not compile)."""


@dataclass(frozen=True)
class MarketParams:
    """Small round numbers so the model's arithmetic is easy to read in a failing example."""

    unbonding_period: int = 700  # above the 5 windows' 600 (VerdictAppeals checks)
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
    # off: every provider starts new, and the scenarios need the fast path; probation is tested in
    # JobMarket.draw.test.js
    probation_streak: int = 0


@dataclass(frozen=True)
class AppealParams:
    """VerdictAppeals' parameters: the market's commit, reveal and verdict windows + appeal + vote windows
    stay below the unbonding period (its constructor checks). A panel of one, drawn from a pool whose only
    member is a referee that is never a unit's party, so the draw does not depend on block hashes (which
    change from run to run); PANEL_OF_THREE's pool has exactly three such referees, so the hash decides only
    their seats."""

    appeal_window: int = 100
    vote_window: int = 200
    panel_size: int = 1
    bounty_bps: int = 2_000
    appeal_bond: int = 300
    referee_stake: int = 500
    verifier_slash: int = 200


# A panel of three referees, drawn from a pool of exactly three (tests/chain/invariants_machine.py): a
# majority of two decides over a dissenting minority.
PANEL_OF_THREE = AppealParams(panel_size=3)


def load_package_artifacts() -> dict[str, dict[str, Any]]:
    """ABI + bytecode as exported by scripts/export-abi.js into the Python package."""
    artifacts: dict[str, dict[str, Any]] = {}
    for name in CONTRACT_NAMES:
        data = load_contract(name)
        artifacts[name] = {"abi": list(data.abi), "bytecode": "0x" + data.bytecode.hex()}
    return artifacts


_compiled: dict[str, dict[str, dict[str, Any]]] = {}


def compile_variants(
    mutant_ids: Sequence[str | None], processes: int = 1, cached: bool = True
) -> dict[str | None, dict[str, Any]]:
    """Compile the contracts unmutated (None) and with each seeded bug via scripts/compile-mutant.js.

    A variant the committed cache holds for the current sources (tests/chain/mutant_cache.py) is read
    from it, not compiled; `cached` False compiles every variant (what the refresh does). One node
    process compiles several variants (loading the wasm compiler is much of the cost);
    `processes` > 1 splits the list over that many processes. Results are kept for the session.
    With --reuse-shipped: what no patch touches (all of None) is the shipped bytecode of
    veritrain/contracts_data (test_compiled_data checks it is what the sources compile to) with ABI and
    storage layout compiled from the sources, so only patched contracts pay for code generation (None:
    2 s instead of 30 s of CPU).
    """
    wanted = [ORIGINAL if mutant_id is None else mutant_id for mutant_id in mutant_ids]
    missing = [variant for variant in dict.fromkeys(wanted) if variant not in _compiled]
    if cached:
        _compiled.update(mutant_cache.lookup(missing, CONTRACT_NAMES))
        missing = [variant for variant in missing if variant not in _compiled]
        if missing and mutant_cache.enabled():
            warnings.warn(
                f"compiling {len(missing)} variant(s) the committed cache lacks ({', '.join(missing)}): "
                "scripts/refresh-mutant-cache after a contract or mutant change saves that",
                stacklevel=2,
            )
    groups = [missing[i::processes] for i in range(processes) if missing[i::processes]]
    with ThreadPoolExecutor(max_workers=max(1, len(groups))) as pool:
        for result in pool.map(_run_compiler, groups):
            _compiled.update(result)
    return {mutant_id: _compiled[variant] for mutant_id, variant in zip(mutant_ids, wanted, strict=True)}


def compile_variant(mutant_id: str | None) -> dict[str, Any]:
    return compile_variants([mutant_id])[mutant_id]


# A hung compiler fails the run instead of holding it; the allowance grows with the variants one process
# compiles (a JobMarket.sol variant takes 20-60 s of CPU, more on a shared machine: a flat 600 s for 12
# variants ran out under load).
COMPILE_TIMEOUT_S, COMPILE_TIMEOUT_PER_VARIANT_S = 300, 150


def _run_compiler(variants: list[str]) -> dict[str, dict[str, Any]]:
    completed = subprocess.run(
        ["node", str(REPO_ROOT / "scripts" / "compile-mutant.js"), "--reuse-shipped", *variants],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=COMPILE_TIMEOUT_S + COMPILE_TIMEOUT_PER_VARIANT_S * len(variants),
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


@dataclass(frozen=True)
class Actor:
    """A dev account: it sends transactions (the node unlocks it) and signs EIP-712 messages."""

    label: str
    account: LocalAccount

    @property
    def address(self) -> str:
        return str(self.account.address)


class NodeRpc:
    """JSON-RPC to one node over one kept-alive HTTP connection (http.client: requests' per-call overhead
    was a third of a step). `batch` sends several requests in one HTTP round trip; hardhat may run them
    concurrently, so only requests whose order does not matter."""

    # Node's HTTP server closes a connection idle for 5 s; one idle for this long is opened afresh rather
    # than risking a request on a connection the server is closing (a compile between tests idles it).
    IDLE_RECONNECT_S = 2.0

    def __init__(self, url: str) -> None:
        parsed = urlsplit(url)
        self.url = url
        self._connection = http.client.HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port, timeout=60)
        self._last_used = float("-inf")
        self._next_id = 0

    def _post(self, body: Any) -> Any:
        payload = json.dumps(body).encode()
        try:
            if time.monotonic() - self._last_used >= self.IDLE_RECONNECT_S:
                self._connection.close()
                self._connection.connect()
                self._connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._connection.request("POST", "/", payload, {"Content-Type": "application/json"})
            answer = json.loads(self._connection.getresponse().read())
        except (OSError, http.client.HTTPException) as err:
            raise HarnessError(f"{self.url}: no answer from the node: {err}") from err
        self._last_used = time.monotonic()
        return answer

    def request(self, method: str, *params: Any) -> dict[str, Any]:
        """The raw response: {"result": ...} or {"error": ...} (a revert is an error the caller reads)."""
        self._next_id += 1
        response: dict[str, Any] = self._post(
            {"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": list(params)}
        )
        return response

    def call(self, method: str, *params: Any) -> Any:
        return _result(method, self.request(method, *params))

    def batch(self, calls: Sequence[tuple[str, Sequence[Any]]]) -> list[Any]:
        """Results of `calls`, in order; any error raises."""
        first = self._next_id + 1
        self._next_id += len(calls)
        body = [
            {"jsonrpc": "2.0", "id": first + i, "method": method, "params": list(params)}
            for i, (method, params) in enumerate(calls)
        ]
        by_id = {response.get("id"): response for response in self._post(body)}
        return [_result(method, by_id.get(first + i, {})) for i, (method, _) in enumerate(calls)]


def _result(method: str, response: Mapping[str, Any]) -> Any:
    if "result" not in response:
        raise HarnessError(f"{method} failed: {response.get('error', response)}")
    return response["result"]


def _revert_bytes(error: Mapping[str, Any]) -> bytes | None:
    """The revert data in a hardhat JSON-RPC error: {"data": {"data": "0x..", "txHash": ..}} or
    {"data": "0x.."}; None when it carries none (then the decoder says UnknownRevert)."""
    data = error.get("data")
    if isinstance(data, Mapping):
        data = data.get("data")
    return bytes.fromhex(data[2:]) if isinstance(data, str) and data.startswith("0x") else None


class _Node:
    """This process's `hardhat node` (started on first use, stopped at interpreter exit) and a snapshot of
    its pristine state, so every `Chain` deploys on an empty chain at the same addresses."""

    rpc: NodeRpc | None = None
    pristine: str = ""
    process: HardhatNode | None = None

    @classmethod
    def fresh(cls) -> NodeRpc:
        if cls.rpc is None:
            cls.process = HardhatNode(root=REPO_ROOT).start()
            cls.rpc = NodeRpc(cls.process.url)
            cls.rpc.call("hardhat_setLoggingEnabled", False)  # the node logs every request otherwise
        elif cls.rpc.call("evm_revert", cls.pristine) is not True:
            raise HarnessError(f"evm_revert to the node's pristine snapshot {cls.pristine} refused")
        cls.pristine = cls.rpc.call("evm_snapshot")  # a revert uses its snapshot up
        return cls.rpc


# Reads the storage words whose slots are the calldata (32 bytes each) and returns them in that order.
# `eth_call` runs it with a state override that swaps it in for a contract's code (its storage stays), so
# one call reads any number of a contract's slots. Disassembly:
#   00 PUSH0                   i = 0
#   01 JUMPDEST                loop:
#   02 CALLDATASIZE, DUP2, LT  i < calldatasize ?
#   05 PUSH1 0x0b, JUMPI       -> body
#   08 CALLDATASIZE, PUSH0, RETURN    return memory[0 : calldatasize]
#   0b JUMPDEST                body:
#   0c DUP1, CALLDATALOAD, SLOAD      sload(calldata[i : i + 32])
#   0f DUP2, MSTORE            memory[i] = that
#   11 PUSH1 0x20, ADD         i += 32
#   14 PUSH1 0x01, JUMP        -> loop
STORAGE_READER_CODE = "0x5f5b368110600b57365ff35b8035548152602001600156"


class Chain:
    """A hardhat node with the four contracts deployed once; `reset()` returns to the deployed state."""

    def __init__(
        self,
        artifacts: Artifacts,
        params: MarketParams,
        labels: Sequence[str],
        appeal_params: AppealParams | None = None,
    ) -> None:
        self.params = params
        self.appeal_params = appeal_params or AppealParams()
        self.rpc = _Node.fresh()
        self.w3 = Web3()  # offline: ABI encoding only, every request goes through `rpc`
        keys = dev_accounts()
        if len(labels) + 1 > len(keys):
            raise HarnessError(f"the node unlocks {len(keys)} accounts, need {len(labels) + 1}")
        self.deployer = Actor("deployer", keys[0])
        self.actors = {label: Actor(label, key) for label, key in zip(labels, keys[1:], strict=False)}
        self.decoder = RevertDecoder([artifacts[name]["abi"] for name in CONTRACT_NAMES])
        # (contract address, function) -> (selector, input types, output types): web3's encode_abi looks
        # the function up in the ABI on every call, which cost more than the node's work.
        self._functions: dict[tuple[str, str], tuple[bytes, list[str], list[str]]] = {}
        self.head = 0  # moves with every change of the chain's state (a mined block, a reset)
        self._snapshot: tuple[str, int, int] | None = None
        # The timestamp and number of the block the next transaction lands in: the node mines one block
        # per transaction, and every block's timestamp comes from here (deployment starts before the anchor).
        self._clock = CLOCK_ANCHOR - 10_000
        self._pending_block = int(self.rpc.call("eth_blockNumber"), 16) + 1
        self.rpc.call("evm_setNextBlockTimestamp", self._clock)
        self.storage_layouts: dict[str, Any] = {}
        self.token, self.stakes, self.market, self.appeals = self._deploy(artifacts)
        self.chain_id = int(self.rpc.call("eth_chainId"), 16)
        self.market_domain = eip712.market_domain(self.chain_id, self.market.address)
        self.stake_domain = eip712.stake_domain(self.chain_id, self.stakes.address)
        self.appeals_domain = eip712.appeals_domain(self.chain_id, self.appeals.address)

    def _deploy(self, artifacts: Artifacts) -> tuple[Contract, Contract, Contract, Contract]:
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
            p.probation_streak,
        )
        extension = self._deploy_one(
            artifacts["JobMarketExtension"], [token.address, stakes.address, market_params]
        )
        rounds_extension = self._deploy_one(
            artifacts["JobMarketRoundsExtension"], [token.address, stakes.address, market_params]
        )
        market = self._deploy_one(
            artifacts["JobMarket"],
            [
                token.address,
                stakes.address,
                operator,
                market_params,
                extension.address,
                rounds_extension.address,
            ],
        )
        a = self.appeal_params
        appeal_params = (
            a.appeal_window,
            a.vote_window,
            a.panel_size,
            a.bounty_bps,
            a.appeal_bond,
            a.referee_stake,
            a.verifier_slash,
        )
        appeals = self._deploy_one(artifacts[APPEALS_NAME], [market.address, appeal_params])
        role = self.view(stakes, "MARKET_ROLE")
        grants = [
            (stakes, role, market.address),
            (stakes, role, self.deployer.address),  # the deployer slashes directly as a 2nd market
            (stakes, role, appeals.address),  # locks bonds and referee stakes, slashes
            (market, self.view(market, "APPEALS_ROLE"), appeals.address),  # alone settles held fraud
        ]
        for contract, granted, holder in grants:
            outcome = self.transact(self.deployer, contract, "grantRole", [granted, holder])
            if outcome.error is not None:
                raise HarnessError(f"grantRole failed: {outcome.error}")
        return token, stakes, market, appeals

    def _deploy_one(self, artifact: Mapping[str, Any], args: list[Any]) -> Contract:
        inputs = next((item["inputs"] for item in artifact["abi"] if item["type"] == "constructor"), [])
        encoded = abi_encode([canonical_type(item) for item in inputs], args).hex()
        tx = {"from": self.deployer.address, "gas": hex(15_000_000), "data": artifact["bytecode"] + encoded}
        outcome = self._send(tx)
        if outcome.receipt is None:
            raise HarnessError(
                f"deploying failed with args {args} (runtime code over the EIP-170 24,576-byte limit?): "
                f"{outcome.error}"
            )
        address = Web3.to_checksum_address(outcome.receipt["contractAddress"])
        return cast(Contract, self.w3.eth.contract(address=address, abi=artifact["abi"]))

    # ---- snapshots and time ----

    def mark_initial_state(self) -> None:
        """Move the clock to CLOCK_ANCHOR and snapshot: each example then starts at the same instant."""
        self._clock = max(self._clock, CLOCK_ANCHOR)
        self.rpc.call("evm_setNextBlockTimestamp", self._clock)
        self._snapshot = (self.rpc.call("evm_snapshot"), self._clock, self._pending_block)

    def reset(self) -> None:
        if self._snapshot is None:
            raise HarnessError("mark_initial_state() was never called")
        snapshot, self._clock, self._pending_block = self._snapshot
        if self.rpc.call("evm_revert", snapshot) is not True:
            raise HarnessError(
                f"evm_revert({snapshot}) refused: a later Chain on this process's node reverted past it"
            )
        self._snapshot = (self.rpc.call("evm_snapshot"), self._clock, self._pending_block)
        self.rpc.call("evm_setNextBlockTimestamp", self._clock)
        self.head += 1

    def now(self) -> int:
        """Timestamp the next transaction executes at (each mined transaction adds one second)."""
        return self._clock

    def pending_block(self) -> int:
        """Number of the block the next transaction lands in."""
        return self._pending_block

    def block_hash(self, number: int) -> bytes:
        block = self.rpc.call("eth_getBlockByNumber", hex(number), False)
        return bytes.fromhex(block["hash"][2:])

    def advance(self, seconds: int) -> None:
        """Move the clock `seconds` ahead, mining one empty block just before that instant (so time and the
        block number move together, as they do on a live chain)."""
        if seconds < 0:
            raise HarnessError(f"cannot move the clock back by {-seconds} s")
        if seconds == 0:
            return
        target = self._clock + seconds
        self.rpc.call("evm_mine", target - 1)
        self._clock, self._pending_block = target, self._pending_block + 1
        self.head += 1
        self.rpc.call("evm_setNextBlockTimestamp", self._clock)

    def mine(self, blocks: int) -> None:
        """Mine `blocks` empty blocks, one second apart (so that a round's seed block falls out of the last
        256 and its hash reads as zero: every unit drawn)."""
        if blocks <= 0:
            return
        self.rpc.call("hardhat_mine", hex(blocks), hex(1))
        latest = self.rpc.call("eth_getBlockByNumber", "latest", False)
        self._clock = max(self._clock, int(latest["timestamp"], 16) + 1)
        self._pending_block = int(latest["number"], 16) + 1
        self.head += 1
        self.rpc.call("evm_setNextBlockTimestamp", self._clock)

    # ---- transactions and views ----

    def transact(
        self, sender: Actor, contract: Contract, fn: str, args: Sequence[Any], *, expect_revert: bool = False
    ) -> TxOutcome:
        """Run `fn` from `sender`: the decoded typed error if it reverted, else its receipt.

        A revert the model predicts is checked with a call on the pending block (nothing mined, so time
        does not move); otherwise the transaction is mined, and a failed one is decoded from the node's
        error.
        """
        data = self._calldata(contract, fn, args)
        tx = {"from": sender.address, "to": contract.address, "gas": hex(TX_GAS), "data": data}
        if expect_revert:
            response = self.rpc.request("eth_call", tx, "pending")
            if "error" in response:
                return TxOutcome(self.decoder.decode(_revert_bytes(response["error"])), None)
        return self._send(tx)

    def _send(self, tx: Mapping[str, Any]) -> TxOutcome:
        """Mine `tx` in its own block at the harness's clock; a reverted one is mined too (as on a chain)."""
        response = self.rpc.request("eth_sendTransaction", dict(tx))
        error = response.get("error")
        if error is None:
            tx_hash = response["result"]
        else:
            details = error.get("data")
            tx_hash = details.get("txHash") if isinstance(details, Mapping) else None
            if tx_hash is None:
                raise HarnessError(f"the node refused the transaction (not a revert): {error}")
        self._clock += 1
        receipt, _ = self.rpc.batch(
            [("eth_getTransactionReceipt", [tx_hash]), ("evm_setNextBlockTimestamp", [self._clock])]
        )
        if int(receipt["blockNumber"], 16) != self._pending_block:
            raise HarnessError(
                f"transaction mined in block {receipt['blockNumber']}, not {self._pending_block}"
            )
        self._pending_block += 1
        self.head += 1
        if error is not None:
            return TxOutcome(self.decoder.decode(_revert_bytes(error)), None)
        if int(receipt["status"], 16) != 1:
            return TxOutcome(UnknownRevert("UnknownRevert", {"note": "failed without a revert error"}), None)
        return TxOutcome(None, receipt)

    def _function(self, contract: Contract, fn: str) -> tuple[bytes, list[str], list[str]]:
        key = (contract.address, fn)
        found = self._functions.get(key)
        if found is None:
            abi = contract.get_function_by_name(fn).abi
            found = (
                keccak(text=abi_signature(abi))[:4],
                [canonical_type(item) for item in abi["inputs"]],
                [canonical_type(item) for item in abi["outputs"]],
            )
            self._functions[key] = found
        return found

    def _calldata(self, contract: Contract, fn: str, args: Sequence[Any]) -> str:
        selector, input_types, _ = self._function(contract, fn)
        return "0x" + (selector + abi_encode(input_types, list(args))).hex()

    def view(self, contract: Contract, fn: str, *args: Any) -> Any:
        """A read-only call at the chain head, decoded with eth_abi."""
        data = self._calldata(contract, fn, args)
        raw = self.rpc.call("eth_call", {"from": self.deployer.address, "to": contract.address, "data": data})
        values = abi_decode(self._function(contract, fn)[2], bytes.fromhex(raw[2:]))
        return values[0] if len(values) == 1 else values

    def view_struct(self, contract: Contract, fn: str, *args: Any) -> dict[str, Any]:
        """A view returning one struct, as {member name: value} (names from the ABI)."""
        components = contract.get_function_by_name(fn).abi["outputs"][0]["components"]
        return dict(zip((c["name"] for c in components), self.view(contract, fn, *args), strict=True))

    def storage_words(self, wanted: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The words at (contract address, slot) at the chain head: one eth_call per contract, all in one
        round trip (STORAGE_READER_CODE)."""
        slots: dict[str, list[int]] = {}
        for address, slot in wanted:
            slots.setdefault(address, []).append(slot)
        calls = [
            (
                "eth_call",
                [
                    {
                        "to": address,
                        "data": "0x" + b"".join(s.to_bytes(32, "big") for s in wanted_slots).hex(),
                    },
                    "latest",
                    {address: {"code": STORAGE_READER_CODE}},
                ],
            )
            for address, wanted_slots in slots.items()
        ]
        words: dict[tuple[str, int], int] = {}
        for (address, wanted_slots), raw in zip(slots.items(), self.rpc.batch(calls), strict=True):
            data = bytes.fromhex(raw[2:])
            for i, slot in enumerate(wanted_slots):
                words[(address, slot)] = int.from_bytes(data[32 * i : 32 * i + 32], "big")
        return words

    # ---- EIP-712 (the client's encoder, so these signatures are the ones the contracts check) ----

    def sign_market(self, signer: Actor, primary: str, message: Mapping[str, Any]) -> bytes:
        return eip712.sign_typed(signer.account, self.market_domain, primary, message)

    def sign_stake(self, signer: Actor, primary: str, message: Mapping[str, Any]) -> bytes:
        return eip712.sign_typed(signer.account, self.stake_domain, primary, message)

    def sign_appeals(self, signer: Actor, primary: str, message: Mapping[str, Any]) -> bytes:
        return eip712.sign_typed(signer.account, self.appeals_domain, primary, message)
