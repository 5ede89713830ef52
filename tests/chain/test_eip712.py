"""EIP-712 helpers: our fast hashing equals eth-account's reference encoder; signatures recover the signer."""

from __future__ import annotations

import os

import pytest
from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_utils import keccak

from veritrain.chain import eip712
from veritrain.chain.backends import dev_accounts
from veritrain.errors import InvalidInput

CONTRACT = "0x5FbDB2315678afecb367f032d93F642f64180aa3"


def sample_message(primary: str, account: str) -> dict[str, object]:
    values: dict[str, object] = {}
    for index, (name, kind) in enumerate(eip712.TYPES[primary]):
        if kind == "address":
            values[name] = account
        elif kind == "bytes32":
            values[name] = os.urandom(32)
        else:
            values[name] = 10**18 * (index + 1) + index
    return values


@pytest.mark.parametrize("primary", sorted(eip712.TYPES))
def test_digest_matches_eth_account_and_signature_recovers(primary: str) -> None:
    signer = dev_accounts(2)[1]
    domain = eip712.Domain("Veritrain JobMarket", 31337, CONTRACT)
    message = sample_message(primary, signer.address)

    reference = encode_typed_data(full_message=eip712.full_message(domain, primary, message))
    digest = eip712.typed_digest(domain, primary, message)
    assert keccak(b"\x19" + reference.version + reference.header + reference.body) == digest

    signature = eip712.sign_typed(signer, domain, primary, message)
    assert len(signature) == 65 and signature[64] in (27, 28)
    assert eip712.recover_typed(domain, primary, message, signature) == signer.address
    assert Account.recover_message(reference, signature=signature) == signer.address


def test_other_chain_id_or_contract_recovers_another_address() -> None:
    signer = dev_accounts(1)[0]
    message = sample_message("Withdraw", signer.address)
    signed_for = eip712.stake_domain(31337, CONTRACT)
    signature = eip712.sign_typed(signer, signed_for, "Withdraw", message)
    other_chain = eip712.stake_domain(1, CONTRACT)
    other_contract = eip712.stake_domain(31337, "0x" + "11" * 20)
    assert eip712.recover_typed(other_chain, "Withdraw", message, signature) != signer.address
    assert eip712.recover_typed(other_contract, "Withdraw", message, signature) != signer.address


def test_commitment_binds_provider_and_unit() -> None:
    digest, salt = os.urandom(32), os.urandom(32)
    alice, bob = (account.address for account in dev_accounts(2))
    base = eip712.commitment(digest, salt, alice, 7)
    assert base == eip712.commitment("0x" + digest.hex(), salt.hex(), alice.lower(), 7)
    assert base != eip712.commitment(digest, salt, bob, 7)
    assert base != eip712.commitment(digest, salt, alice, 8)
    assert base != eip712.commitment(digest, os.urandom(32), alice, 7)


@pytest.mark.parametrize(
    ("primary", "message"),
    [
        ("Nope", {}),
        ("Withdraw", {"staker": CONTRACT, "nonce": 0}),
        ("Withdraw", {"staker": CONTRACT, "nonce": 0, "deadline": 1, "extra": 1}),
        ("Withdraw", {"staker": CONTRACT, "nonce": -1, "deadline": 1}),
        ("Accept", {"orderId": 1, "unitKey": b"short", "provider": CONTRACT, "nonce": 0, "deadline": 1}),
    ],
)
def test_malformed_messages_are_rejected(primary: str, message: dict[str, object]) -> None:
    domain = eip712.market_domain(31337, CONTRACT)
    with pytest.raises(InvalidInput):
        eip712.typed_digest(domain, primary, message)
