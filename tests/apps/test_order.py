"""`veritrain order post` refuses bad input before anything is signed: a malformed file, an unknown field or
recipe, a past deadline, a balance short of the escrow, a node or deployments file of another chain. Each
refusal is a typed error, exit code 2, and the chain has not moved (no block, no nonce, no allowance).

The happy path (post, watch, fetch, close against a running market) is tests/e2e/test_guides.py."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from apps.buyer import parse_amount, spec_from_table
from apps.cli import main
from veritrain import keys
from veritrain.chain.backends import HardhatNode, RpcBackend, dev_accounts
from veritrain.chain.client import ChainClient
from veritrain.errors import InvalidOrderSpec

pytestmark = [pytest.mark.node_backend, pytest.mark.chain]

TOKEN = 10**18
GOOD = """
recipe = "charlm-tiny"
total_steps = 16
unit_steps = 8
replicas = 1
seed = 7
max_price_per_pflop = "10 VERI"
verifier_fee_per_unit = "1 VERI"
deadline_in = "2h"
"""


@dataclass
class Chain:
    node: HardhatNode
    client: ChainClient
    deployments: Path
    keystore: Path
    buyer: str


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chain]:
    folder = tmp_path_factory.mktemp("order")
    with HardhatNode() as node:
        deployer, buyer = dev_accounts(6)[0], dev_accounts(6)[5]
        deployments = folder / "deployments.json"
        client = ChainClient.deploy(RpcBackend(node.url), deployer, save_to=deployments)
        client.mint(buyer, 3 * TOKEN)  # enough for GOOD (about 1 VERI), not for a big order
        entry = keys.import_key(folder / "ks", "buyer", bytes(buyer.key), "pw", light=True)
        yield Chain(node, client, deployments, entry.path, buyer.address)


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(keys, "_unlocked", {})
    monkeypatch.setenv("VERITRAIN_KEYSTORE_PASSWORD", "pw")
    monkeypatch.setenv("VERITRAIN_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("VERITRAIN_CONFIG", "")
    monkeypatch.delenv("VERITRAIN_CONFIG")
    # no market listens here: a refusal that got as far as the market would be a connection error instead
    monkeypatch.setenv("VERITRAIN_MARKET_URL", "http://127.0.0.1:9")


def post(chain: Chain, tmp_path: Path, text: str, *extra: str, deployments: Path | None = None) -> int:
    spec = tmp_path / "order.toml"
    spec.write_text(text)
    argv = [
        "order",
        "post",
        str(spec),
        "--yes",
        "--keystore",
        str(chain.keystore),
        "--rpc-url",
        chain.node.url,
    ]
    return main([*argv, "--deployments", str(deployments or chain.deployments), *extra])


def chain_state(chain: Chain) -> tuple[int, int, int]:
    w3 = chain.client.w3
    job_market = chain.client.deployment.job_market
    return (
        int(w3.eth.block_number),
        int(w3.eth.get_transaction_count(chain.buyer)),
        chain.client.allowance(chain.buyer, job_market),
    )


@pytest.mark.parametrize(
    ("text", "extra", "error"),
    [
        ("recipe = 'charlm-tiny\ntotal_steps = 16", (), "InvalidOrderSpec: order file"),
        (GOOD + "colour = 'blue'\n", (), "InvalidOrderSpec: invalid order: colour: Extra inputs"),
        (GOOD.replace("charlm-tiny", "my-own-model"), (), "UnknownRecipe: unknown recipe 'my-own-model'"),
        (
            GOOD.replace('deadline_in = "2h"', "deadline = 2001-01-01T00:00:00Z"),
            (),
            "InvalidOrderSpec: deadline",
        ),
        (GOOD.replace("total_steps = 16", "total_steps = 12"), (), "not a multiple of unit_steps"),
        (
            GOOD.replace("replicas = 1", "replicas = 'auto'\nmax_replicas = 6"),
            (),
            "InvalidOrderSpec: invalid order: replicas: Input should be less than or equal to 5",
        ),
        (GOOD + "max_replicas = 3\n", (), "InvalidOrderSpec: max_replicas goes with replicas = 'auto'"),
        (GOOD.replace('"10 VERI"', '"100000 VERI"'), (), "UnderfundedOrder: the escrow is"),
        (GOOD, ("--chain-id", "1"), "WrongChainId: chain id 31337 where 1 was expected"),
        (
            GOOD.replace("replicas = 1", "replicas = 'auto'\nshards = 2\nouter_step = 'folded'"),
            ("--settlement", "rounds"),
            "InvalidOrderSpec: settlement 'rounds' needs fixed replication, not adaptive",
        ),
    ],
    ids=[
        "malformed",
        "unknown-field",
        "unknown-recipe",
        "past-deadline",
        "steps",
        "auto-bounds",
        "max-without-auto",
        "underfunded",
        "chain-id",
        "rounds-adaptive",
    ],
)
def test_bad_orders_are_refused_before_anything_is_signed(
    chain: Chain,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    text: str,
    extra: tuple[str, ...],
    error: str,
) -> None:
    before = chain_state(chain)
    assert post(chain, tmp_path, text, *extra) == 2
    assert error in capsys.readouterr().err
    assert chain_state(chain) == before


def test_a_deployments_file_of_another_chain_is_refused(
    chain: Chain, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = json.loads(chain.deployments.read_text())
    other["chainId"] = 5
    elsewhere = tmp_path / "other.json"
    elsewhere.write_text(json.dumps(other))
    before = chain_state(chain)
    assert post(chain, tmp_path, GOOD, deployments=elsewhere) == 2
    assert "WrongChainId" in capsys.readouterr().err
    assert chain_state(chain) == before


def test_a_good_order_reaches_the_market_only_after_every_check(
    chain: Chain, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The checks pass, then the market is asked for its chain id (none listens here): still nothing sent."""
    before = chain_state(chain)
    assert post(chain, tmp_path, GOOD) == 2
    assert "MarketError: market at http://127.0.0.1:9 unreachable" in capsys.readouterr().err
    assert chain_state(chain) == before


@pytest.mark.parametrize(
    ("market_chain", "error"),
    [
        (5, "WrongChainId: chain id 5 where 31337 was expected (market at"),
        (31337, "InvalidInput: not confirmed: run in a terminal to answer, or pass --yes"),
    ],
    ids=["market-on-another-chain", "not-confirmed"],
)
def test_the_market_is_checked_then_the_buyer_must_confirm(
    chain: Chain,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    market_chain: int,
    error: str,
) -> None:
    """A real `veritrain market serve`: on another chain the buyer stops; on this one, without --yes and
    without a terminal to answer the question, it stops too. Either way before signing."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERITRAIN_")}
    env |= {"VERITRAIN_DATA_DIR": str(tmp_path / "market"), "VERITRAIN_CHAIN_ID": str(market_chain)}
    argv = [sys.executable, "-m", "apps", "market", "serve", "--port", str(port), "--log-level", "warning"]
    with open(tmp_path / "serve.log", "w") as log:
        market = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not _answers(f"http://127.0.0.1:{port}/health"):  # readiness poll with a deadline
            assert market.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.2)
        monkeypatch.setenv("VERITRAIN_MARKET_URL", f"http://127.0.0.1:{port}")
        before = chain_state(chain)
        spec = tmp_path / "order.toml"
        spec.write_text(GOOD)
        argv = ["order", "post", str(spec), "--keystore", str(chain.keystore), "--rpc-url", chain.node.url]
        monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))  # an answer, but not from a terminal
        assert main([*argv, "--deployments", str(chain.deployments)]) == 2
        assert error in capsys.readouterr().err
        assert chain_state(chain) == before
    finally:
        os.killpg(market.pid, signal.SIGTERM)
        market.wait(timeout=20)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def test_spec_fields_pass_through_and_amounts_are_exact() -> None:
    """Keys are OrderSpec's own fields (a field the spec gains needs no change); VERI amounts are exact."""
    table = {"recipe": "charlm-tiny", "total_steps": 8, "unit_steps": 8, "replicas": 2, "seed": 1}
    table |= {"max_price_per_pflop": "0.000000000000000001 VERI", "deadline_in": 60, "checkpoint_every": 2}
    spec = spec_from_table(table, buyer="0x" + "ab" * 20, now=1000)
    assert spec.deadline == 1060 and spec.checkpoint_every == 2 and spec.max_price_per_pflop == 1
    assert parse_amount("1_000.5 VERI", "x") == 1_000_500_000_000_000_000_000
    with pytest.raises(InvalidOrderSpec, match="finer than one base unit"):
        parse_amount("0.0000000000000000001 VERI", "x")
    with pytest.raises(InvalidOrderSpec, match="buyer"):
        spec_from_table({**table, "buyer": "0x" + "cd" * 20}, buyer="0x" + "ab" * 20, now=1000)


def test_replicas_auto_asks_for_adaptive_replication() -> None:
    """`replicas = "auto"` is adaptive replication with at most 3 replicas a unit (or `max_replicas`); the
    escrow covers every unit at its most, and the spec hash binds the streak a provider needs."""
    from market.domain.pricing import escrow_plan

    table = tomllib.loads(GOOD.replace("replicas = 1", "replicas = 'auto'"))
    spec = spec_from_table(table, buyer="0x" + "11" * 20, now=1_000)
    assert (spec.adaptive_replication, spec.replicas, spec.trusted_streak) == (True, 3, 20)
    plan = escrow_plan(spec, 1)
    assert (plan.min_replicas, plan.replicas, plan.trusted_streak) == (1, 3, 20)
    two = spec_from_table(
        {**table, "max_replicas": 2, "trusted_streak": 5}, buyer="0x" + "11" * 20, now=1_000
    )
    assert (two.replicas, two.trusted_streak) == (2, 5)
    assert (
        len({spec.spec_hash(), two.spec_hash(), spec.model_copy(update={"trusted_streak": 5}).spec_hash()})
        == 3
    )
    with pytest.raises(InvalidOrderSpec, match="trusted_streak needs adaptive_replication"):
        spec_from_table({**tomllib.loads(GOOD), "trusted_streak": 5}, buyer="0x" + "11" * 20, now=1_000)
