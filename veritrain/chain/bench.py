"""`veritrain bench chain`: the gas of every contract action for one 3-replica unit, and per settled unit.

Why this shape: the design target is a gas budget for everything one settled unit costs (post, assign,
3 commits, 3 reveals, finalize, 3 withdrawals), so the bench runs exactly that on fresh contracts and
sums the receipts' gasUsed; a second unit goes the verifier path to price a verdict. Gas does not depend
on the backend (same bytecode, same EVM rules), so the in-process EVM is the default.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path
from typing import Any

GAS_TARGET_PER_SETTLED_UNIT = 400_000
REPLICAS = 3
VERIFIERS = 2
TOKEN = 10**18

INTRINSIC_TX_GAS = 21_000  # paid by every transaction before any calldata or execution
SETTLED_UNIT_TRANSACTION_COUNT = 1 + 1 + REPLICAS + REPLICAS + 1 + REPLICAS
SETTLED_UNIT_TRANSACTIONS = [
    "post_order",
    "assign",
    "commit x3",
    "reveal x3",
    "finalize",
    "withdraw x3",
]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the figures as JSON to FILE")
    parser.add_argument(
        "--rpc", metavar="URL", help="measure on this JSON-RPC node instead of the in-process EVM"
    )


def run(args: argparse.Namespace) -> int:
    from veritrain.chain.backends import open_backend

    with open_backend(args.rpc, in_process=not args.rpc) as backend:
        report = measure(backend)
    print(format_table(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def measure(backend: Any) -> dict[str, Any]:
    """Deploy fresh contracts on `backend` and measure every action of one fast-path and one verdict unit."""
    from veritrain.chain.client import ChainClient, Outcome
    from veritrain.chain.deployment import MarketParams

    accounts = backend.dev_accounts(2 + REPLICAS + VERIFIERS)
    deployer, buyer = accounts[0], accounts[1]
    providers = list(accounts[2 : 2 + REPLICAS])
    verifiers = list(accounts[2 + REPLICAS :])
    params = MarketParams(verifier_quorum=VERIFIERS)
    client = ChainClient.deploy(backend, deployer, params=params)
    deploy_detail = {
        name: receipt.gas_used
        for name, receipt in zip(
            ["VeriToken", "StakeManager", "JobMarket", "grantRole"], client.deploy_receipts, strict=True
        )
    }

    price, fee = 10 * TOKEN, 3 * TOKEN
    client.mint(buyer, 1000 * TOKEN)
    client.approve(buyer, client.deployment.job_market, 2**256 - 1)
    stake_gas: list[int] = []
    for party in [*providers, *verifiers]:
        client.mint(party, 1000 * TOKEN)
        client.approve(party, client.deployment.stake_manager, 2**256 - 1)
        stake_gas.append(client.stake(party, 200 * TOKEN).gas_used)

    now = client.now()
    order_id, posted = client.post_order(buyer, os.urandom(32), 2, REPLICAS, price, fee, now + 86_400)

    # Unit 1: the fast path, providers gasless (their commits relayed with signatures, reveals relayed).
    unit_key = os.urandom(32)
    deadline = now + 3600
    accepts = [client.sign_accept(p, order_id, unit_key, deadline) for p in providers]
    unit_id, assigned = client.assign(order_id, unit_key, providers, verifiers, accepts)
    digest = os.urandom(32)
    salts = [os.urandom(32) for _ in providers]
    commit_gas = []
    for provider, salt in zip(providers, salts, strict=True):
        commitment = client.commitment(digest, salt, provider, unit_id)
        signed = client.sign_commit(provider, unit_id, commitment, deadline)
        commit_gas.append(client.commit_with_sig(unit_id, provider, commitment, signed).gas_used)
    reveal_gas = [
        client.reveal(unit_id, p, digest, s).gas_used for p, s in zip(providers, salts, strict=True)
    ]
    finalized = client.finalize(unit_id)
    withdraw_gas = [client.withdraw_credit(p).gas_used for p in providers]

    # Unit 2: the verifier path (replica 3 disagrees and is judged fraud), providers committing themselves.
    unit_key = os.urandom(32)
    accepts = [client.sign_accept(p, order_id, unit_key, deadline) for p in providers]
    unit_id2, assigned2 = client.assign(order_id, unit_key, providers, verifiers, accepts)
    digests = [digest, digest, os.urandom(32)]
    plain_commit_gas = []
    for provider, salt, result in zip(providers, salts, digests, strict=True):
        plain_commit_gas.append(
            client.commit(provider, unit_id2, client.commitment(result, salt, provider, unit_id2)).gas_used
        )
    for provider, salt, result in zip(providers, salts, digests, strict=True):
        client.reveal(unit_id2, provider, result, salt)
    outcomes = [Outcome.ACCEPT, Outcome.ACCEPT, Outcome.FRAUD]
    reasons = os.urandom(32)
    verdicts = [client.sign_verdict(v, unit_id2, outcomes, reasons, deadline) for v in verifiers]
    verdict = client.submit_verdict(unit_id2, outcomes, reasons, verdicts)

    per_unit = (
        posted.gas_used
        + assigned.gas_used
        + sum(commit_gas)
        + sum(reveal_gas)
        + finalized.gas_used
        + sum(withdraw_gas)
    )
    return {
        "gas": {
            "deploy": sum(deploy_detail.values()),
            "stake": stake_gas[0],
            "post_order": posted.gas_used,
            "assign": assigned.gas_used,
            "commit": round(statistics.mean(commit_gas)),
            "reveal": round(statistics.mean(reveal_gas)),
            "finalize": finalized.gas_used,
            "verdict": verdict.gas_used,
            "withdraw": round(statistics.mean(withdraw_gas)),
        },
        "gas_per_settled_unit": per_unit,
        "gas_per_settled_unit_included": SETTLED_UNIT_TRANSACTIONS,
        "transactions_per_settled_unit": SETTLED_UNIT_TRANSACTION_COUNT,
        "intrinsic_gas_per_settled_unit": SETTLED_UNIT_TRANSACTION_COUNT * INTRINSIC_TX_GAS,
        "target_gas_per_settled_unit": GAS_TARGET_PER_SETTLED_UNIT,
        "within_target": per_unit <= GAS_TARGET_PER_SETTLED_UNIT,
        "detail": {
            "deploy": deploy_detail,
            "stake_each_party": stake_gas,
            "commit_with_sig_each_replica": commit_gas,
            "commit_plain_each_replica": plain_commit_gas,
            "reveal_each_replica": reveal_gas,
            "withdraw_each_replica": withdraw_gas,
            "assign_second_unit_same_order": assigned2.gas_used,
        },
        "notes": {
            "units": f"{REPLICAS} replicas, {VERIFIERS} verifiers (quorum {VERIFIERS}), order of 2 units",
            "per_replica_figures": "commit, reveal and withdraw in 'gas' are the mean of the 3 transactions",
            "commit": "the settled unit's commits are commitWithSig relayed for gasless providers",
            "verdict": "second unit, outcomes accept/accept/fraud (one slash, bounty to 2 verifiers)",
            "stake": "first stake of a fresh account (cold storage)",
            "deploy": "VeriToken + StakeManager + JobMarket + grantRole(MARKET_ROLE)",
        },
        "backend": backend.kind,
        "chain_id": backend.chain_id,
    }


def format_table(report: dict[str, Any]) -> str:
    """A readable table of the JSON figures."""
    rows = [f"{'action':<24}{'gas':>12}"]
    rows += [f"{name:<24}{value:>12,}" for name, value in report["gas"].items()]
    total = report["gas_per_settled_unit"]
    target = report["target_gas_per_settled_unit"]
    rows.append("-" * 36)
    rows.append(f"{'per settled unit':<24}{total:>12,}")
    rows.append(f"  = {' + '.join(report['gas_per_settled_unit_included'])}")
    intrinsic = report["intrinsic_gas_per_settled_unit"]
    count = report["transactions_per_settled_unit"]
    rows.append(f"  of which {intrinsic:,} is the 21,000 base of each of {count} transactions")
    verdict = "within" if report["within_target"] else "OVER"
    rows.append(f"  target {target:,}: {verdict} ({total / target:.0%} of target)")
    return "\n".join(rows)
