"""`veritrain chain deploy`: put the contracts on a chain and write the deployments JSON every process reads.

The operator's first command. It checks the node's chain id against the one expected (`--chain-id`, or
`chain_id` in the configuration) before anything is signed, so a typo in the RPC URL cannot deploy on (and
spend gas on) the wrong network. On a local hardhat node (chain id 31337) without `--keystore`, the
public development account 0 deploys; anywhere else the deployer's keystore is required. The deployment
code itself is `veritrain.chain` (`ChainClient.deploy`); this command only chooses keys and checks.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from veritrain.errors import VeritrainError

HARDHAT_CHAIN_ID = 31337
# longer than the default 7-day unbonding period: a staker can leave before a hostile role grant lands
ADMIN_DELAY_S = 8 * 24 * 3600


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rpc-url", default=None, help="JSON-RPC node (default: chain_rpc_url, a local node)"
    )
    parser.add_argument(
        "--chain-id", type=int, default=None, help="the chain id the node must have (default: chain_id)"
    )
    parser.add_argument("--keystore", type=Path, default=None, help="the deployer's keystore")
    parser.add_argument("--password-env", default=None, metavar="VAR", help="variable holding its passphrase")
    parser.add_argument(
        "--operator", default=None, help="address of the market operator key (default: the deployer)"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="deployments JSON (default: deployments_file or <data dir>)"
    )
    parser.add_argument(
        "--min-verifiers",
        type=int,
        default=None,
        help="fewest verifiers per unit (default 2; 1 for a first market with one verifier); "
        "a verdict needs a majority of the unit's assigned verifiers",
    )
    parser.add_argument(
        "--spot-check-ppm",
        type=int,
        default=None,
        help="share of units with several replicas the contract draws for a verifier spot check, in parts "
        "per million (default 50000: 5 %%)",
    )
    parser.add_argument(
        "--solo-spot-check-ppm",
        type=int,
        default=None,
        help="the same for single-replica units (default 200000: 20 %%)",
    )
    parser.add_argument(
        "--withhold-penalty",
        type=int,
        default=None,
        metavar="BASE_UNITS",
        help="stake a replica loses when it commits but does not reveal in time (default: the slash amount)",
    )
    parser.add_argument(
        "--probation-streak",
        type=int,
        default=None,
        metavar="UNITS",
        help="consecutive valid units a provider needs before its units may skip verification; until "
        "then every unit it works is drawn for a verifier check (default 5; 0 turns probation off)",
    )
    parser.add_argument(
        "--admin-delay",
        type=int,
        default=ADMIN_DELAY_S,
        metavar="SECONDS",
        help="hand the contracts' admin roles to a timelock with this delay, so role grants are public "
        f"that long before they land (default {ADMIN_DELAY_S}: 8 days; 0 keeps the deployer as admin)",
    )
    existing = parser.add_mutually_exclusive_group()
    existing.add_argument("--force", action="store_true", help="replace an existing deployments file")
    existing.add_argument(
        "--keep-existing",
        action="store_true",
        help="if the deployments file exists and its contracts are on this chain, keep it (idempotent step)",
    )
    parser.add_argument("--json", action="store_true", help="print the deployment as JSON")


def run(args: argparse.Namespace) -> int:
    try:
        deployment = deploy(args)
    except VeritrainError as err:
        print(f"veritrain chain deploy: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(deployment))
    else:
        addresses = deployment["addresses"]
        print(f"deployed on chain {deployment['chainId']} at block {deployment['block']}:")
        for name, address in addresses.items():
            print(f"  {name:<12} {address}")
        print(f"operator {deployment['operator']}; written to {deployment['file']}")
    return 0


def deploy(args: argparse.Namespace) -> dict[str, Any]:
    """Check the chain and the keys, deploy, write the file; returns the deployment with its file path."""
    from veritrain.chain.backends import RpcBackend, dev_accounts
    from veritrain.chain.client import ChainClient
    from veritrain.chain.deployment import MarketParams
    from veritrain.chain.errors import WrongChainId
    from veritrain.errors import ConfigError, KeystoreError
    from veritrain.keys import load_signer
    from veritrain.settings import load_settings

    settings = load_settings(
        chain_rpc_url=args.rpc_url,
        chain_id=args.chain_id,
        keystore=args.keystore,
        keystore_password_env=args.password_env,
    )
    out = args.out or settings.deployments_file or settings.data_dir / "deployments.json"
    if out.exists() and not (args.force or args.keep_existing):
        raise ConfigError(f"{out} exists (a deployment the market and agents may use); --force replaces it")
    backend = RpcBackend(settings.chain_rpc_url)
    if backend.chain_id != settings.chain_id:
        raise WrongChainId(settings.chain_id, backend.chain_id, f"node at {settings.chain_rpc_url}")
    if out.exists() and args.keep_existing:
        kept = ChainClient.connect(backend, out)  # WrongChainId / DeploymentError if it is not live here
        print(f"keeping the deployment in {out}: its contracts are on chain {kept.chain_id}")
        return {**kept.deployment.to_dict(), "file": str(out)}
    if settings.keystore is not None:
        deployer = load_signer(settings.keystore, password_env=settings.keystore_password_env)
    elif backend.chain_id == HARDHAT_CHAIN_ID:
        deployer = dev_accounts(1)[0]
        print(f"no --keystore: deploying with hardhat's public development account {deployer.address}")
    else:
        raise KeystoreError(f"chain {backend.chain_id} is not a local hardhat node: give --keystore")
    params = MarketParams()
    if args.min_verifiers is not None:
        if args.min_verifiers < 1:
            raise ConfigError("--min-verifiers must be at least 1")
        params = replace(params, min_verifiers=args.min_verifiers)
    for name in ("spot_check_ppm", "solo_spot_check_ppm"):
        value = getattr(args, name)
        if value is not None:
            if not 0 <= value <= 1_000_000:
                raise ConfigError(f"--{name.replace('_', '-')} must be within [0, 1000000]")
            params = replace(params, **{name: value})
    if args.withhold_penalty is not None:
        if not 0 <= args.withhold_penalty <= params.slash_amount:
            raise ConfigError(
                f"--withhold-penalty must be within [0, {params.slash_amount}] (the slash amount)"
            )
        params = replace(params, withhold_penalty=args.withhold_penalty)
    if args.probation_streak is not None:
        if not 0 <= args.probation_streak <= 65_535:
            raise ConfigError("--probation-streak must be within [0, 65535]")
        params = replace(params, probation_streak=args.probation_streak)
    client = ChainClient.deploy(
        backend,
        deployer,
        operator=args.operator,
        params=params,
        save_to=out,
        admin_delay=args.admin_delay or None,
    )
    return {**client.deployment.to_dict(), "file": str(out)}
