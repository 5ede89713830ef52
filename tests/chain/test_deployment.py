"""Deployments file: round trip, connecting by file, and refusing a node of another chain."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from veritrain.chain.backends import HardhatNode, InProcessBackend
from veritrain.chain.client import ChainClient
from veritrain.chain.deployment import AppealParams, Deployment, MarketParams
from veritrain.chain.errors import DeploymentError, WrongChainId

pytestmark = pytest.mark.chain


def test_deploy_writes_a_file_that_connects_back(tmp_path: Path) -> None:
    params = MarketParams(
        commit_window=120, min_verifiers=3, slash_amount=7, provider_collateral=9, withhold_penalty=5
    )
    appeals = AppealParams(appeal_window=60, vote_window=120, panel_size=5, verifier_slash=11)
    path = tmp_path / "deployments.json"
    with InProcessBackend(accounts=2) as backend:
        deployer = backend.dev_accounts(2)[0]
        client = ChainClient.deploy(
            backend, deployer, params=params, appeal_params=appeals, unbonding_period=99_999, save_to=path
        )
        raw = json.loads(path.read_text())
        assert raw["chainId"] == backend.chain_id
        assert raw["addresses"]["JobMarket"] == client.deployment.job_market
        assert raw["addresses"]["VerdictAppeals"] == client.deployment.verdict_appeals
        assert raw["params"]["commitWindow"] == 120 and raw["params"]["unbondingPeriod"] == 99_999
        assert raw["appealParams"]["panelSize"] == 5
        loaded = Deployment.load(path)
        assert loaded == client.deployment
        again = ChainClient.connect(backend, path)
        assert again.deployment == client.deployment
        on_chain = again.market.functions.params().call()
        assert tuple(on_chain) == params.as_tuple()
        assert tuple(again.appeals.functions.params().call()) == appeals.as_tuple()
        assert again.appeals.functions.market().call() == client.deployment.job_market


@pytest.mark.node_backend
def test_connecting_to_a_node_of_another_chain_raises_wrong_chain_id(
    tmp_path: Path, hardhat_node: HardhatNode
) -> None:
    path = tmp_path / "deployments.json"
    with InProcessBackend(accounts=1) as backend:
        ChainClient.deploy(backend, backend.dev_accounts(1)[0], save_to=path)
    with hardhat_node.backend() as rpc, pytest.raises(WrongChainId) as caught:
        ChainClient.connect(rpc, path)
    assert caught.value.actual == 31337 and caught.value.expected != 31337


def test_connecting_where_no_contract_is_deployed_raises(tmp_path: Path) -> None:
    path = tmp_path / "deployments.json"
    with InProcessBackend(accounts=1) as backend:
        ChainClient.deploy(backend, backend.dev_accounts(1)[0], save_to=path)
    with InProcessBackend(accounts=1) as fresh, pytest.raises(DeploymentError, match="no VeriToken contract"):
        ChainClient.connect(fresh, path)  # same chain id, empty chain


@pytest.mark.parametrize(
    "mutate",
    [
        lambda raw: raw.pop("addresses"),
        lambda raw: raw["addresses"].update(JobMarket="0x1234"),
        lambda raw: raw["addresses"].pop("VerdictAppeals"),
        lambda raw: raw.pop("appealParams"),
        lambda raw: raw["appealParams"].update(surprise=1),
        lambda raw: raw.update(chainId=-1),
        lambda raw: raw.update(format=99),
        lambda raw: raw["params"].update(surprise=1),
    ],
)
def test_malformed_deployments_file_is_a_typed_error(tmp_path: Path, mutate: object) -> None:
    good = Deployment(
        chain_id=1,
        token="0x" + "11" * 20,
        stake_manager="0x" + "22" * 20,
        job_market="0x" + "33" * 20,
        block=5,
        deployer="0x" + "44" * 20,
        operator="0x" + "55" * 20,
        unbonding_period=10,
        params=MarketParams(),
        verdict_appeals="0x" + "66" * 20,
        appeal_params=AppealParams(panel_size=5),
    )
    raw = good.to_dict()
    assert Deployment.from_dict(json.loads(json.dumps(raw))) == good
    mutate(raw)  # type: ignore[operator]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(DeploymentError):
        Deployment.load(path)


def test_admin_roles_sit_behind_the_timelock_so_a_grant_waits_for_its_delay(tmp_path: Path) -> None:
    """Issue 8 finding 10: with `admin_delay` the deployer can no longer grant MARKET_ROLE (which may
    slash anyone) or OPERATOR_ROLE at once; a grant scheduled on the timelock lands after the delay."""
    from veritrain.chain.client import _calldata
    from veritrain.chain.errors import ContractReverted

    with InProcessBackend() as backend:
        deployer, attacker = backend.dev_accounts(2)
        client = ChainClient.deploy(backend, deployer, admin_delay=3600, save_to=tmp_path / "d.json")
        assert Deployment.load(tmp_path / "d.json").timelock == client.deployment.timelock != ""
        stake_role = client.stakes.functions.MARKET_ROLE().call()
        market_role = client.market.functions.OPERATOR_ROLE().call()
        for contract, role in ((client.stakes, stake_role), (client.market, market_role)):
            with pytest.raises(ContractReverted, match="AccessControlUnauthorizedAccount"):
                client._send(deployer, contract, "grantRole", role, attacker.address)
        timelock = client._bind("AdminTimelock", client.deployment.timelock)
        call = _calldata(client.stakes, "grantRole", stake_role, attacker.address)
        operation = (client.stakes.address, 0, call, b"\0" * 32, b"\0" * 32)
        client._send(deployer, timelock, "schedule", *operation, 3600)
        with pytest.raises(ContractReverted, match="TimelockUnexpectedOperationState"):
            client._send(deployer, timelock, "execute", *operation)
        client.advance_time(3600)
        client._send(deployer, timelock, "execute", *operation)
        assert client.stakes.functions.hasRole(stake_role, attacker.address).call()
