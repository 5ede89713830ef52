"""`veritrain chain smoke`: deploy, stake, post an order, settle one unit, print balances before and after.

The smallest end-to-end proof that the settlement plane works on a real node: by default it starts a
local `hardhat node`, runs the flow with the dev accounts, and stops the node again.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

TOKEN = 10**18


def configure(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--rpc", metavar="URL", help="use this JSON-RPC node (dev accounts must be funded)")
    where.add_argument("--in-process", action="store_true", help="use the in-process EVM instead of a node")
    parser.add_argument("--deployments", type=Path, metavar="FILE", help="write the deployments JSON here")


def run(args: argparse.Namespace) -> int:
    from veritrain.chain.backends import open_backend

    with open_backend(args.rpc, in_process=args.in_process) as backend:
        where = getattr(backend, "url", "in-process EVM")
        print(f"chain: {backend.kind} at {where}, chain id {backend.chain_id}")
        smoke(backend, deployments=args.deployments, out=print)
    return 0


def smoke(backend: Any, *, deployments: Path | None = None, out: Any = print) -> dict[str, dict[str, int]]:
    """Run the flow and return {party: {"tokens": .., "credits": .., "bonded": ..}} after settlement."""
    from veritrain.chain.client import ChainClient
    from veritrain.chain.deployment import MarketParams

    accounts = backend.dev_accounts(7)
    deployer, buyer = accounts[0], accounts[1]
    providers, verifiers = list(accounts[2:5]), list(accounts[5:7])
    # spot checks and probation off: the smoke settles its unanimous unit of fresh providers on the fast
    # path, never by a draw
    params = MarketParams(spot_check_ppm=0, solo_spot_check_ppm=0, probation_streak=0)
    client = ChainClient.deploy(backend, deployer, params=params, save_to=deployments)
    out(
        f"deployed: token {client.deployment.token}, stakes {client.deployment.stake_manager}, "
        f"market {client.deployment.job_market}" + (f" -> {deployments}" if deployments else "")
    )

    client.mint(buyer, 1_000 * TOKEN)
    client.approve(buyer, client.deployment.job_market, 2**256 - 1)
    deadline = client.now() + 3600
    for party in [*providers, *verifiers]:
        client.mint(party, 500 * TOKEN)
        # Gasless staking: the party signs an ERC-2612 permit, the deployer relays it.
        permit = client.sign_permit(party, client.deployment.stake_manager, 200 * TOKEN, deadline)
        client.stake_with_permit(party, 200 * TOKEN, permit)

    names = {"buyer": buyer, **{f"provider{i + 1}": p for i, p in enumerate(providers)}}
    before = {name: client.balances(account) for name, account in names.items()}

    price, fee = 10 * TOKEN, 2 * TOKEN
    order_id, _ = client.post_order(buyer, os.urandom(32), 1, 3, price, fee, client.now() + 86_400)
    unit_key = os.urandom(32)
    accepts = [client.sign_accept(p, order_id, unit_key, deadline) for p in providers]
    unit_id, _ = client.assign(order_id, unit_key, providers, verifiers, accepts)
    result_digest = os.urandom(32)
    salts = [os.urandom(32) for _ in providers]
    for provider, salt in zip(providers, salts, strict=True):
        commitment = client.commitment(result_digest, salt, provider, unit_id)
        client.commit_with_sig(
            unit_id, provider, commitment, client.sign_commit(provider, unit_id, commitment, deadline)
        )
    for provider, salt in zip(providers, salts, strict=True):
        client.reveal(unit_id, provider, result_digest, salt)
    client.finalize(unit_id)
    for provider in providers:
        client.withdraw_credit(provider)
    client.close_order(order_id, sender=buyer)  # pays the buyer its refund
    out(f"order {order_id}: unit {unit_id} finalized ({client.get_unit(unit_id).state.name}), order closed")

    after = {name: client.balances(account) for name, account in names.items()}
    out(f"{'party':<12}{'tokens before':>16}{'tokens after':>16}{'change':>12}{'bonded':>10}{'valid':>7}")
    summary: dict[str, dict[str, int]] = {}
    for name, account in names.items():
        change = after[name].tokens - before[name].tokens
        valid = client.reputation(account).valid
        out(
            f"{name:<12}{veri(before[name].tokens):>16}{veri(after[name].tokens):>16}"
            f"{veri(change, signed=True):>12}{veri(after[name].bonded):>10}{valid:>7}"
        )
        summary[name] = {"tokens": after[name].tokens, "change": change, "credits": after[name].credits}
    out(
        f"market holds {client.total_escrow()} escrow, {client.total_credits()} credits (both 0: all settled)"
    )
    return summary


def veri(amount: int, *, signed: bool = False) -> str:
    """Base units as VERI with 2 decimals, by integer arithmetic (money never becomes a float)."""
    sign = "-" if amount < 0 else ("+" if signed else "")
    whole, rest = divmod(abs(amount), TOKEN)
    return f"{sign}{whole:,}.{rest * 100 // TOKEN:02d}"
