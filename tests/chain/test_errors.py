"""Every bad input reverts with its own custom error, decoded into the same Python class on both backends."""

from __future__ import annotations

import os
from typing import Any

import pytest

from veritrain.chain import eip712, errors
from veritrain.chain.artifacts import load_all
from veritrain.chain.client import Outcome, Reveal, Signed, SignedCommit
from veritrain.chain.revert import RevertDecoder
from veritrain.errors import InvalidInput

pytestmark = pytest.mark.chain

TOKEN = 10**18


def test_every_abi_error_has_a_declared_class() -> None:
    names = {item["name"] for data in load_all().values() for item in data.errors()}
    assert names - errors.declared_error_names() == set()
    for name in names:
        assert issubclass(errors.error_class(name), errors.ContractReverted)


def test_unknown_selector_and_standard_reverts_decode() -> None:
    decoder = RevertDecoder([])
    assert isinstance(decoder.decode(b"\x12\x34\x56\x78"), errors.UnknownRevert)
    assert isinstance(decoder.decode(b""), errors.UnknownRevert)
    reason = bytes.fromhex("08c379a0") + bytes.fromhex(
        "0000000000000000000000000000000000000000000000000000000000000020"
        "0000000000000000000000000000000000000000000000000000000000000004"
        "6f6f707300000000000000000000000000000000000000000000000000000000"
    )
    decoded = decoder.decode(reason)
    assert isinstance(decoded, errors.RevertedWithReason) and decoded.arguments == {"reason": "oops"}


def test_wrong_signer(world: Any) -> None:
    client = world.client
    unit_id = world.assign(world.post_order())
    provider, impostor = world.providers[0], world.providers[1]
    commitment = client.commitment(os.urandom(32), os.urandom(32), provider, unit_id)
    nonce = client.market_nonce(provider)
    forged = client._sign(
        impostor,
        client.market_domain,
        "Commit",
        {
            "unitId": unit_id,
            "provider": provider.address,
            "commitment": commitment,
            "nonce": nonce,
            "deadline": client.now() + 600,
        },
    )
    with pytest.raises(errors.InvalidSigner) as caught:
        client.commit_with_sig(unit_id, provider, commitment, forged)
    assert caught.value.arguments == {"expected": provider.address, "recovered": impostor.address}
    assert isinstance(caught.value, errors.SignatureRejected)


def test_replayed_nonce(world: Any) -> None:
    client, staker = world.client, world.providers[3]
    signed = client.sign_request_unstake(staker, 1 * TOKEN, client.now() + 600)
    client.request_unstake_with_sig(staker, 1 * TOKEN, signed)
    with pytest.raises(errors.InvalidNonce) as caught:
        client.request_unstake_with_sig(staker, 1 * TOKEN, signed)
    assert caught.value.arguments == {
        "account": staker.address,
        "expected": signed.nonce + 1,
        "given": signed.nonce,
    }


def test_a_replayed_accept_nonce_decodes_whatever_bytes_the_nonce_holds(world: Any) -> None:
    """Accept nonces are random, so the error's arguments are arbitrary bytes: one holding ' and b' made
    eth-tester's message a "-quoted repr that was once decoded as Error(string) (a flaky CI failure)."""
    client, providers = world.client, world.providers[:3]
    order_id = world.post_order(units=2)
    deadline = client.now() + 3600
    nonce = int.from_bytes(b"\xb1b')'\x0bmKH" + bytes(23), "big")  # its repr holds b' and no "
    key = os.urandom(32)
    accepts = [
        client.sign_accept(p, order_id, key, deadline, nonce=nonce + i) for i, p in enumerate(providers)
    ]
    client.assign(order_id, key, providers, world.verifiers[:2], accepts)
    with pytest.raises(errors.AcceptNonceUsed) as caught:
        client.assign(order_id, key, providers, world.verifiers[:2], accepts)
    assert caught.value.arguments["nonce"] == nonce


def test_expired_deadline(world: Any) -> None:
    client, provider = world.client, world.providers[0]
    client.finalize(_settleable_unit(world))
    deadline = client.now() - 1
    signed = client.sign_withdraw_credit(provider, deadline)
    with pytest.raises(errors.SignatureExpired) as caught:
        client.withdraw_credit_with_sig(provider, signed)
    assert caught.value.arguments["deadline"] == deadline
    assert caught.value.arguments["now"] > deadline


def test_wrong_chain_id_in_the_signed_domain(world: Any) -> None:
    client, provider = world.client, world.providers[0]
    client.finalize(_settleable_unit(world))
    other_chain = eip712.market_domain(client.chain_id + 1, client.deployment.job_market)
    message = {
        "account": provider.address,
        "nonce": client.market_nonce(provider),
        "deadline": client.now() + 600,
    }
    signature = eip712.sign_typed(provider, other_chain, "WithdrawCredit", message)
    signed = Signed(provider.address, signature, message["nonce"], message["deadline"])
    with pytest.raises(errors.InvalidSigner) as caught:
        client.withdraw_credit_with_sig(provider, signed)
    assert caught.value.arguments["expected"] == provider.address
    assert caught.value.arguments["recovered"] == eip712.recover_typed(
        client.market_domain, "WithdrawCredit", message, signature
    )
    assert caught.value.arguments["recovered"] != provider.address


def test_commit_after_the_deadline(world: Any) -> None:
    client, provider = world.client, world.providers[0]
    unit_id = world.assign(world.post_order())
    unit = client.get_unit(unit_id)
    client.advance_time(unit.commit_deadline - client.now() + 1)
    with pytest.raises(errors.CommitWindowClosed) as caught:
        client.commit(provider, unit_id, os.urandom(32))
    assert caught.value.arguments == {"unitId": unit_id, "deadline": unit.commit_deadline}


def test_reveal_that_does_not_match_the_commit(world: Any) -> None:
    client = world.client
    unit_id = world.assign(world.post_order())
    digests = [b"\x01" * 32] * 3
    salts = world.commit_all(unit_id, digests)
    provider = world.providers[1]
    with pytest.raises(errors.RevealMismatch) as caught:
        client.reveal(unit_id, provider, b"\x02" * 32, salts[1])
    assert caught.value.arguments == {"unitId": unit_id, "provider": provider.address}


def test_verdict_without_quorum(world: Any) -> None:
    client = world.client
    unit_id = world.assign(world.post_order())
    digests = [b"\x01" * 32, b"\x01" * 32, b"\x02" * 32]
    world.reveal_all(unit_id, digests, world.commit_all(unit_id, digests))
    outcomes = [Outcome.ACCEPT, Outcome.ACCEPT, Outcome.FAULT]
    lone = client.sign_verdict(world.verifiers[0], unit_id, outcomes, client.now() + 600)
    with pytest.raises(errors.QuorumNotReached) as caught:
        client.submit_verdict(unit_id, outcomes, [lone])
    assert caught.value.arguments == {"unitId": unit_id, "valid": 1, "required": 2}


def test_double_withdraw(world: Any) -> None:
    client, provider = world.client, world.providers[0]
    client.finalize(_settleable_unit(world))
    client.withdraw_credit(provider)
    with pytest.raises(errors.NothingToWithdraw) as caught:
        client.withdraw_credit(provider)
    assert caught.value.arguments == {"account": provider.address}


def test_unstake_below_locked_collateral(world: Any) -> None:
    client, provider = world.client, world.providers[0]
    world.assign(world.post_order())
    position = client.stake_of(provider)
    assert position.locked == client.params.provider_collateral
    with pytest.raises(errors.InsufficientFreeStake) as caught:
        client.request_unstake(provider, position.bonded)
    assert caught.value.arguments == {
        "account": provider.address,
        "free": position.free,
        "requested": position.bonded,
    }


def test_fixed_gas_and_estimated_gas_raise_the_same_error_and_keep_nonces(world: Any) -> None:
    """A revert found by eth_estimateGas and one mined (or refused at send) decode to the same error."""
    client, provider = world.client, world.providers[0]
    data = bytes.fromhex(client.market.encode_abi("withdrawCredit", args=[])[2:])
    target = client.deployment.job_market
    with pytest.raises(errors.NothingToWithdraw) as estimated:
        client.transactor.send(provider, target, data)
    with pytest.raises(errors.NothingToWithdraw) as fixed:
        client.transactor.send(provider, target, data, gas=200_000)
    assert estimated.value.arguments == fixed.value.arguments == {"account": provider.address}
    assert fixed.value.tx_hash is not None or world.backend.kind == "rpc"
    client.approve(provider, client.deployment.job_market, 1)  # the next nonce is still right
    assert client.allowance(provider, client.deployment.job_market) == 1


def _settleable_unit(world: Any) -> int:
    """A unit whose three replicas revealed the same digest (ready to finalize)."""
    unit_id = world.assign(world.post_order())
    digests = [b"\x05" * 32] * 3
    world.reveal_all(unit_id, digests, world.commit_all(unit_id, digests))
    return int(unit_id)


def test_a_reverting_view_raises_its_typed_error(world: Any) -> None:
    unit_id = world.assign(world.post_order())
    with pytest.raises(errors.ReplicaIndexOutOfRange) as caught:
        world.client.replica(unit_id, 3)
    assert caught.value.arguments == {"unitId": unit_id, "index": 3}


def test_a_transaction_that_is_never_mined_raises_transaction_timeout(world: Any) -> None:
    client, backend = world.client, world.backend
    client.transactor.receipt_timeout = 0.3
    _set_automine(backend, False)
    try:
        with pytest.raises(errors.TransactionTimeout) as caught:
            client.mint(world.outsider, 1)
        assert caught.value.tx_hash.startswith("0x")
    finally:
        _set_automine(backend, True)
        client.transactor.receipt_timeout = 120.0


def _set_automine(backend: Any, enabled: bool) -> None:
    if backend.kind == "inprocess":
        if enabled:
            backend.tester.enable_auto_mine_transactions()
        else:
            backend.tester.disable_auto_mine_transactions()
    else:
        backend.w3.provider.make_request("evm_setAutomine", [enabled])


# -- batches: one bad entry reverts the whole batch with that entry's own error


def test_commit_batch_with_a_wrong_signer_reverts_the_whole_batch(world: Any) -> None:
    client = world.client
    unit_id = world.assign(world.post_order())
    commits, _ = world.signed_commits(unit_id, [os.urandom(32)] * 3)
    victim, impostor = world.providers[1], world.providers[2]
    message = {
        "unitId": unit_id,
        "provider": victim.address,
        "commitment": commits[1].commitment,
        "deadline": commits[1].deadline,
    }
    signature = eip712.sign_typed(impostor, client.market_domain, "UnitCommit", message)
    forged = SignedCommit(victim.address, commits[1].commitment, commits[1].deadline, signature)
    with pytest.raises(errors.InvalidSigner) as caught:
        client.commit_batch(unit_id, [commits[0], forged])
    assert caught.value.arguments == {"expected": victim.address, "recovered": impostor.address}
    assert client.get_unit(unit_id).committed_mask == 0


def test_commit_batch_by_a_provider_not_assigned_to_the_unit(world: Any) -> None:
    client, stranger = world.client, world.providers[3]
    unit_id = world.assign(world.post_order())
    commits, _ = world.signed_commits(unit_id, [os.urandom(32)], providers=[stranger])
    with pytest.raises(errors.NotAssignedProvider) as caught:
        client.commit_batch(unit_id, commits)
    assert caught.value.arguments == {"unitId": unit_id, "account": stranger.address}


def test_commit_batch_with_an_expired_deadline(world: Any) -> None:
    client, provider = world.client, world.providers[0]
    unit_id = world.assign(world.post_order())
    deadline = client.now() - 1
    signed = client.sign_unit_commit(provider, unit_id, os.urandom(32), deadline)
    with pytest.raises(errors.SignatureExpired) as caught:
        client.commit_batch(unit_id, [signed])
    assert caught.value.arguments["deadline"] == deadline
    assert caught.value.arguments["now"] > deadline


def test_empty_batches_revert(world: Any) -> None:
    client = world.client
    unit_id = world.assign(world.post_order())
    with pytest.raises(errors.EmptyBatch):
        client.commit_batch(unit_id, [])
    with pytest.raises(errors.EmptyBatch):
        client.reveal_batch(unit_id, [])


def test_a_replayed_unit_commit_reverts_and_a_failing_multicall_call_undoes_the_others(world: Any) -> None:
    """UnitCommit has no nonce: replay protection is the unit's state (one commit per provider)."""
    client = world.client
    unit_id = world.assign(world.post_order())
    commits, _ = world.signed_commits(unit_id, [os.urandom(32)])
    batch = client.commit_batch_calldata(unit_id, commits)
    with pytest.raises(errors.AlreadyCommitted) as caught:
        client.multicall([batch, batch], sender=world.outsider)
    assert caught.value.arguments == {"unitId": unit_id, "provider": world.providers[0].address}
    assert client.get_unit(unit_id).committed_mask == 0

    client.commit_batch(unit_id, commits)
    with pytest.raises(errors.AlreadyCommitted):
        client.commit_batch(unit_id, commits)
    assert client.get_unit(unit_id).committed_mask == 0b001


def test_multicall_keeps_the_callers_role_checks(world: Any) -> None:
    client = world.client
    order_id = world.post_order()
    key, deadline = os.urandom(32), client.now() + 3600
    providers = world.providers[:3]
    accepts = [client.sign_accept(provider, order_id, key, deadline) for provider in providers]
    call = client.assign_calldata(order_id, key, providers, world.verifiers[:2], accepts)
    with pytest.raises(errors.AccessControlUnauthorizedAccount) as caught:
        client.multicall([call], sender=world.outsider)
    assert caught.value.arguments["account"] == world.outsider.address


def test_client_side_input_errors_for_batches(world: Any) -> None:
    client = world.client
    with pytest.raises(InvalidInput):
        client.multicall([])
    with pytest.raises(InvalidInput):
        client.market_calldata("noSuchFunction", 1)
    with pytest.raises(InvalidInput):
        client.reveal_batch_calldata(1, [Reveal(world.providers[0].address, b"short", os.urandom(32))])
