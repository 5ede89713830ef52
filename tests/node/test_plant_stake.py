"""The plant runner's recovery step (node/plant.py `recover_stakes`) on a hardhat node: what the slash left
of a caught plant key's stake is unbonded once free and released into the key's wallet once thawed, by
the key's own transactions; a refusal (collateral still locked, not thawed, not caught) sends nothing, and
a failed transaction is logged without stopping the pass."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount

from node.plant import plant_keys, recover_stakes
from veritrain import keys
from veritrain.chain.backends import HardhatNode, RpcBackend, dev_accounts
from veritrain.chain.client import ChainClient, Outcome
from veritrain.wallet import veri

pytestmark = [pytest.mark.node_backend, pytest.mark.chain]

TOKEN = 10**18
FRAUD = [Outcome.FRAUD]


@dataclass
class Chain:
    client: ChainClient
    deployer: LocalAccount
    buyer: LocalAccount
    verifiers: list[LocalAccount]


@pytest.fixture(scope="module")
def chain() -> Iterator[Chain]:
    with HardhatNode() as node:
        deployer, buyer, *verifiers = dev_accounts(4)
        client = ChainClient.deploy(RpcBackend(node.url), deployer)
        client.mint(buyer, 1_000 * TOKEN)
        client.approve(buyer, client.deployment.job_market, 2**256 - 1)
        for verifier in verifiers:
            client.mint(verifier, 100 * TOKEN)
            client.approve(verifier, client.deployment.stake_manager, 100 * TOKEN)
            client.stake(verifier, 100 * TOKEN)
        yield Chain(client, deployer, buyer, verifiers)


@pytest.fixture(autouse=True)
def _passphrase(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keys, "_unlocked", {})
    monkeypatch.setenv("PLANT_PASSPHRASE", "pw")


def plant(chain: Chain, folder: Path, name: str, stake: int, *, ether: bool = True) -> LocalAccount:
    """A fresh key in `folder`, staked by a relayed permit: it has sent no transaction of its own."""
    client, key = chain.client, Account.create()
    keys.import_key(folder, name, bytes(key.key), "pw", light=True)
    client.mint(key, stake)
    permit = client.sign_permit(key, client.deployment.stake_manager, stake, client.deadline(600))
    client.stake_with_permit(key.address, stake, permit)
    if ether:
        client.send_ether(chain.deployer, key, TOKEN)
    return key


def catch(chain: Chain, key: LocalAccount) -> int:
    """Plant a one-replica unit on `key`, have it reveal a result and the verifiers call it fraud (held:
    the collateral stays locked until the appeal window passed). Everything relayed; returns the unit."""
    client = chain.client
    deadline = client.now() + 3600
    order, _ = client.post_order(chain.buyer, os.urandom(32), 1, 1, TOKEN, TOKEN, deadline)
    unit_key = os.urandom(32)
    accept = client.sign_accept(key, order, unit_key, deadline)
    unit, _ = client.assign(order, unit_key, [key], chain.verifiers, [accept])
    digest, salt = os.urandom(32), os.urandom(32)
    commitment = client.commitment(digest, salt, key, unit)
    client.commit_with_sig(unit, key, commitment, client.sign_commit(key, unit, commitment, deadline))
    client.reveal(unit, key, digest, salt)
    verdicts = [client.sign_verdict(v, unit, FRAUD, deadline) for v in chain.verifiers]
    client.submit_verdict(unit, FRAUD, verdicts)
    assert client.reputation(key).fraud == 1
    return unit


def nonce(chain: Chain, key: LocalAccount) -> int:
    return int(chain.client.w3.eth.get_transaction_count(key.address))


def test_a_caught_key_s_stake_is_unbonded_once_its_collateral_is_free_and_released_once_thawed(
    chain: Chain, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    client = chain.client
    collateral, slash = client.params.provider_collateral, client.params.slash_amount
    caught = plant(chain, tmp_path, "plant-a", collateral)  # all of it locked by its one unit
    fresh = plant(chain, tmp_path, "plant-b", 300 * TOKEN)
    unit = catch(chain, caught)

    def recover() -> None:
        recover_stakes(client, plant_keys(tmp_path, "PLANT_PASSPHRASE"))

    recover()  # the held fraud keeps the whole stake locked: nothing free, nothing unbonding
    assert client.stake_of(caught).locked == collateral and client.stake_of(caught).free == 0
    assert nonce(chain, caught) == 0

    verdict_deadline = client.get_unit(unit).verdict_deadline
    client.advance_time(verdict_deadline + client.deployment.appeal_params.appeal_window - client.now() + 1)
    client.settle_verdict(unit, FRAUD)  # the slash: the rest of the collateral is free
    left = collateral - slash
    caplog.set_level(logging.INFO, logger="veritrain.node.plant")
    recover()
    position = client.stake_of(caught)
    assert (position.bonded, position.unbonding) == (0, left) and nonce(chain, caught) == 1
    assert f"unbonding {veri(left)} of caught plant key {caught.address}" in caplog.text

    recover()  # not thawed yet: nothing sent
    assert nonce(chain, caught) == 1 and client.stake_of(caught).unbonding == left

    client.advance_time(position.thaw_at - client.pending_time() + 1)
    wallet = client.token_balance(caught)
    recover()
    assert client.token_balance(caught) == wallet + left and client.stake_of(caught).unbonding == 0
    assert nonce(chain, caught) == 2
    assert f"released {veri(left)} into the wallet of caught plant key {caught.address}" in caplog.text
    recover()  # nothing left: nothing sent
    assert nonce(chain, caught) == 2
    assert nonce(chain, fresh) == 0 and client.stake_of(fresh).bonded == 300 * TOKEN  # never caught


def test_a_failed_recovery_is_logged_and_the_next_caught_key_still_recovers(
    chain: Chain, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    client = chain.client
    stake = 300 * TOKEN
    broke = plant(chain, tmp_path, "plant-a", stake, ether=False)  # cannot pay for its transaction
    funded = plant(chain, tmp_path, "plant-b", stake)
    for key in (broke, funded):
        catch(chain, key)
    free = stake - client.params.provider_collateral

    recover_stakes(client, plant_keys(tmp_path, "PLANT_PASSPHRASE"))
    assert f"recovering the stake of caught plant key {broke.address} failed" in caplog.text
    assert client.stake_of(broke).free == free and client.stake_of(broke).unbonding == 0
    assert client.stake_of(funded).unbonding == free and client.stake_of(funded).free == 0


def test_thawed_stake_is_released_before_the_newly_freed_stake_restarts_the_thaw(
    chain: Chain, tmp_path: Path
) -> None:
    """Free stake beyond the collateral unbonds at once; the collateral's remainder only after the slash,
    by which time the first part may have thawed: released first, since a new request resets `thaw_at`."""
    client = chain.client
    stake, collateral = 300 * TOKEN, client.params.provider_collateral
    key = plant(chain, tmp_path, "plant-a", stake)
    unit = catch(chain, key)
    recover_stakes(client, plant_keys(tmp_path, "PLANT_PASSPHRASE"))
    assert client.stake_of(key).unbonding == stake - collateral

    client.advance_time(client.stake_of(key).thaw_at - client.pending_time() + 1)
    client.settle_verdict(unit, FRAUD)  # long past the appeal window now
    wallet = client.token_balance(key)
    recover_stakes(client, plant_keys(tmp_path, "PLANT_PASSPHRASE"))
    assert client.token_balance(key) == wallet + stake - collateral
    assert client.stake_of(key).unbonding == collateral - client.params.slash_amount
