"""`veritrain bench chain` and `veritrain chain smoke` through the real CLI entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from apps.cli import main
from veritrain.chain.backends import HardhatNode

pytestmark = pytest.mark.chain

ACTIONS = [
    "deploy",
    "stake",
    "post_order",
    "assign",
    "commit",
    "commit_batch",
    "reveal",
    "reveal_batch_finalize",
    "finalize",
    "verdict",
    "settle_verdict",
    "withdraw",
]
TOTALS = [
    "gas_per_settled_unit",
    "gas_per_settled_unit_single_message",
    "gas_per_settled_unit_pipelined",
    "per_order_gas",
    "gas_per_settled_unit_with_order_amortized",
    "single_unit_order_all_tx",
    "gas_per_settled_unit_k3_m8",
    "gas_per_settled_unit_k1_m8",
    "gas_per_settled_unit_per_unit_path",
    "gas_per_settled_unit_per_unit_path_per_message",
    "gas_per_settled_unit_round_multicall_m8",
]


def test_bench_chain_writes_the_gas_schema(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    assert main(["bench", "chain", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    gas = report["gas"]
    assert list(gas) == ACTIONS
    assert all(isinstance(value, int) and value > 21_000 for value in gas.values())
    assert all(isinstance(report[key], int) for key in TOTALS)
    assert set(report["included"]) == set(TOTALS)

    detail = report["detail"]
    assert (
        report["gas_per_settled_unit"] == gas["assign"] + gas["commit_batch"] + gas["reveal_batch_finalize"]
    )
    assert report["gas_per_settled_unit"] == sum(detail["batched_unit"].values())
    assert report["gas_per_settled_unit_single_message"] == sum(detail["single_message_unit"].values())
    assert len(detail["single_message_unit"]) == 1 + 3 + 3 + 1  # assign, 3 commits, 3 reveals, finalize
    assert report["per_order_gas"] == sum(report["per_order_transactions"].values())
    # post, close (which pays the buyer its refund: no withdrawal of its own), the 3 providers' withdrawals
    assert sorted(report["per_order_transactions"]) == [
        "closeOrder",
        "postOrder",
        "withdrawCredit#1",
        "withdrawCredit#2",
        "withdrawCredit#3",
    ]
    units = report["units_per_order"]
    amortized = report["gas_per_settled_unit"] + report["per_order_gas"] // units
    assert report["gas_per_settled_unit_with_order_amortized"] == amortized
    lone = detail["single_unit_order"]
    assert report["single_unit_order_all_tx"] == sum(lone["unit"].values()) + sum(lone["order"].values())
    assert report["gas_per_settled_unit_pipelined"] == detail["pipelined_ticks"][4]
    assert report["within_target"] == (
        report["gas_per_settled_unit"] <= report["target_gas_per_settled_unit"]
    )

    # Behaviour, not thresholds: batching saves per-transaction overhead, and the steady state costs no
    # more than the first unit of an order.
    assert report["gas_per_settled_unit"] < report["gas_per_settled_unit_single_message"]
    assert report["gas_per_settled_unit_pipelined"] < report["gas_per_settled_unit"]
    assert gas["commit_batch"] < 3 * gas["commit"]
    assert gas["reveal_batch_finalize"] < 3 * gas["reveal"] + gas["finalize"]
    # The first unit of an order touches no colder storage than a later one; random salts, keys and
    # signatures make their calldata differ by a few zero bytes (12 gas each), hence the 0.1 % slack.
    first = sum(detail["single_message_first_unit_of_order"].values())
    assert report["gas_per_settled_unit_single_message"] <= first * 1001 // 1000
    # Issue 9's whole-order figures: every transaction of an M = 8 order (2 rounds of 8 shard units and
    # an aggregate unit) over its 16 shard units. One replica costs less than three; the market's outbox
    # sends the batched path (one commitBatch, one revealBatch per unit), which costs less than its
    # earlier single-message path.
    orders = detail["diloco_m8_orders"]
    for key, order in orders.items():
        assert order["units"] == 18 and order["shard_units"] == 16
        assert order["per_shard_unit"] == (order["units_gas"] + order["order_gas"]) // 16
        assert report[f"gas_per_settled_unit_{key}"] == order["per_shard_unit"]
    assert orders["k1_m8"]["replicas"] == 1 and orders["k3_m8"]["replicas"] == 3
    assert report["gas_per_settled_unit_k1_m8"] < report["gas_per_settled_unit_k3_m8"]
    assert orders["per_unit_path"] == orders["k3_m8"]
    # a round's shard units coalesced into one multicall per phase (not the market's path) costs less
    assert report["gas_per_settled_unit_round_multicall_m8"] < report["gas_per_settled_unit_per_unit_path"]
    per_unit = report["gas_per_settled_unit_per_unit_path"]
    assert per_unit < report["gas_per_settled_unit_per_unit_path_per_message"]
    # amortized over 18 units, a k = 3 unit costs at least the steady-state batched unit's share
    assert orders["k3_m8"]["units_gas"] >= 18 * report["gas_per_settled_unit"] * 99 // 100
    # The round path's two-step flow (M shard units a round) and its audits: every unit of an audited
    # order was set aside and settled by verdict (the bench refuses otherwise), which costs more than
    # the plain order; the figure with audits adds rate x that cost to the R = 10 figure.
    rounds = detail["round_path_m8_orders"]
    for k, audit in report["round_path_audits"].items():
        audited, plain = rounds[f"{k}_m8_r2_two_step_audited"], rounds[f"{k}_m8_r2_two_step"]
        verdicts = [name for name in audited["round_path_gas"] if name.startswith("submitVerdict#")]
        assert len(verdicts) == audited["units"] == plain["units"] == 16
        assert audit["audit_gas_per_unit"] > 100_000
        without = report[f"gas_per_settled_unit_round_path_{k}_m8_r10_two_step"]
        assert audit["without_audits"] == without
        assert (
            audit["with_audits"] == without + audit["audit_gas_per_unit"] * audit["audit_rate_ppm"] // 10**6
        )
        assert (
            report[f"gas_per_settled_unit_round_path_{k}_m8_r10_two_step_with_audits"] == audit["with_audits"]
        )
    # Round audits: the audited order set nothing aside (the bench refuses otherwise) and a round with drawn
    # units costs far less than setting them aside; the figure at the default rates follows its formula.
    for k, audit in report["round_path_round_audits"].items():
        round_audited = rounds[f"{k}_m8_r2_two_step_round_audited"]["round_path_gas"]
        assert not any(name.startswith("submitVerdict#") for name in round_audited)
        assert 0 < audit["gas_per_audited_round"] < report["round_path_audits"][k]["audit_gas_per_unit"]
        without = report[f"gas_per_settled_unit_round_path_{k}_m8_r10_two_step"]
        per_order = audit["fixed_gas_per_order"]
        per_rounds = 10 * audit["audited_round_ppm"] * audit["gas_per_audited_round"] // 10**6
        assert audit["with_round_audits"] == without + (per_order + per_rounds) // 80
        key = f"gas_per_settled_unit_round_path_{k}_m8_r10_two_step"
        assert report[f"{key}_round_audits"] == audit["with_round_audits"] < report[f"{key}_with_audits"]
    # The same derived for each flow at R = 2 and R = 10: two steps per round, and one step per round (step r
    # reveals round r - 1, leaving its drawn units pending, and commits round r; the last step posts every
    # pending round's audit at once), which costs less; its orders with every unit drawn are measured too.
    by_flow = report["round_path_round_audits_by_flow"]
    assert len(by_flow) == 2 * 2 * 2
    for name, audit in by_flow.items():
        k, flow, r = audit["replicas"], audit["flow"], audit["rounds"]
        assert name == f"k{k}_{flow}_r{r}"
        key = f"gas_per_settled_unit_round_path_k{k}_m8_r{r}_{flow}"
        per_order = audit["fixed_gas_per_order"]
        per_rounds = r * audit["audited_round_ppm"] * audit["gas_per_audited_round"] // 10**6
        if flow == "one_step":
            per_order += audit["posting_ppm"] * audit["gas_per_posting"] // 10**6
            assert audit["without_audits"] < audit["with_round_audits"] < audit["measured_every_round_drawn"]
        assert audit["without_audits"] == report[key]
        assert report[f"{key}_round_audits"] == audit["with_round_audits"]
        assert audit["with_round_audits"] == report[key] + (per_order + per_rounds) // (r * 8)
        assert f"k{k}_m8_r{r}_{flow}_round_audited" in rounds or flow == "two_step"
    for k in (3, 1):
        for r in (2, 10):
            one = by_flow[f"k{k}_one_step_r{r}"]["with_round_audits"]
            assert one < by_flow[f"k{k}_two_step_r{r}"]["with_round_audits"]
    # The path the market takes by default, through the market's own code: an M = 8 folded order whose
    # settlement the market chose (the round path), R = 10, every transaction to the contracts counted
    # (the actions are the contracts' own functions), far below the per-unit path. Not held to issue 9's
    # targets here: the draws come from block hashes. The roster's verifiers audit its drawn units (their
    # signatures ride in the steps), a unit set aside settles by its verdict, and the order's last outer
    # step is the buyer's own: no unit is assigned on the per-unit path.
    market_orders = report["market_path_orders"]
    assert set(market_orders) == {"k3_m8_r10_default_rates", "k1_m8_r10_default_rates"}
    for name, order in market_orders.items():
        k = order["replicas"]
        assert name.startswith(f"k{k}_") and order["settlement"] == "rounds" and order["shard_units"] == 80
        assert report[f"gas_per_settled_unit_market_path_k{k}_m8"] == order["per_shard_unit"]
        assert order["per_shard_unit"] == sum(order["gas_by_action"].values()) // 80
        counts = order["count_by_action"]
        assert counts["openRoster"] == counts["postOrder"] == counts["closeOrder"] == 1
        # one close; two when the first reverts inside an audit posting's challenge window (sent again then)
        assert counts["closeRoster"] in ((1, 2) if order["drawn_units"] else (1,))
        assert counts["stepRound"] >= 11  # one step per round and a reveal-only last step, at least
        assert "assign" not in counts and "commitBatch" not in counts  # no final aggregate unit
        assert order["drawn_units"] >= counts.get("submitVerdict", 0)  # audited in a round, or judged alone
    assert report["gas_per_settled_unit_market_path"] == report["gas_per_settled_unit_market_path_k3_m8"]
    assert report["gas_per_settled_unit_market_path_k3_m8"] < per_unit
    printed = capsys.readouterr().out
    assert "issue 9 target at k = 3, M = 8, market path" in printed
    assert "per settled unit (batched)" in printed and "single-unit order, all transactions" in printed


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
