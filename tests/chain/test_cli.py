"""`veritrain bench chain` and `veritrain chain smoke` through the real CLI entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from veritrain.chain.backends import HardhatNode
from veritrain.cli import main

pytestmark = pytest.mark.chain

ACTIONS = ["deploy", "stake", "post_order", "assign", "commit", "reveal", "finalize", "verdict", "withdraw"]


def test_bench_chain_writes_the_gas_schema(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    assert main(["bench", "chain", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert list(report["gas"]) == ACTIONS
    assert all(isinstance(value, int) and value > 21_000 for value in report["gas"].values())
    detail = report["detail"]
    expected_total = (
        report["gas"]["post_order"]
        + report["gas"]["assign"]
        + sum(detail["commit_with_sig_each_replica"])
        + sum(detail["reveal_each_replica"])
        + report["gas"]["finalize"]
        + sum(detail["withdraw_each_replica"])
    )
    assert report["gas_per_settled_unit"] == expected_total
    assert report["within_target"] == (expected_total <= report["target_gas_per_settled_unit"])
    assert len(detail["commit_with_sig_each_replica"]) == 3
    assert "per settled unit" in capsys.readouterr().out


@pytest.mark.node_backend
def test_chain_smoke_on_a_node_settles_one_unit(
    tmp_path: Path, hardhat_node: HardhatNode, capsys: pytest.CaptureFixture[str]
) -> None:
    deployments = tmp_path / "deployments.json"
    assert main(["chain", "smoke", "--rpc", hardhat_node.url, "--deployments", str(deployments)]) == 0
    printed = capsys.readouterr().out
    assert "finalized" in printed and "provider1" in printed
    assert json.loads(deployments.read_text())["chainId"] == 31337


def test_chain_smoke_in_process_pays_each_provider_the_price() -> None:
    from veritrain.chain.backends import InProcessBackend
    from veritrain.chain.smoke import TOKEN, smoke

    lines: list[str] = []
    with InProcessBackend(accounts=7) as backend:
        summary = smoke(backend, out=lines.append)
    assert [summary[f"provider{i}"]["change"] for i in (1, 2, 3)] == [10 * TOKEN] * 3
    assert summary["buyer"]["change"] == -30 * TOKEN
    assert all(entry["credits"] == 0 for entry in summary.values())
