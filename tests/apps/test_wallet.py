"""`veritrain wallet status|withdraw|unstake|release` on a hardhat node: what a key holds, and getting its
credit and stake out without writing Python. Each refusal the contract would make (nothing to withdraw,
stake locked as collateral, not thawed yet) is a typed error, exit code 2, with no transaction sent."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from eth_account.signers.local import LocalAccount

from apps.cli import main
from veritrain import keys
from veritrain.chain.backends import HardhatNode, RpcBackend, dev_accounts
from veritrain.chain.client import ChainClient
from veritrain.chain.deployment import MarketParams

pytestmark = [pytest.mark.node_backend, pytest.mark.chain]

TOKEN = 10**18
STAKE = 300 * TOKEN  # above one unit's collateral (100 VERI by default): some of it stays free


@dataclass
class Chain:
    node: HardhatNode
    client: ChainClient
    deployments: Path
    keystores: Path
    provider: LocalAccount
    buyer: LocalAccount


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chain]:
    """A provider with STAKE bonded, one unit's collateral of it locked; a buyer with 2 VERI of credit (a
    unit it worked, finalized)."""
    folder = tmp_path_factory.mktemp("wallet")
    with HardhatNode() as node:
        accounts = dev_accounts(9)
        deployer, provider, buyer, verifiers = accounts[0], accounts[5], accounts[6], accounts[7:9]
        deployments = folder / "deployments.json"
        params = MarketParams(solo_spot_check_ppm=0, probation_streak=0)
        client = ChainClient.deploy(RpcBackend(node.url), deployer, params=params, save_to=deployments)
        for party in (provider, buyer, *verifiers):
            client.mint(party, 1_000 * TOKEN)
        for party in (provider, *verifiers):
            client.approve(party, client.deployment.stake_manager, STAKE)
            client.stake(party, STAKE)
        client.approve(buyer, client.deployment.job_market, 100 * TOKEN)
        deadline = client.now() + 86_400
        order, _ = client.post_order(buyer, os.urandom(32), 1, 1, TOKEN, TOKEN, deadline)
        key = os.urandom(32)
        accept = client.sign_accept(provider, order, key, deadline)
        client.assign(order, key, [provider], verifiers, [accept])  # locks the provider's collateral
        # a credit for the buyer to withdraw (a close pays its refund directly): 2 VERI earned working a
        # one-replica unit of the deployer's order, finalized
        client.mint(deployer, 100 * TOKEN)
        client.approve(deployer, client.deployment.job_market, 100 * TOKEN)
        client.approve(buyer, client.deployment.stake_manager, STAKE)
        client.stake(buyer, STAKE)
        paid, _ = client.post_order(deployer, os.urandom(32), 1, 1, 2 * TOKEN, TOKEN, deadline)
        key = os.urandom(32)
        accept = client.sign_accept(buyer, paid, key, deadline)
        unit, _ = client.assign(paid, key, [buyer], verifiers, [accept])
        digest, salt = os.urandom(32), os.urandom(32)
        commitment = client.commitment(digest, salt, buyer.address, unit)
        client.commit_with_sig(unit, buyer, commitment, client.sign_commit(buyer, unit, commitment, deadline))
        client.advance_time(1)
        client.reveal(unit, buyer, digest, salt)
        client.finalize(unit)  # no solo spot check, no probation (params): never drawn
        for name, party in (("provider", provider), ("buyer", buyer)):
            keys.import_key(folder / "ks", name, bytes(party.key), "pw", light=True)
        yield Chain(node, client, deployments, folder / "ks", provider, buyer)


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(keys, "_unlocked", {})
    monkeypatch.setenv("VERITRAIN_KEYSTORE_PASSWORD", "pw")
    monkeypatch.setenv("VERITRAIN_DATA_DIR", str(tmp_path))


def wallet(chain: Chain, command: str, who: str, *extra: str) -> int:
    keystore = chain.keystores / f"{who}.json"
    argv = ["wallet", command, *extra, "--keystore", str(keystore), "--rpc-url", chain.node.url]
    return main([*argv, "--deployments", str(chain.deployments), "--json"])


def nonce(chain: Chain, account: LocalAccount) -> int:
    return int(chain.client.w3.eth.get_transaction_count(account.address))


def test_status_shows_what_a_key_holds(chain: Chain, capsys: pytest.CaptureFixture[str]) -> None:
    assert wallet(chain, "status", "provider") == 0
    held = json.loads(capsys.readouterr().out)
    collateral = chain.client.params.provider_collateral
    assert held["address"] == chain.provider.address
    assert (held["bonded"], held["locked"], held["free"]) == (STAKE, collateral, STAKE - collateral)
    assert held["credit"] == 0 and held["unbonding"] == 0 and held["free"] > 0
    assert held["wallet"] == 1_000 * TOKEN - STAKE and held["reputation"]["fraud"] == 0
    assert main(["wallet", "status", "0x1234", "--rpc-url", chain.node.url]) == 2
    assert "not an address" in capsys.readouterr().err


def test_credit_is_withdrawn_once_and_an_empty_credit_is_refused(
    chain: Chain, capsys: pytest.CaptureFixture[str]
) -> None:
    wallet_before = chain.client.token_balance(chain.buyer)
    assert wallet(chain, "withdraw", "buyer") == 0
    result = json.loads(capsys.readouterr().out)
    assert result["withdrawn"] == 2 * TOKEN and result["wallet"] == wallet_before + 2 * TOKEN
    sent = nonce(chain, chain.buyer)
    assert wallet(chain, "withdraw", "buyer") == 2
    assert "no credit on the JobMarket to withdraw" in capsys.readouterr().err
    assert nonce(chain, chain.buyer) == sent


def test_free_stake_unbonds_and_is_released_once_thawed_and_locked_stake_stays(
    chain: Chain, capsys: pytest.CaptureFixture[str]
) -> None:
    client, provider = chain.client, chain.provider
    free = client.stake_of(provider).free
    sent = nonce(chain, provider)
    for extra, error in (
        (("--amount", str(free + 1)), "locked as collateral of open units"),
        (("--amount", "0"), "--amount must be positive"),
    ):
        assert wallet(chain, "unstake", "provider", *extra) == 2
        assert error in capsys.readouterr().err
    assert wallet(chain, "release", "provider") == 2
    assert "no unbonding stake" in capsys.readouterr().err
    assert nonce(chain, provider) == sent and client.stake_of(provider).free == free

    assert wallet(chain, "unstake", "provider", "--all") == 0
    result = json.loads(capsys.readouterr().out)
    position = client.stake_of(provider)
    assert result["unstaked"] == free == position.unbonding and position.free == 0
    assert position.locked == client.params.provider_collateral  # the open unit's collateral stays
    sent = nonce(chain, provider)
    assert wallet(chain, "release", "provider") == 2
    assert "thaws at" in capsys.readouterr().err and nonce(chain, provider) == sent

    client.advance_time(position.thaw_at - client.pending_time() + 1)
    wallet_before = client.token_balance(provider)
    assert wallet(chain, "release", "provider") == 0
    assert json.loads(capsys.readouterr().out)["released"] == free
    assert client.token_balance(provider) == wallet_before + free
    assert client.stake_of(provider).unbonding == 0
