"""Sending transactions: local signing, local nonces, receipts with decoded events, typed reverts.

Why local everything: asking the node for a nonce, a gas estimate and a signature per transaction
triples the round trips (TOOLCHAIN.md: 130 tx/s on hardhat node only with local nonce + fixed gas). Keys
never leave the process. A revert is raised as the contract's own typed error whichever way the backend
reports it: as an exception at send time (hardhat node), or as a failed receipt (eth-tester, geth), in
which case the call is replayed with eth_call to read the revert data.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from eth_abi import decode as abi_decode
from eth_account.signers.local import LocalAccount
from eth_utils import keccak, to_checksum_address
from web3.exceptions import TimeExhausted

from veritrain.chain.backends import Backend
from veritrain.chain.errors import (
    ChainError,
    ContractReverted,
    RpcUnavailable,
    TransactionTimeout,
    UnknownRevert,
)
from veritrain.chain.revert import RevertDecoder, abi_signature, revert_data

FEE_TTL_SECONDS = 10.0
DEFAULT_TIP_WEI = 10**9  # 1 gwei: dev chains accept it; public chains want at least this much
ESTIMATE_MARGIN_NUM, ESTIMATE_MARGIN_DEN = 6, 5  # 20 % over the estimate


@dataclass(frozen=True)
class Event:
    """One decoded log: event name, emitting contract, arguments by name, and where it was logged."""

    name: str
    address: str
    args: dict[str, Any]
    block_number: int = 0
    tx_hash: str = ""
    log_index: int = 0


@dataclass(frozen=True)
class Receipt:
    """What a caller needs from a mined transaction."""

    tx_hash: str
    block_number: int
    gas_used: int
    events: tuple[Event, ...] = field(default_factory=tuple)
    contract_address: str | None = None

    def events_named(self, name: str) -> list[Event]:
        return [event for event in self.events if event.name == name]

    def event(self, name: str) -> Event:
        """The first event called `name`; ChainError if the transaction emitted none."""
        for event in self.events:
            if event.name == name:
                return event
        raise ChainError(
            f"transaction {self.tx_hash} emitted no {name} event ({[e.name for e in self.events]})"
        )


class EventDecoder:
    """topic0 → event ABI over a set of ABIs; undecodable logs are skipped, never guessed."""

    def __init__(self, abis: Iterable[Sequence[Mapping[str, Any]]]) -> None:
        self.events: dict[bytes, Mapping[str, Any]] = {}
        for abi in abis:
            for item in abi:
                if item.get("type") == "event" and not item.get("anonymous"):
                    self.events[keccak(text=abi_signature(item))] = item

    def decode(self, log: Mapping[str, Any]) -> Event | None:
        topics = [bytes(topic) for topic in log["topics"]]
        if not topics or topics[0] not in self.events:
            return None
        item = self.events[topics[0]]
        inputs = item.get("inputs", [])
        indexed = [arg for arg in inputs if arg.get("indexed")]
        plain = [arg for arg in inputs if not arg.get("indexed")]
        values: dict[str, Any] = {}
        for arg, topic in zip(indexed, topics[1:], strict=False):
            kind = str(arg["type"])
            dynamic = kind in ("string", "bytes") or kind.endswith("]") or kind.startswith("tuple")
            values[arg["name"]] = topic if dynamic else _normalize(kind, abi_decode([kind], topic)[0])
        decoded = abi_decode([str(arg["type"]) for arg in plain], bytes(log["data"]))
        for arg, value in zip(plain, decoded, strict=True):
            values[arg["name"]] = _normalize(str(arg["type"]), value)
        ordered = {str(arg["name"]): values[arg["name"]] for arg in inputs}
        return Event(
            name=str(item["name"]),
            address=to_checksum_address(log["address"]),
            args=ordered,
            block_number=int(log.get("blockNumber") or 0),
            tx_hash="0x" + bytes(log["transactionHash"]).hex() if log.get("transactionHash") else "",
            log_index=int(log.get("logIndex") or 0),
        )


def _normalize(kind: str, value: Any) -> Any:
    if kind == "address":
        return to_checksum_address(value)
    if kind == "address[]":
        return [to_checksum_address(item) for item in value]
    if isinstance(value, tuple):
        return list(value)
    return value


class Transactor:
    """Signs and sends for any number of local accounts; one nonce counter and lock per sender."""

    def __init__(
        self,
        backend: Backend,
        abis: Iterable[Sequence[Mapping[str, Any]]],
        *,
        receipt_timeout: float = 120.0,
        poll_latency: float = 0.005,
    ) -> None:
        abi_list = [list(abi) for abi in abis]
        self.backend = backend
        self.w3 = backend.w3
        self.reverts = RevertDecoder(abi_list)
        self.event_decoder = EventDecoder(abi_list)
        self.receipt_timeout = receipt_timeout
        self.poll_latency = poll_latency
        self._nonces: dict[str, int] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._fees: tuple[int, int, float] | None = None

    def _lock_for(self, address: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(address, threading.Lock())

    def fees(self) -> tuple[int, int]:
        """(maxFeePerGas, maxPriorityFeePerGas) for EIP-1559 transactions, refreshed every few seconds.

        Twice the latest base fee plus the tip survives six full blocks of base-fee growth.
        """
        now = time.monotonic()
        if self._fees is None or now - self._fees[2] > FEE_TTL_SECONDS:
            base_fee = int(self.w3.eth.get_block("latest").get("baseFeePerGas", 0))
            tip = DEFAULT_TIP_WEI
            self._fees = (2 * base_fee + tip, tip, now)
        return self._fees[0], self._fees[1]

    def resync_nonce(self, address: str) -> None:
        """Forget the local nonce of `address` (the next send asks the node): after errors, outside sends."""
        with self._lock_for(address):
            self._nonces.pop(address, None)

    def forget_nonces(self) -> None:
        """Forget every local nonce (after a snapshot revert, or when another process sent for our keys)."""
        with self._locks_guard:
            self._nonces.clear()

    def call(self, to: str, data: bytes, *, sender: str | None = None) -> bytes:
        """eth_call; a revert raises its typed error."""
        request: dict[str, Any] = {"to": to, "data": data}
        if sender:
            request["from"] = sender
        try:
            return bytes(self.w3.eth.call(request))  # type: ignore[arg-type]
        except Exception as err:
            raise self._typed(err) from err

    def estimate(self, sender: str, to: str | None, data: bytes, value: int = 0) -> int:
        request: dict[str, Any] = {"from": sender, "data": data, "value": value}
        if to:
            request["to"] = to
        try:
            estimate = int(self.w3.eth.estimate_gas(request))  # type: ignore[arg-type]
        except Exception as err:
            raise self._typed(err) from err
        return estimate * ESTIMATE_MARGIN_NUM // ESTIMATE_MARGIN_DEN + 10_000

    def send(
        self, sender: LocalAccount, to: str | None, data: bytes, *, gas: int | None = None, value: int = 0
    ) -> Receipt:
        """Sign and send; wait for the receipt; raise the contract's typed error if it reverted.

        `gas=None` estimates (which also pre-flights the call); a fixed `gas` skips that round trip.
        """
        address = sender.address
        if gas is None:
            gas = self.estimate(address, to, data, value)
        max_fee, tip = self.fees()
        lock = self._lock_for(address)
        with lock:
            nonce = self._nonces.get(address)
            if nonce is None:
                nonce = int(self.w3.eth.get_transaction_count(address, "pending"))
            tx: dict[str, Any] = {
                "nonce": nonce,
                "gas": gas,
                "maxFeePerGas": max_fee,
                "maxPriorityFeePerGas": tip,
                "type": 2,
                "chainId": self.backend.chain_id,
                "value": value,
                "data": data,
            }
            if to:
                tx["to"] = to
            raw = sender.sign_transaction(tx).raw_transaction
            try:
                tx_hash = self.w3.eth.send_raw_transaction(raw)
            except Exception as err:
                # hardhat node mines a reverting tx and then reports it: the nonce may or may not be used.
                self._nonces.pop(address, None)
                raise self._typed(err) from err
            self._nonces[address] = nonce + 1
        try:
            mined = self.w3.eth.wait_for_transaction_receipt(
                tx_hash, timeout=self.receipt_timeout, poll_latency=self.poll_latency
            )
        except TimeExhausted as err:
            self.resync_nonce(address)
            raise TransactionTimeout("0x" + bytes(tx_hash).hex(), self.receipt_timeout) from err
        hex_hash = "0x" + bytes(tx_hash).hex()
        if int(mined["status"]) != 1:
            raise self._replay_failure(address, to, data, value, gas, int(mined["gasUsed"]), hex_hash)
        events = tuple(
            event for event in (self.event_decoder.decode(log) for log in mined["logs"]) if event is not None
        )
        contract = mined.get("contractAddress")
        return Receipt(
            tx_hash=hex_hash,
            block_number=int(mined["blockNumber"]),
            gas_used=int(mined["gasUsed"]),
            events=events,
            contract_address=to_checksum_address(contract) if contract else None,
        )

    def _replay_failure(
        self, sender: str, to: str | None, data: bytes, value: int, gas: int, gas_used: int, tx_hash: str
    ) -> ContractReverted:
        """A mined failure carries no revert data: re-run it as eth_call on the state it failed on."""
        request: dict[str, Any] = {"from": sender, "data": data, "value": value, "gas": gas}
        if to:
            request["to"] = to
        try:
            self.w3.eth.call(request)  # type: ignore[arg-type]
        except Exception as err:
            typed = self._typed(err)
            if isinstance(typed, ContractReverted):
                typed.tx_hash = tx_hash
                return typed
            return UnknownRevert("UnknownRevert", {"reason": f"replay failed: {typed}"}, tx_hash=tx_hash)
        reason = "out of gas" if gas_used >= gas else "reverted, but the replay succeeds (state moved on)"
        return UnknownRevert(
            "UnknownRevert", {"reason": reason, "gas": gas, "gasUsed": gas_used}, tx_hash=tx_hash
        )

    def _typed(self, err: Exception) -> ChainError:
        """A revert becomes its typed ContractReverted; any other failure a ChainError with the cause."""
        if isinstance(err, ChainError):
            return err
        if any(cls.__name__ in ("ConnectionError", "ProviderConnectionError") for cls in type(err).__mro__):
            return RpcUnavailable(f"the node stopped answering: {err}")
        data = revert_data(err)
        if data is not None or _looks_like_revert(err):
            return self.reverts.decode(data)
        return ChainError(f"{type(err).__name__}: {err}")


def _looks_like_revert(err: Exception) -> bool:
    text = str(err).lower()
    return "revert" in text or type(err).__name__ in ("ContractLogicError", "TransactionFailed")
