"""`veritrain wallet status|withdraw|unstake|release`: what one key holds in Veritrain, and getting it out.

Why: agents stake by themselves and are paid into a credit on the JobMarket (a pull payment), so a
provider, verifier or buyer needs a way, without writing Python, to see its tokens, credit, stake and
reputation, to withdraw its credit, to start unbonding its free stake and to take the thawed stake back.
Each refusal the contract would make is checked first and said plainly (nothing to withdraw, stake still
locked as collateral of open units, stake not thawed yet), so a refused command sends no transaction.
The key pays the gas of its own transactions. Stop an agent before unstaking: a running agent bonds its
tokens again at its next start (`--stake` sets how much it keeps bonded).
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from apps.order import Session, add_session_arguments
from veritrain.errors import InvalidInput

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from veritrain.chain.client import ChainClient

WHOSE = "the agent's or buyer's"


def holdings(client: ChainClient, address: str) -> dict[str, Any]:
    """Everything `address` holds in the deployment, in base units, and its reputation."""
    from eth_utils import to_checksum_address

    stake = client.stake_of(address)
    reputation = client.reputation(address)
    return {
        "address": address,
        "wallet": client.token_balance(address),
        "credit": client.credits(address),
        "bonded": stake.bonded,
        "locked": stake.locked,
        "free": stake.free,
        "unbonding": stake.unbonding,
        "thaw_at": stake.thaw_at,
        "ether_wei": int(client.w3.eth.get_balance(to_checksum_address(address))),
        "reputation": {
            "valid": reputation.valid,
            "fault": reputation.fault,
            "fraud": reputation.fraud,
            "consecutive_valid": reputation.consecutive_valid,
        },
    }


def _report(args: argparse.Namespace, result: dict[str, Any], line: str) -> int:
    print(json.dumps(result, sort_keys=True) if args.json else line)
    return 0


def _signer(args: argparse.Namespace) -> tuple[ChainClient, LocalAccount]:
    session = Session(args)
    client = session.chain()  # a wrong chain is refused before the key is unlocked
    return client, session.signer()


# --- status -------------------------------------------------------------------------------------------


def configure_status(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("address", nargs="?", default=None, help="any address (default: the keystore's)")
    add_session_arguments(parser, market=False, whose=WHOSE)


def run_status(args: argparse.Namespace) -> int:
    from eth_utils import is_address, to_checksum_address

    from veritrain.keys import keystore_address
    from veritrain.wallet import veri

    session = Session(args)
    if args.address is not None and not is_address(args.address):
        raise InvalidInput(f"not an address: {args.address!r}")
    address = to_checksum_address(args.address) if args.address else keystore_address(session.keystore())
    client = session.chain()
    held = holdings(client, address)
    rep = held["reputation"]
    thaw = f", thaws at {held['thaw_at']}" if held["unbonding"] else ""
    return _report(
        args,
        held,
        f"{address}: wallet {veri(held['wallet'])}, credit {veri(held['credit'])}, bonded "
        f"{veri(held['bonded'])} ({veri(held['locked'])} locked as collateral, {veri(held['free'])} free), "
        f"unbonding {veri(held['unbonding'])}{thaw}; reputation {rep['valid']} valid, {rep['fault']} "
        f"fault, {rep['fraud']} fraud, {rep['consecutive_valid']} in a row",
    )


# --- withdraw -----------------------------------------------------------------------------------------


def _key_arguments(parser: argparse.ArgumentParser) -> None:
    add_session_arguments(parser, market=False, whose=WHOSE)


configure_withdraw = _key_arguments


def run_withdraw(args: argparse.Namespace) -> int:
    from veritrain.wallet import veri

    client, account = _signer(args)
    credit = client.credits(account)
    if credit == 0:
        raise InvalidInput(f"{account.address} has no credit on the JobMarket to withdraw")
    client.withdraw_credit(account)
    wallet = client.token_balance(account)
    result = {"address": account.address, "withdrawn": credit, "wallet": wallet}
    return _report(args, result, f"withdrew {veri(credit)}; wallet {veri(wallet)}")


# --- unstake ------------------------------------------------------------------------------------------


def configure_unstake(parser: argparse.ArgumentParser) -> None:
    amount = parser.add_mutually_exclusive_group(required=True)
    amount.add_argument("--amount", type=int, help="base units of free stake to start unbonding")
    amount.add_argument("--all", action="store_true", help="all of the free stake")
    add_session_arguments(parser, market=False, whose=WHOSE)


def run_unstake(args: argparse.Namespace) -> int:
    from veritrain.wallet import unstake, veri

    if args.amount is not None and args.amount <= 0:
        raise InvalidInput(f"--amount must be positive, not {args.amount}")
    client, account = _signer(args)
    amount = unstake(client, account, None if args.all else args.amount)
    after = client.stake_of(account)
    result = {
        "address": account.address,
        "unstaked": amount,
        "unbonding": after.unbonding,
        "thaw_at": after.thaw_at,
    }
    return _report(
        args,
        result,
        f"unbonding {veri(after.unbonding)} (thaws at {after.thaw_at}; `veritrain wallet release` then)",
    )


# --- release ------------------------------------------------------------------------------------------


configure_release = _key_arguments


def run_release(args: argparse.Namespace) -> int:
    from veritrain.wallet import release, veri

    client, account = _signer(args)
    released = release(client, account)
    wallet = client.token_balance(account)
    result = {"address": account.address, "released": released, "wallet": wallet}
    return _report(args, result, f"released {veri(released)}; wallet {veri(wallet)}")
