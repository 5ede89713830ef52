"""`veritrain chain deploy` on a real hardhat node: the deployments file, and a wrong chain refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.cli import main
from veritrain import keys
from veritrain.chain.backends import HardhatNode, RpcBackend, dev_accounts
from veritrain.chain.client import ChainClient

pytestmark = [pytest.mark.node_backend, pytest.mark.chain]


@pytest.fixture(scope="module")
def node() -> Iterator[HardhatNode]:
    with HardhatNode() as started:
        yield started


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keys, "_unlocked", {})
    monkeypatch.setenv("VERITRAIN_KEYSTORE_PASSWORD", "pw")
    for name in (
        "VERITRAIN_CONFIG",
        "VERITRAIN_CHAIN_ID",
        "VERITRAIN_KEYSTORE",
        "VERITRAIN_DEPLOYMENTS_FILE",
    ):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


def test_deploy_with_a_keystore_writes_a_usable_deployments_file(
    node: HardhatNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deployer, operator = dev_accounts(3)[1:3]
    entry = keys.import_key(tmp_path / "ks", "deployer", bytes(deployer.key), "pw", light=True)
    out = tmp_path / "deployments.json"
    argv = ["chain", "deploy", "--rpc-url", node.url, "--keystore", str(entry.path), "--out", str(out)]
    code = main([*argv, "--operator", operator.address, "--json"])
    assert code == 0, capsys.readouterr().err
    printed = json.loads(capsys.readouterr().out)
    assert printed["deployer"] == deployer.address and printed["operator"] == operator.address
    client = ChainClient.connect(RpcBackend(node.url), out)  # contracts are there, chain id matches
    assert (
        client.deployment.chain_id == 31337
        and client.deployment.job_market == printed["addresses"]["JobMarket"]
    )
    assert client.deployment.timelock == printed["addresses"]["AdminTimelock"]  # admin behind the delay
    # a second deploy must not silently replace the file the market and agents use
    assert main([*argv]) == 2
    assert "--force replaces it" in capsys.readouterr().err
    assert json.loads(out.read_text())["addresses"] == printed["addresses"]
    # ... but an idempotent deployment step (deploy/compose.yaml) keeps a live one and succeeds
    assert main([*argv, "--keep-existing", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["addresses"] == printed["addresses"]


def test_chain_id_mismatch_is_refused_before_anything_is_sent(
    node: HardhatNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    backend = RpcBackend(node.url)
    block = backend.w3.eth.block_number
    out = tmp_path / "deployments.json"
    code = main(["chain", "deploy", "--rpc-url", node.url, "--chain-id", "1", "--out", str(out)])
    assert code == 2
    assert "WrongChainId: chain id 31337 where 1 was expected" in capsys.readouterr().err
    assert not out.exists() and backend.w3.eth.block_number == block


def test_hardhat_defaults_to_the_dev_account_elsewhere_a_keystore_is_required(
    node: HardhatNode, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "d.json"
    assert main(["chain", "deploy", "--rpc-url", node.url, "--out", str(out)]) == 0
    assert json.loads(out.read_text())["deployer"] == dev_accounts(1)[0].address
    capsys.readouterr()
    monkeypatch.setattr("apps.chain_deploy.HARDHAT_CHAIN_ID", 5)  # pretend this node is not a dev chain
    assert main(["chain", "deploy", "--rpc-url", node.url, "--out", str(tmp_path / "e.json")]) == 2
    assert "give --keystore" in capsys.readouterr().err
