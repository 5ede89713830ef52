"""`veritrain chain fund ADDRESS`: the development faucet — mint VERI to an address and send it gas money.

Why it exists: a new provider, verifier or buyer key holds nothing, and on a development chain the only
source of VERI is the token owner (the deployer). The deployer's `--keystore` signs; on a local hardhat
node without one, the public development account 0 (the deployer `chain deploy` uses there) does. On a
real network VERI comes from elsewhere and this command is refused unless the deployer's key is given.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

TOKEN = 10**18
HARDHAT_CHAIN_ID = 31337


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("address", help="the account to fund (`veritrain keys address NAME` prints it)")
    parser.add_argument("--veri", type=int, default=1000, help="whole VERI to mint (default 1000)")
    parser.add_argument("--eth", type=int, default=1, help="whole ETH to send for gas (default 1)")
    parser.add_argument("--rpc-url", default=None, help="default: chain_rpc_url")
    parser.add_argument("--deployments", type=Path, default=None, help="default: deployments_file")
    parser.add_argument("--keystore", type=Path, default=None, help="the deployer's (token owner's) keystore")
    parser.add_argument("--password-env", default=None, metavar="VAR", help="variable holding its passphrase")
    parser.add_argument("--json", action="store_true", help="print the new balances as JSON")


def run(args: argparse.Namespace) -> int:
    from eth_utils import is_address, to_checksum_address

    from veritrain.chain.backends import RpcBackend, dev_accounts
    from veritrain.chain.client import ChainClient
    from veritrain.errors import InvalidInput, KeystoreError
    from veritrain.keys import load_signer
    from veritrain.settings import load_settings

    if not is_address(args.address):
        raise InvalidInput(f"not an address: {args.address!r}")
    if args.veri < 0 or args.eth < 0:
        raise InvalidInput("--veri and --eth are whole, non-negative amounts")
    address = to_checksum_address(args.address)
    settings = load_settings(
        chain_rpc_url=args.rpc_url,
        deployments_file=args.deployments,
        keystore=args.keystore,
        keystore_password_env=args.password_env,
    )
    backend = RpcBackend(settings.chain_rpc_url)
    client = ChainClient.connect(backend, settings.deployments_file or settings.data_dir / "deployments.json")
    if args.keystore is not None:
        owner = load_signer(args.keystore, password_env=settings.keystore_password_env)
    elif client.chain_id == HARDHAT_CHAIN_ID:
        owner = dev_accounts(1)[0]
    else:
        raise KeystoreError(
            f"chain {client.chain_id} is not a local hardhat node: give the deployer's --keystore"
        )
    if args.veri:
        client.mint(address, args.veri * TOKEN, owner=owner)
    if args.eth:
        client.send_ether(owner, address, args.eth * TOKEN)
    veri, eth = client.token_balance(address), int(client.w3.eth.get_balance(address))
    if args.json:
        print(json.dumps({"address": address, "veri": veri, "eth": eth}))
    else:
        print(f"{address}: {veri / TOKEN:g} VERI, {eth / TOKEN:g} ETH")
    return 0
