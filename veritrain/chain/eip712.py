"""EIP-712 typed messages of the Veritrain contracts: build, hash, sign, recover; and the commit hash.

Why hand-rolled hashing: every Veritrain message has only static fields (uint, address, bytes32), so the
struct hash is keccak(typeHash ‖ abi.encode(fields)) — a few microseconds, where eth-account's generic
encoder costs about a millisecond per message. `full_message()` gives the standard JSON form, and the
tests check both encoders agree, and that signatures recover as the contracts' ECDSA expects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eth_abi import encode as abi_encode
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import keccak, to_checksum_address

from veritrain.errors import InvalidInput

MARKET_DOMAIN_NAME = "Veritrain JobMarket"
STAKE_DOMAIN_NAME = "Veritrain StakeManager"
APPEALS_DOMAIN_NAME = "Veritrain VerdictAppeals"
TOKEN_DOMAIN_NAME = "Veritrain Token"  # ERC20Permit uses the token name as the domain name
DOMAIN_VERSION = "1"

# Field lists, in the order of the contracts' typehash strings (contracts/*.sol).
TYPES: dict[str, tuple[tuple[str, str], ...]] = {
    "Accept": (
        ("orderId", "uint256"),
        ("unitKey", "bytes32"),
        ("provider", "address"),
        ("nonce", "uint256"),
        ("deadline", "uint256"),
    ),
    "Commit": (
        ("unitId", "uint256"),
        ("provider", "address"),
        ("commitment", "bytes32"),
        ("nonce", "uint256"),
        ("deadline", "uint256"),
    ),
    # commitBatch's message. No nonce: a provider commits once per unit, the unit's state makes it single-use.
    "UnitCommit": (
        ("unitId", "uint256"),
        ("provider", "address"),
        ("commitment", "bytes32"),
        ("deadline", "uint256"),
    ),
    # A roster provider's commitments for one round (stepRound): `commitmentsHash` the keccak256 of its
    # slots' commitments in slot order (`round_commitments_hash`). No nonce: a round is committed once.
    "RoundCommit": (
        ("orderId", "uint256"),
        ("round", "uint256"),
        ("provider", "address"),
        ("commitmentsHash", "bytes32"),
        ("deadline", "uint256"),
    ),
    # Outcome-only and nonce-free: reasons stay off chain (each verifier measures its own floats), and a
    # unit settles once, so the unit's state makes the signature single-use.
    "Verdict": (
        ("unitId", "uint256"),
        ("outcomesHash", "bytes32"),
        ("deadline", "uint256"),
    ),
    # A referee's vote on an appeal (VerdictAppeals' domain); no nonce: one vote per referee and appeal.
    "RefereeVote": (
        ("unitId", "uint256"),
        ("outcomesHash", "bytes32"),
        ("deadline", "uint256"),
    ),
    # A roster verifier's audit of the round records pending a posting (stepRound): `records` their chain;
    # no nonce, a chain of records is posted once.
    "RoundAudit": (
        ("orderId", "uint256"),
        ("records", "bytes32"),
    ),
    "WithdrawCredit": (
        ("account", "address"),
        ("nonce", "uint256"),
        ("deadline", "uint256"),
    ),
    "RequestUnstake": (
        ("staker", "address"),
        ("amount", "uint256"),
        ("nonce", "uint256"),
        ("deadline", "uint256"),
    ),
    "Withdraw": (
        ("staker", "address"),
        ("nonce", "uint256"),
        ("deadline", "uint256"),
    ),
    "Permit": (
        ("owner", "address"),
        ("spender", "address"),
        ("value", "uint256"),
        ("nonce", "uint256"),
        ("deadline", "uint256"),
    ),
}

DOMAIN_FIELDS = (
    ("name", "string"),
    ("version", "string"),
    ("chainId", "uint256"),
    ("verifyingContract", "address"),
)
_DOMAIN_TYPEHASH = keccak(text="EIP712Domain(" + ",".join(f"{t} {n}" for n, t in DOMAIN_FIELDS) + ")")


@dataclass(frozen=True)
class Domain:
    """An EIP-712 domain: which contract, on which chain, a signature is valid for."""

    name: str
    chain_id: int
    verifying_contract: str
    version: str = DOMAIN_VERSION

    def separator(self) -> bytes:
        return keccak(
            abi_encode(
                ["bytes32", "bytes32", "bytes32", "uint256", "address"],
                [
                    _DOMAIN_TYPEHASH,
                    keccak(text=self.name),
                    keccak(text=self.version),
                    self.chain_id,
                    to_checksum_address(self.verifying_contract),
                ],
            )
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "chainId": self.chain_id,
            "verifyingContract": to_checksum_address(self.verifying_contract),
        }


def market_domain(chain_id: int, job_market: str) -> Domain:
    return Domain(MARKET_DOMAIN_NAME, chain_id, job_market)


def appeals_domain(chain_id: int, verdict_appeals: str) -> Domain:
    return Domain(APPEALS_DOMAIN_NAME, chain_id, verdict_appeals)


def stake_domain(chain_id: int, stake_manager: str) -> Domain:
    return Domain(STAKE_DOMAIN_NAME, chain_id, stake_manager)


def token_domain(chain_id: int, token: str) -> Domain:
    return Domain(TOKEN_DOMAIN_NAME, chain_id, token)


def type_string(primary: str) -> str:
    fields = _fields(primary)
    return f"{primary}(" + ",".join(f"{kind} {name}" for name, kind in fields) + ")"


def type_hash(primary: str) -> bytes:
    return keccak(text=type_string(primary))


def _fields(primary: str) -> tuple[tuple[str, str], ...]:
    try:
        return TYPES[primary]
    except KeyError:
        raise InvalidInput(f"unknown EIP-712 message type {primary!r}; known: {sorted(TYPES)}") from None


def _values(primary: str, message: Mapping[str, Any]) -> list[Any]:
    fields = _fields(primary)
    missing = [name for name, _ in fields if name not in message]
    extra = sorted(set(message) - {name for name, _ in fields})
    if missing or extra:
        raise InvalidInput(f"{primary} message: missing fields {missing}, unexpected fields {extra}")
    values: list[Any] = []
    for name, kind in fields:
        value = message[name]
        if kind == "address":
            value = to_checksum_address(value)
        elif kind == "bytes32":
            value = as_bytes32(value, name)
        elif kind.startswith("uint") and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise InvalidInput(f"{primary}.{name} must be a non-negative int, got {value!r}")
        values.append(value)
    return values


def as_bytes32(value: bytes | str, what: str = "value") -> bytes:
    """32 raw bytes from bytes or a 0x-hex string; InvalidInput otherwise."""
    raw = (
        bytes.fromhex(value[2:] if value.startswith("0x") else value)
        if isinstance(value, str)
        else bytes(value)
    )
    if len(raw) != 32:
        raise InvalidInput(f"{what} must be 32 bytes, got {len(raw)}")
    return raw


def struct_hash(primary: str, message: Mapping[str, Any]) -> bytes:
    kinds = ["bytes32"] + [kind for _, kind in _fields(primary)]
    return keccak(abi_encode(kinds, [type_hash(primary), *_values(primary, message)]))


def typed_digest(domain: Domain, primary: str, message: Mapping[str, Any]) -> bytes:
    """The 32-byte hash the signer signs: keccak(0x1901 ‖ domainSeparator ‖ structHash)."""
    return keccak(b"\x19\x01" + domain.separator() + struct_hash(primary, message))


def full_message(domain: Domain, primary: str, message: Mapping[str, Any]) -> dict[str, Any]:
    """The standard JSON form (eth_signTypedData_v4 / eth-account's `encode_typed_data(full_message=...)`)."""
    values = _values(primary, message)
    return {
        "types": {
            "EIP712Domain": [{"name": n, "type": t} for n, t in DOMAIN_FIELDS],
            primary: [{"name": n, "type": t} for n, t in _fields(primary)],
        },
        "primaryType": primary,
        "domain": domain.as_dict(),
        "message": {name: value for (name, _), value in zip(_fields(primary), values, strict=True)},
    }


def sign_typed(signer: LocalAccount, domain: Domain, primary: str, message: Mapping[str, Any]) -> bytes:
    """65-byte r ‖ s ‖ v signature (v = 27/28), the form OpenZeppelin's ECDSA.recover takes."""
    signed = Account.unsafe_sign_hash(typed_digest(domain, primary, message), signer.key)
    return bytes(signed.signature)


def recover_typed(domain: Domain, primary: str, message: Mapping[str, Any], signature: bytes) -> str:
    """The checksummed address that made `signature` over this message in this domain."""
    return str(Account._recover_hash(typed_digest(domain, primary, message), signature=signature))


def split_signature(signature: bytes) -> tuple[int, bytes, bytes]:
    """(v, r, s) of a 65-byte signature, for functions such as ERC-2612 permit."""
    if len(signature) != 65:
        raise InvalidInput(f"a signature is 65 bytes, got {len(signature)}")
    return signature[64], signature[:32], signature[32:64]


def commitment(result_digest: bytes | str, salt: bytes | str, provider: str, unit_id: int) -> bytes:
    """keccak256(abi.encode(resultDigest, salt, provider, unitId)) — what `commit` stores for a replica."""
    return keccak(
        abi_encode(
            ["bytes32", "bytes32", "address", "uint256"],
            [
                as_bytes32(result_digest, "result_digest"),
                as_bytes32(salt, "salt"),
                to_checksum_address(provider),
                unit_id,
            ],
        )
    )


def compact_signature(signature: bytes) -> tuple[bytes, bytes]:
    """(r, vs) of a 65-byte signature (EIP-2098): `s` with the parity of `v` in its top bit, the form the
    round path takes, one word shorter in calldata."""
    v, r, s = split_signature(signature)
    if v not in (27, 28):
        raise InvalidInput(f"a signature's v is 27 or 28, got {v}")
    vs = int.from_bytes(s, "big") | ((v - 27) << 255)
    return r, vs.to_bytes(32, "big")


def round_unit_id(order_id: int, round_index: int, unit: int) -> int:
    """keccak256(abi.encode(orderId, round, unit)): the unit id a round-path unit's commitments name
    (JobMarket `roundUnitId`)."""
    return int.from_bytes(keccak(abi_encode(["uint256"] * 3, [order_id, round_index, unit])), "big")


def round_commitments_hash(commitments: Sequence[bytes | str]) -> bytes:
    """A `RoundCommit`'s `commitmentsHash`: keccak256 of one provider's slots' commitments of a round, in
    slot order (abi.encodePacked of the bytes32s)."""
    return keccak(b"".join(as_bytes32(c, "commitment") for c in commitments))


def round_commit_message(
    provider: str, order_id: int, round_index: int, commitments: Sequence[bytes | str], deadline: int
) -> dict[str, Any]:
    """The typed `RoundCommit` message of `provider`'s slots' `commitments` (slot order) of a round."""
    return {
        "orderId": order_id,
        "round": round_index,
        "provider": to_checksum_address(provider),
        "commitmentsHash": round_commitments_hash(commitments),
        "deadline": deadline,
    }


def round_commitments_chain(order_id: int, round_index: int, commitments: Sequence[bytes]) -> bytes:
    """The chained commitments JobMarket keeps for a committed round (with no audit record pending, its
    round hash): keccak256(a, b) from (orderId, round) through every slot's commitment in slot order."""
    chain = keccak(abi_encode(["uint256", "uint256"], [order_id, round_index]))
    for c in commitments:
        chain = keccak(chain + as_bytes32(c, "commitment"))
    return chain


def roster_key(
    providers: Sequence[str],
    layout: int,
    replicas: int,
    units_per_round: int,
    rounds: int,
    verifiers: Sequence[str] = (),
) -> bytes:
    """The `unitKey` each roster provider's `Accept` signs (JobMarket `rosterKey`):
    keccak256(abi.encode(providers, layout, replicas, unitsPerRound, rounds)) for a roster without
    verifiers (the key the roster is recorded by), keccak256(abi.encode(that key, verifiers)) with them."""
    parties = keccak(
        abi_encode(
            ["address[]", "uint256", "uint8", "uint32", "uint32"],
            [[to_checksum_address(p) for p in providers], layout, replicas, units_per_round, rounds],
        )
    )
    if not verifiers:
        return parties
    return keccak(
        abi_encode(["bytes32", "address[]"], [parties, [to_checksum_address(v) for v in verifiers]])
    )


def digests_hash(digests: Sequence[bytes]) -> bytes:
    """keccak256(abi.encodePacked(bytes32[] digests)): a `RoundAudit`'s digestsHash, the audited units'
    agreed digests in unit order."""
    return keccak(b"".join(as_bytes32(d, "digest") for d in digests))


def audit_chain(records: Sequence[tuple[int, bytes]], start: bytes = b"\x00" * 32) -> bytes:
    """A roster's audit chain (JobMarket `RosterAudits`): `start` extended by each `(info, digestsHash)`
    record in order, keccak256(abi.encode(chain, info, digestsHash)) each."""
    chain = as_bytes32(start, "chain")
    for info, digests in records:
        chain = keccak(
            abi_encode(["bytes32", "uint256", "bytes32"], [chain, info, as_bytes32(digests, "digest")])
        )
    return chain


POSTING_FLAG = 1 << 255


def audit_chains(records: Sequence[tuple[int, bytes]], start: bytes = b"\x00" * 32) -> tuple[bytes, bytes]:
    """A roster's posted and pending audit chains (JobMarket `RosterAudits`, `RoundAudit.pending`) over its
    flat `(info, digestsHash)` records from the posted chain `start`: a round record (bit 255 of `info`
    clear) extends the pending chain, a posting's (bit 255 set) extends the posted chain with the pending
    chain before it, which starts again from zero."""
    posted = as_bytes32(start, "chain")
    pending = b"\x00" * 32
    for info, digests in records:
        if info & POSTING_FLAG:
            posted = audit_chain([(info, pending)], posted)
            pending = b"\x00" * 32
        else:
            pending = audit_chain([(info, digests)], pending)
    return posted, pending


def outcomes_hash(outcomes: Sequence[int]) -> bytes:
    """keccak256(abi.encodePacked(uint8[] outcomes)), outcomes per replica in assignment order.

    Solidity's packed encoding pads every element of an array to 32 bytes (only scalars are packed tight),
    so this is the keccak of one 32-byte word per outcome.
    """
    if any(not 0 <= int(outcome) <= 255 for outcome in outcomes):
        raise InvalidInput(f"outcomes are uint8 values, got {list(outcomes)}")
    return keccak(b"".join(int(outcome).to_bytes(32, "big") for outcome in outcomes))
