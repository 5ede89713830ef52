"""ChainClient end to end on both backends: happy flow, verifier path, expiry and every signed form."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from veritrain.chain import errors
from veritrain.chain.backends import RpcBackend
from veritrain.chain.client import GAS_LIMITS, AppealState, Outcome, UnitState

pytestmark = pytest.mark.chain

TOKEN = 10**18
PRICE = 10 * TOKEN
FEE = 3 * TOKEN
PARTY_FUNDS = 1_000 * TOKEN
VERIFIER_STAKE = 100 * TOKEN


def test_happy_flow_stake_post_assign_commit_reveal_finalize_withdraw(world: Any) -> None:
    client, buyer, providers = world.client, world.buyer, world.providers[:3]
    params = client.params

    newcomer = world.outsider
    client.stake(newcomer, 150 * TOKEN)
    assert client.stake_of(newcomer).bonded == 150 * TOKEN

    buyer_tokens = client.token_balance(buyer)
    escrow_before = client.total_escrow()
    order_id, receipt = client.post_order(buyer, os.urandom(32), 2, 3, PRICE, FEE, client.now() + 86_400)
    escrow = 2 * (3 * PRICE + FEE)
    assert receipt.event("OrderPosted").args["escrow"] == escrow
    assert client.token_balance(buyer) == buyer_tokens - escrow
    assert client.total_escrow() == escrow_before + escrow

    unit_key = os.urandom(32)
    deadline = client.now() + 3600
    accepts = [client.sign_accept(provider, order_id, unit_key, deadline) for provider in providers]
    unit_id, receipt = client.assign(order_id, unit_key, providers, world.verifiers[:2], accepts)
    assigned = receipt.event("UnitAssigned").args
    assert assigned["providers"] == [p.address for p in providers]
    assert client.get_unit(unit_id).state == UnitState.COMMITTING
    assert all(client.stake_of(p).locked == params.provider_collateral for p in providers)
    assert client.verifiers_of(unit_id) == [v.address for v in world.verifiers[:2]]

    digest = os.urandom(32)
    salts = [os.urandom(32) for _ in providers]
    # Provider 0 commits itself; the other two sign and the relayer submits (gasless providers).
    client.commit(providers[0], unit_id, client.commitment(digest, salts[0], providers[0], unit_id))
    for provider, salt in zip(providers[1:], salts[1:], strict=True):
        commitment = client.commitment(digest, salt, provider, unit_id)
        signed = client.sign_commit(provider, unit_id, commitment, deadline)
        client.commit_with_sig(unit_id, provider, commitment, signed)
    assert client.get_unit(unit_id).state == UnitState.REVEALING

    for provider, salt in zip(providers, salts, strict=True):
        client.reveal(unit_id, provider, digest, salt)
    replica = client.replica(unit_id, 2)
    assert replica.revealed and replica.commitment_or_digest == digest

    receipt = client.finalize(unit_id)
    assert receipt.event("UnitFinalized").args == {"unitId": unit_id, "resultDigest": digest}
    unit = client.get_unit(unit_id)
    assert unit.state == UnitState.FINALIZED and unit.revealed_mask == 0b111
    order = client.get_order(order_id)
    assert (order.delivered, order.open_units) == (1, 0)
    assert order.balance == escrow - 3 * PRICE  # the unused verifier fee went back to the order
    for provider in providers:
        assert client.credits(provider) == PRICE
        assert client.stake_of(provider).locked == 0
        assert client.reputation(provider).valid == 1
        assert client.reputation(provider).consecutive_valid == 1

    tokens_before = [client.token_balance(p) for p in providers]
    for provider, before in zip(providers, tokens_before, strict=True):
        receipt = client.withdraw_credit(provider)
        assert receipt.event("CreditWithdrawn").args["amount"] == PRICE
        assert client.token_balance(provider) == before + PRICE
        assert client.credits(provider) == 0
    assert client.total_credits() == 0


def test_verifier_path_holds_fraud_until_the_verdict_stands_then_slashes_and_pays_bounty(world: Any) -> None:
    """Truth before money: the fraud verdict pays the honest replicas and the fee, but holds the cheat
    (collateral locked, stake whole, no bounty) until its appeal window passed; then anyone's
    settle_verdict slashes it and pays the verdict's signers the bounty, once."""
    client, relayer = world.client, world.outsider
    order_id = world.post_order()
    unit_id = world.assign(order_id)
    honest, other = os.urandom(32), os.urandom(32)
    digests = [honest, honest, other]
    salts = world.commit_all(unit_id, digests)
    world.reveal_all(unit_id, digests, salts)

    cheater = world.providers[2]
    bonded_before = client.stake_of(cheater).bonded
    outcomes = [Outcome.ACCEPT, Outcome.ACCEPT, Outcome.FRAUD]
    deadline = client.now() + 3600
    signers = world.verifiers[:2]
    verdicts = [client.sign_verdict(v, unit_id, outcomes, deadline) for v in signers]
    start = client.w3.eth.block_number + 1
    receipt = client.submit_verdict(unit_id, outcomes, verdicts)

    assert receipt.events_named("ReplicaSlashed") == []
    assert receipt.event("FraudHeld").args == {"unitId": unit_id, "replicaMask": 0b100}
    assert receipt.event("VerdictRecorded").args["outcomes"] == [0, 0, 2]
    assert client.get_unit(unit_id).state == UnitState.VERDICTED
    held = client.stake_of(cheater)
    assert (held.bonded, held.locked) == (bonded_before, client.params.provider_collateral)
    # the accusation counts at once (matching declines the accused); an acquittal would take it back
    assert client.reputation(cheater).fraud == 1 and client.reputation(cheater).consecutive_valid == 0
    fee_share = FEE // 2
    assert [client.credits(v) for v in signers] == [fee_share, fee_share]
    assert client.credits(world.buyer) == FEE - 2 * fee_share
    assert client.credits(world.providers[0]) == PRICE
    with pytest.raises(errors.TruthNotFixed):
        client.check_settle_verdict(unit_id, outcomes)
    with pytest.raises(errors.TruthNotFixed):
        client.settle_verdict(unit_id, outcomes, sender=relayer)

    appeal_closes = client.get_unit(unit_id).verdict_deadline + client.deployment.appeal_params.appeal_window
    client.advance_time(appeal_closes - client.now() + 1)
    with pytest.raises(errors.OutcomesMismatch):
        client.check_settle_verdict(unit_id, [Outcome.ACCEPT] * 3)
    client.check_settle_verdict(unit_id, outcomes)  # free, and changes nothing
    assert client.stake_of(cheater).locked == client.params.provider_collateral
    receipt = client.settle_verdict(unit_id, outcomes, sender=relayer)
    slash = client.params.slash_amount
    assert receipt.event("ReplicaSlashed").args == {
        "unitId": unit_id,
        "provider": cheater.address,
        "amount": slash,
    }
    assert receipt.event("HeldSettled").args == {"unitId": unit_id, "truth": [0, 0, 2]}
    assert receipt.gas_used < GAS_LIMITS["settleVerdict"] // 2
    settled = client.stake_of(cheater)
    assert (settled.bonded, settled.locked) == (bonded_before - slash, 0)
    assert client.reputation(cheater).fraud == 1
    bounty_share = slash * client.params.bounty_bps // 10_000 // 2
    assert [client.credits(v) for v in signers] == [fee_share + bounty_share] * 2
    # the cheat's price and the slash less the bounty go to the buyer
    assert client.credits(world.buyer) == FEE - 2 * fee_share + PRICE + slash - 2 * bounty_share
    assert client.credits(relayer) == 0  # the relay earns nothing: it only moves the truth's money
    names = [e.name for e in client.events(from_block=start) if e.args.get("unitId") == unit_id]
    assert names.index("FraudHeld") < names.index("VerdictRecorded") < names.index("HeldSettled")

    repeat = client.settle_verdict(unit_id, outcomes)  # nothing held any more: a no-op
    assert repeat.events == () and client.stake_of(cheater).bonded == bonded_before - slash


def test_expired_unit_returns_budget_and_order_closes_with_refund(world: Any) -> None:
    client = world.client
    order_id = world.post_order(units=1)
    unit_id = world.assign(order_id)
    unit = client.get_unit(unit_id)
    client.advance_time(unit.verdict_deadline - client.now() + 1)
    client.expire_unit(unit_id)
    assert client.get_unit(unit_id).state == UnitState.EXPIRED
    assert all(client.reputation(p).fault == 1 for p in world.providers[:3])
    assert all(client.stake_of(p).locked == 0 for p in world.providers[:3])

    tokens = client.token_balance(world.buyer)
    receipt = client.close_order(order_id, sender=world.buyer)
    assert receipt.event("OrderClosed").args["refund"] == 3 * PRICE + FEE
    # the close pays the refund: nothing is left to withdraw
    assert receipt.event("CreditWithdrawn").args["amount"] == 3 * PRICE + FEE
    assert client.token_balance(world.buyer) == tokens + 3 * PRICE + FEE
    assert client.credits(world.buyer) == 0
    assert client.get_order(order_id).closed


def test_signed_forms_relayed_by_someone_else(world: Any) -> None:
    client, relayer = world.client, world.deployer
    staker = world.outsider
    deadline = client.now() + 3600

    permit = client.sign_permit(staker, client.deployment.stake_manager, 40 * TOKEN, deadline)
    client.stake_with_permit(staker, 40 * TOKEN, permit, relayer=relayer)
    assert client.stake_of(staker).bonded == 40 * TOKEN

    signed = client.sign_request_unstake(staker, 15 * TOKEN, deadline)
    client.request_unstake_with_sig(staker, 15 * TOKEN, signed, relayer=relayer)
    position = client.stake_of(staker)
    assert (position.bonded, position.unbonding) == (25 * TOKEN, 15 * TOKEN)

    client.advance_time(client.deployment.unbonding_period + 1)
    tokens = client.token_balance(staker)
    signed = client.sign_withdraw_stake(staker, client.now() + 3600)
    client.withdraw_stake_with_sig(staker, signed, relayer=relayer)
    assert client.token_balance(staker) == tokens + 15 * TOKEN
    assert client.stake_of(staker).unbonding == 0

    order_id = world.post_order(units=1)
    unit_id = world.assign(order_id)
    digests = [b"\x07" * 32] * 3
    world.reveal_all(unit_id, digests, world.commit_all(unit_id, digests))
    with pytest.raises(errors.FinalizeReserved):  # the operator's, until the verdict deadline
        client.finalize(unit_id, sender=world.outsider)
    client.advance_time(client.get_unit(unit_id).verdict_deadline - client.now() + 1)
    client.finalize(unit_id, sender=world.outsider)
    provider = world.providers[0]
    tokens = client.token_balance(provider)
    signed = client.sign_withdraw_credit(provider, client.now() + 3600)
    client.withdraw_credit_with_sig(provider, signed, relayer=relayer)
    assert client.token_balance(provider) == tokens + PRICE


def test_plain_unstake_and_withdraw_after_thaw(world: Any) -> None:
    client, staker = world.client, world.verifiers[2]
    client.request_unstake(staker, 30 * TOKEN)
    thaw_at = client.stake_of(staker).thaw_at
    assert thaw_at >= client.now() + client.deployment.unbonding_period - 1
    client.advance_time(client.deployment.unbonding_period + 1)
    tokens = client.token_balance(staker)
    client.withdraw_stake(staker)
    assert client.token_balance(staker) == tokens + 30 * TOKEN


def test_concurrent_senders_share_one_nonce_counter_per_key(world: Any) -> None:
    client, sender = world.client, world.deployer
    errors: list[BaseException] = []

    def mint_some(index: int) -> None:
        try:
            for _ in range(3):
                client.mint(world.outsider, index + 1, owner=sender)
        except BaseException as err:  # collected and re-raised in the test thread
            errors.append(err)

    before = client.token_balance(world.outsider)
    threads = [threading.Thread(target=mint_some, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert client.token_balance(world.outsider) == before + 3 * (1 + 2 + 3 + 4)


def test_events_since_deployment_decode_in_chain_order(world: Any) -> None:
    client = world.client
    start = client.w3.eth.block_number + 1
    order_id = world.post_order(units=1)
    unit_id = world.assign(order_id)
    events = client.events(from_block=start)
    names = [event.name for event in events]
    assert names.index("OrderPosted") < names.index("UnitAssigned")
    assigned = next(event for event in events if event.name == "UnitAssigned")
    assert assigned.args["unitId"] == unit_id and assigned.args["orderId"] == order_id
    assert assigned.address == client.deployment.job_market
    assert assigned.block_number >= start and assigned.tx_hash.startswith("0x")
    assert all(event.block_number >= start for event in events)
    assert any(event.name == "OrderPosted" for event in client.events())  # default: since deployment


def test_batched_flow_commits_any_subset_in_any_order_and_reveal_batch_finalizes(world: Any) -> None:
    client = world.client
    order_id = world.post_order()
    unit_id = world.assign(order_id)
    digest = os.urandom(32)
    commits, reveals = world.signed_commits(unit_id, [digest] * 3)

    receipt = client.commit_batch(unit_id, [commits[2], commits[0]], relayer=world.outsider)
    committed = [event.args["provider"] for event in receipt.events_named("ReplicaCommitted")]
    assert committed == [world.providers[2].address, world.providers[0].address]
    unit = client.get_unit(unit_id)
    assert (unit.state, unit.committed_mask) == (UnitState.COMMITTING, 0b101)
    client.commit_batch(unit_id, [commits[1]])
    assert client.get_unit(unit_id).state == UnitState.REVEALING

    finalized, receipt = client.reveal_batch(unit_id, [reveals[1]])
    assert not finalized and receipt.events_named("UnitFinalized") == []
    assert client.get_unit(unit_id).revealed_mask == 0b010
    finalized, receipt = client.reveal_batch(unit_id, [reveals[2], reveals[0]], sender=world.deployer)
    assert finalized  # the deployer is the operator here: only its batch finalizes
    assert receipt.event("UnitFinalized").args == {"unitId": unit_id, "resultDigest": digest}
    unit = client.get_unit(unit_id)
    assert (unit.state, unit.revealed_mask) == (UnitState.FINALIZED, 0b111)
    assert all(client.replica(unit_id, i).commitment_or_digest == digest for i in range(3))
    for provider in world.providers[:3]:
        assert client.credits(provider) == PRICE
        assert client.stake_of(provider).locked == 0
        assert client.reputation(provider).valid == 1
    assert client.get_order(order_id).delivered == 1


def test_reveal_batch_with_differing_digests_leaves_the_unit_to_a_verdict(world: Any) -> None:
    client = world.client
    unit_id = world.assign(world.post_order())
    honest, other = os.urandom(32), os.urandom(32)
    commits, reveals = world.signed_commits(unit_id, [honest, honest, other])
    client.commit_batch(unit_id, commits)

    finalized, receipt = client.reveal_batch(unit_id, reveals)
    assert not finalized
    assert len(receipt.events_named("ReplicaRevealed")) == 3
    unit = client.get_unit(unit_id)
    assert (unit.state, unit.revealed_mask) == (UnitState.REVEALING, 0b111)
    assert client.replica(unit_id, 2).commitment_or_digest == other
    assert all(client.credits(provider) == 0 for provider in world.providers[:3])

    outcomes = [Outcome.ACCEPT, Outcome.ACCEPT, Outcome.FRAUD]
    deadline = client.now() + 3600
    verdicts = [client.sign_verdict(v, unit_id, outcomes, deadline) for v in world.verifiers[:2]]
    client.submit_verdict(unit_id, outcomes, verdicts)
    assert client.get_unit(unit_id).state == UnitState.VERDICTED
    # held until the unit's truth is fixed: collateral locked, the accusation counted
    assert client.stake_of(world.providers[2]).locked == client.params.provider_collateral
    assert client.reputation(world.providers[2]).fraud == 1


def test_reveal_batch_does_not_finalize_a_unit_drawn_for_verification(world: Any) -> None:
    client = world.client
    unit_id = world.assign(world.post_order())
    digest = os.urandom(32)
    commits, reveals = world.signed_commits(unit_id, [digest] * 3)
    client.commit_batch(unit_id, commits)
    client.request_verification(unit_id)
    finalized, _ = client.reveal_batch(unit_id, reveals)
    assert not finalized
    assert client.get_unit(unit_id).state == UnitState.REVEALING


def test_operator_multicall_pipelines_reveal_commit_and_assign_in_one_transaction(world: Any) -> None:
    client, operator = world.client, world.deployer
    order_id = world.post_order(units=3)
    digest_a, digest_b = os.urandom(32), os.urandom(32)
    unit_a = world.assign(order_id)
    commits_a, reveals_a = world.signed_commits(unit_a, [digest_a] * 3)
    client.commit_batch(unit_a, commits_a)
    unit_b = world.assign(order_id)
    commits_b, _ = world.signed_commits(unit_b, [digest_b] * 3)

    key_c = os.urandom(32)
    deadline = client.now() + 3600
    providers = world.providers[:3]
    accepts = [client.sign_accept(provider, order_id, key_c, deadline) for provider in providers]
    calls = [
        client.reveal_batch_calldata(unit_a, reveals_a),
        client.commit_batch_calldata(unit_b, commits_b),
        client.assign_calldata(order_id, key_c, providers, world.verifiers[:2], accepts),
    ]
    receipt = client.multicall(calls, sender=operator)

    assert receipt.event("UnitFinalized").args["unitId"] == unit_a
    assigned = receipt.event("UnitAssigned").args
    assert assigned["orderId"] == order_id and assigned["unitId"] == client.unit_count()
    assert client.get_unit(unit_a).state == UnitState.FINALIZED
    assert client.get_unit(unit_b).state == UnitState.REVEALING
    assert client.get_unit(assigned["unitId"]).state == UnitState.COMMITTING


def _disputed_unit(world: Any, verifiers: int = 3) -> int:
    """A 3-replica unit with `verifiers` assigned verifiers whose third replica revealed another digest."""
    client = world.client
    order_id = world.post_order()
    key, deadline = os.urandom(32), client.now() + 3600
    providers = world.providers[:3]
    accepts = [client.sign_accept(p, order_id, key, deadline) for p in providers]
    unit_id, _ = client.assign(order_id, key, providers, world.verifiers[:verifiers], accepts)
    honest = os.urandom(32)
    digests = [honest, honest, os.urandom(32)]
    world.reveal_all(unit_id, digests, world.commit_all(unit_id, digests))
    return unit_id


def test_one_providers_concurrent_acceptances_both_assign(world: Any) -> None:
    """Two Accepts signed before either is relayed (unordered nonces) both land, in reverse order."""
    client, providers = world.client, world.providers[:3]
    order_id = world.post_order(units=3)
    deadline = client.now() + 3600
    keys = [os.urandom(32), os.urandom(32)]
    signed = [[client.sign_accept(p, order_id, key, deadline) for p in providers] for key in keys]
    second, _ = client.assign(order_id, keys[1], providers, world.verifiers[:2], signed[1])
    first, _ = client.assign(order_id, keys[0], providers, world.verifiers[:2], signed[0])
    assert (second, first) == (client.unit_count() - 1, client.unit_count())
    with pytest.raises(errors.AcceptNonceUsed):
        client.assign(order_id, keys[0], providers, world.verifiers[:2], signed[0])


def test_verdict_needs_a_majority_of_the_assigned_verifiers(world: Any) -> None:
    """Two of three honest verifiers settle: outcome-only signatures agree whatever their reasons were."""
    client = world.client
    unit_id = _disputed_unit(world)
    outcomes = [Outcome.ACCEPT, Outcome.ACCEPT, Outcome.FAULT]
    deadline = client.now() + 3600
    v1, v2, _ = world.verifiers
    with pytest.raises(errors.QuorumNotReached) as caught:
        client.submit_verdict(unit_id, outcomes, [client.sign_verdict(v1, unit_id, outcomes, deadline)])
    assert caught.value.arguments == {"unitId": unit_id, "valid": 1, "required": 2}
    signed = [client.sign_verdict(v, unit_id, outcomes, deadline) for v in (v1, v2)]
    client.submit_verdict(unit_id, outcomes, signed)
    assert client.get_unit(unit_id).state == UnitState.VERDICTED


def test_verifier_collateral_is_locked_for_the_unit_and_released_at_settlement(world: Any) -> None:
    client = world.client
    collateral = client.params.verifier_collateral
    unit_id = _disputed_unit(world)
    verifier = world.verifiers[2]
    position = client.stake_of(verifier)
    assert position.locked == collateral
    with pytest.raises(errors.InsufficientFreeStake):
        client.request_unstake(verifier, position.bonded)
    outcomes = [Outcome.ACCEPT, Outcome.ACCEPT, Outcome.FAULT]
    deadline = client.now() + 3600
    client.submit_verdict(
        unit_id, outcomes, [client.sign_verdict(v, unit_id, outcomes, deadline) for v in world.verifiers[:2]]
    )
    assert all(client.stake_of(v).locked == 0 for v in world.verifiers)
    client.request_unstake(verifier, position.bonded)


def test_relays_see_the_appeal_window_close_while_no_block_is_mined(world: Any) -> None:
    """Regression (the demo's held fraud stayed held until its timeout): a chain that mines only on
    transactions keeps its latest block's time while nobody sends one, so a relay whose free read waited
    on TruthNotFixed at the latest block never saw the appeal window pass. The relays read the pending
    block, which a transaction sent now would be in."""
    if not isinstance(world.backend, RpcBackend):
        pytest.skip("the in-process EVM's clock moves only with a mined block")
    client = world.client
    unit_id = _disputed_unit(world)
    settled = [Outcome.ACCEPT, Outcome.ACCEPT, Outcome.FRAUD]
    deadline = client.now() + 3600
    client.submit_verdict(
        unit_id, settled, [client.sign_verdict(v, unit_id, settled, deadline) for v in world.verifiers[:2]]
    )
    appeal_closes = client.get_unit(unit_id).verdict_deadline + client.deployment.appeal_params.appeal_window
    world.backend._dev_call("evm_increaseTime", [appeal_closes - client.now() + 1])  # time, no block
    with pytest.raises(errors.TruthNotFixed):
        client.truth_of(unit_id)  # the latest block's time: still inside the window
    assert client.truth_of(unit_id, pending=True) == client.verdict_hash(unit_id)
    client.check_settle_verdict(unit_id, settled)  # would succeed: no TruthNotFixed
    assert client.settle_verdict(unit_id, settled).event("HeldSettled").args["unitId"] == unit_id


def test_a_verifier_whose_signature_contradicts_the_verdict_is_slashed(world: Any) -> None:
    """No appeal: once the appeal window passed the verdict is the truth, and a contradicting verifier's own
    signature slashes it (the reporter gets the bounty in tokens); before that nobody can be slashed."""
    client, reporter = world.client, world.outsider
    unit_id = _disputed_unit(world)
    settled = [Outcome.ACCEPT, Outcome.ACCEPT, Outcome.FRAUD]
    lazy = [Outcome.ACCEPT, Outcome.ACCEPT, Outcome.ACCEPT]
    deadline = client.now() + 3600
    v1, v2, v3 = world.verifiers
    evidence = client.sign_verdict(v3, unit_id, lazy, deadline)
    client.submit_verdict(
        unit_id, settled, [client.sign_verdict(v, unit_id, settled, deadline) for v in (v1, v2)]
    )
    with pytest.raises(errors.TruthNotFixed):
        client.slash_contradicting_verifier(unit_id, lazy, evidence)
    appeal_closes = client.get_unit(unit_id).verdict_deadline + client.deployment.appeal_params.appeal_window
    client.advance_time(appeal_closes - client.now() + 1)
    assert client.truth_of(unit_id) == client.verdict_hash(unit_id)
    with pytest.raises(errors.VerdictNotContradicted):
        client.slash_contradicting_verifier(
            unit_id, settled, client.sign_verdict(v1, unit_id, settled, deadline)
        )
    bonded = client.stake_of(v3).bonded
    slash = client.deployment.appeal_params.verifier_slash
    before = client.token_balance(reporter)
    receipt = client.slash_contradicting_verifier(unit_id, lazy, evidence, sender=reporter)
    assert receipt.event("VerifierSlashed").args["verifier"] == v3.address
    assert client.stake_of(v3).bonded == bonded - slash
    assert (
        client.token_balance(reporter) - before
        == slash * client.deployment.appeal_params.bounty_bps // 10_000
    )
    with pytest.raises(errors.VerifierAlreadySlashed):
        client.slash_contradicting_verifier(unit_id, lazy, evidence)


def test_a_colluding_verifier_majority_loses_on_appeal(world: Any) -> None:
    """Finding 4's attack through the client: two of three verifiers settle accept-all for a cheating
    replica; the honest minority appeals, a panel drawn from the referee pool re-decides, the cheat and
    both colluders are slashed and the appellant keeps every token."""
    client = world.client
    unit_id = _disputed_unit(world)
    truth = [Outcome.ACCEPT, Outcome.ACCEPT, Outcome.FRAUD]
    colluded = [Outcome.ACCEPT] * 3
    deadline = client.now() + 3600
    honest, *colluders = world.verifiers
    signatures = [client.sign_verdict(v, unit_id, colluded, deadline) for v in colluders]
    client.submit_verdict(unit_id, colluded, signatures)
    referees = list(world.backend.dev_accounts(13)[10:13])
    for referee in referees:
        client.mint(referee, PARTY_FUNDS)
        client.approve(referee, client.deployment.stake_manager, 2**256 - 1)
        client.stake(referee, VERIFIER_STAKE)
        client.join_referee_pool(referee)
        assert client.in_referee_pool(referee)
    cheat = client.replica(unit_id, 2).provider
    cheat_bonded, honest_bonded = client.stake_of(cheat).bonded, client.stake_of(honest).bonded
    with pytest.raises(errors.TruthNotFixed):
        client.slash_contradicting_verifier(
            unit_id, truth, client.sign_verdict(honest, unit_id, truth, deadline)
        )

    client.appeal(unit_id, honest)
    with pytest.raises(errors.AlreadyAppealed):
        client.appeal(unit_id, world.outsider)
    client.draw_panel(unit_id)
    appeal = client.get_appeal(unit_id)
    assert appeal.state == AppealState.PENDING and sorted(appeal.panel) == sorted(r.address for r in referees)
    by_address = {r.address: r for r in referees}
    decided = None
    for seat in appeal.panel[:2]:
        receipt = client.vote(
            unit_id, truth, client.sign_referee_vote(by_address[seat], unit_id, truth, deadline)
        )
        decided = receipt.events_named("AppealDecided") or decided
    assert decided and decided[0].args["overturned"] is True
    with pytest.raises(errors.AlreadyDecided):
        client.vote(
            unit_id, truth, client.sign_referee_vote(by_address[appeal.panel[2]], unit_id, truth, deadline)
        )
    client.resolve_appeal(unit_id, colluded, truth)
    assert client.get_appeal(unit_id).state == AppealState.OVERTURNED
    assert client.stake_of(cheat).bonded == cheat_bonded - client.params.slash_amount
    for colluder, signed in zip(colluders, signatures, strict=True):
        bonded = client.stake_of(colluder).bonded
        client.slash_contradicting_verifier(unit_id, colluded, signed)
        assert client.stake_of(colluder).bonded == bonded - client.deployment.appeal_params.verifier_slash
    with pytest.raises(errors.VerdictNotContradicted):
        client.slash_contradicting_verifier(
            unit_id, truth, client.sign_verdict(honest, unit_id, truth, deadline)
        )
    assert client.stake_of(honest).bonded == honest_bonded and client.stake_of(honest).locked == 0
