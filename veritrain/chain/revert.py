"""Turn a revert, however a backend reports it, into the typed exception of `veritrain.chain.errors`.

Two steps: find the raw revert bytes in whatever the backend raised (eth-tester's `TransactionFailed`
message, web3's `ContractLogicError.data`, a node's JSON-RPC error `data` in one of its shapes), then
decode selector + arguments against the committed ABIs.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from eth_abi import decode as abi_decode
from eth_abi import encode as abi_encode
from eth_utils import keccak, to_checksum_address

from veritrain.chain.errors import ContractReverted, UnknownRevert, error_class

ERROR_STRING_SELECTOR = bytes.fromhex("08c379a0")  # Error(string)
PANIC_SELECTOR = bytes.fromhex("4e487b71")  # Panic(uint256)
_HEX_DATA = re.compile(r"0x[0-9a-fA-F]{8,}")


def abi_signature(item: Mapping[str, Any]) -> str:
    """Canonical `Name(type,...)` of an ABI function/event/error entry (tuples expanded)."""
    return f"{item['name']}({','.join(canonical_type(arg) for arg in item.get('inputs', []))})"


def canonical_type(arg: Mapping[str, Any]) -> str:
    kind = str(arg["type"])
    if kind.startswith("tuple"):
        inner = ",".join(canonical_type(component) for component in arg.get("components", []))
        return f"({inner}){kind[len('tuple') :]}"
    return kind


class RevertDecoder:
    """Selector table of every custom error in a set of ABIs."""

    def __init__(self, abis: Iterable[Sequence[Mapping[str, Any]]]) -> None:
        self.errors: dict[bytes, tuple[str, list[str], list[str]]] = {}
        for abi in abis:
            for item in abi:
                if item.get("type") != "error":
                    continue
                selector = keccak(text=abi_signature(item))[:4]
                inputs = item.get("inputs", [])
                names = [str(arg.get("name") or f"arg{i}") for i, arg in enumerate(inputs)]
                self.errors[selector] = (str(item["name"]), [canonical_type(arg) for arg in inputs], names)

    def decode(self, data: bytes | None, *, tx_hash: str | None = None) -> ContractReverted:
        """The typed exception for revert bytes `data` (UnknownRevert if empty or not in the ABIs)."""
        if not data:
            return UnknownRevert("UnknownRevert", {"data": b""}, tx_hash=tx_hash)
        selector, body = data[:4], data[4:]
        try:
            if selector == ERROR_STRING_SELECTOR:
                (reason,) = abi_decode(["string"], body)
                return error_class("Error")("Error", {"reason": reason}, tx_hash=tx_hash)
            if selector == PANIC_SELECTOR:
                (code,) = abi_decode(["uint256"], body)
                return error_class("Panic")("Panic", {"code": int(code)}, tx_hash=tx_hash)
            known = self.errors.get(selector)
            if known is not None:
                name, types, names = known
                values = [
                    _checksummed(kind, value)
                    for kind, value in zip(types, abi_decode(types, body), strict=True)
                ]
                return error_class(name)(name, dict(zip(names, values, strict=True)), tx_hash=tx_hash)
        except Exception:  # malformed body for a known selector: keep the bytes, do not guess
            pass
        return UnknownRevert("UnknownRevert", {"data": bytes(data)}, tx_hash=tx_hash)


def _checksummed(kind: str, value: Any) -> Any:
    if kind == "address":
        return to_checksum_address(value)
    if kind == "address[]":
        return [to_checksum_address(item) for item in value]
    return value


def revert_data(exc: BaseException) -> bytes | None:
    """The raw revert bytes inside an exception from eth-tester, web3 or a JSON-RPC node; None if absent."""
    data = getattr(exc, "data", None)  # web3 ContractLogicError / ContractCustomError
    found = _from_payload(data)
    if found is not None:
        return found
    response = getattr(exc, "rpc_response", None)  # web3 Web3RPCError: the node's raw error object
    if isinstance(response, Mapping):
        found = _from_payload(response.get("error"))
        if found is not None:
            return found
    for arg in exc.args:
        found = _from_payload(arg)
        if found is not None:
            return found
    cause = exc.__cause__ or exc.__context__
    if cause is not None and cause is not exc:
        return revert_data(cause)
    return None


def _from_payload(payload: Any) -> bytes | None:
    if payload is None:
        return None
    if isinstance(payload, bytes | bytearray):
        return bytes(payload)
    if isinstance(
        payload, Mapping
    ):  # {"data": "0x.."} or {"data": {"data": "0x.."}} (hardhat) or nested error
        for key in ("data", "error", "originalError"):
            found = _from_payload(payload.get(key))
            if found is not None:
                return found
        return None
    if isinstance(payload, BaseException):
        return revert_data(payload)
    if isinstance(payload, str):
        return _from_text(payload)
    return None


def _from_text(text: str) -> bytes | None:
    stripped = text.strip()
    if stripped.startswith("0x") and all(c in "0123456789abcdefABCDEF" for c in stripped[2:]):
        return bytes.fromhex(stripped[2:]) if len(stripped) > 2 else b""
    # eth-tester: "execution reverted: b'\\x..'" — the bytes' repr inside a message. Python quotes that repr
    # with " when the bytes hold a ' (a random nonce in the error's arguments can), and the bytes may
    # themselves hold b' or b": try each candidate start, earliest first.
    starts = sorted(m.start() for m in re.finditer(r"b['\"]", stripped))
    for marker in starts:
        try:
            value = ast.literal_eval(stripped[marker:])
        except (ValueError, SyntaxError):
            continue
        if isinstance(value, bytes):
            return value
    match = _HEX_DATA.search(stripped)  # a node message quoting the data
    if match and stripped.startswith(("execution reverted", "reverted")):
        return bytes.fromhex(match.group(0)[2:])
    prefix = "execution reverted: "
    if stripped.startswith(prefix):  # eth-tester already decoded an Error(string): re-encode it
        return ERROR_STRING_SELECTOR + abi_encode(["string"], [stripped[len(prefix) :]])
    return None
