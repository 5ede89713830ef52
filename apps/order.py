"""`veritrain order post|status|watch|fetch|close`: the buyer's commands (the work itself is apps.buyer).

Every check that can refuse an order — the order file, the recipe, the chain id of the node, of the
deployments file and of the market, the deadline, the buyer's balance — runs before the key is unlocked,
so a refused order leaves nothing signed and nothing sent. `--json` prints one JSON document on stdout
(progress goes to stderr); a typed refusal is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from veritrain.errors import InvalidInput

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from veritrain.api_client import MarketClient
    from veritrain.chain.client import ChainClient
    from veritrain.settings import Settings

FINISHED = ("completed", "expired", "cancelled")
POLL_S = 1.0


def add_session_arguments(
    parser: argparse.ArgumentParser, *, key: bool = True, market: bool = True, whose: str = "the buyer's"
) -> None:
    """The options every command over one market and chain takes (`whose`: the key's owner, for help)."""
    if key:
        parser.add_argument(
            "--keystore",
            default=None,
            help=f"{whose} keystore: a file or a key name in <data dir>/keystore "
            "(default: $VERITRAIN_KEYSTORE)",
        )
        parser.add_argument(
            "--password-env", default=None, metavar="VAR", help="variable holding its passphrase"
        )
    if market:
        parser.add_argument("--market-url", default=None, help="default: market_url ($VERITRAIN_MARKET_URL)")
    parser.add_argument("--rpc-url", default=None, help="default: chain_rpc_url ($VERITRAIN_CHAIN_RPC_URL)")
    parser.add_argument(
        "--chain-id", type=int, default=None, help="the chain id expected (default: chain_id)"
    )
    parser.add_argument("--deployments", type=Path, default=None, help="default: deployments_file")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON document")


def _order_id(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("order_id", type=int, help="the market's order id (`order post` prints it)")


class Session:
    """One party's view of one market: settings, the chain (its id checked), the market, the key file."""

    def __init__(self, args: argparse.Namespace) -> None:
        from veritrain.settings import load_settings

        self.args = args
        self.settings: Settings = load_settings(
            market_url=getattr(args, "market_url", None),
            chain_rpc_url=args.rpc_url,
            chain_id=args.chain_id,
            deployments_file=args.deployments,
            keystore_password_env=getattr(args, "password_env", None),
        )

    def chain(self) -> ChainClient:
        """The deployment on the node; WrongChainId if the node or the deployments file is another chain."""
        from veritrain.chain.backends import RpcBackend
        from veritrain.chain.client import ChainClient
        from veritrain.chain.errors import WrongChainId

        settings = self.settings
        backend = RpcBackend(settings.chain_rpc_url)
        if backend.chain_id != settings.chain_id:
            raise WrongChainId(settings.chain_id, backend.chain_id, f"node at {settings.chain_rpc_url}")
        deployments = settings.deployments_file or settings.data_dir / "deployments.json"
        return ChainClient.connect(backend, deployments)

    def market(self) -> MarketClient:
        from veritrain.api_client import MarketClient

        return MarketClient(self.settings.market_url, timeout=30)

    def keystore(self) -> Path:
        from veritrain.errors import KeystoreError
        from veritrain.keys import keystore_dir, resolve_keystore

        name = self.args.keystore or self.settings.keystore
        if name is None:
            raise KeystoreError("no key: give --keystore (a file or a key name) or set keystore")
        return resolve_keystore(name, keystore_dir(self.settings.data_dir))

    def signer(self) -> LocalAccount:
        from veritrain.keys import load_signer

        return load_signer(self.keystore(), password_env=self.settings.keystore_password_env)


def _say(args: argparse.Namespace, line: str) -> None:
    print(line, file=sys.stderr if args.json else sys.stdout, flush=True)


# --- post ---------------------------------------------------------------------------------------------


def configure_post(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", type=Path, help="the order file (TOML; docs/BUYERS.md)")
    parser.add_argument("--yes", action="store_true", help="sign without asking (scripts)")
    parser.add_argument(
        "--settlement",
        choices=("units", "rounds"),
        default=None,
        help="how the market settles the order on chain: 'units' (every unit on its own) or 'rounds' (one "
        "roster of providers for the order, one transaction per round; needs a folded outer step, shards "
        ">= 2, and fixed replication); default: 'rounds' when the order can take it, else 'units'",
    )
    add_session_arguments(parser)


def run_post(args: argparse.Namespace) -> int:
    from apps.buyer import check_funds, escrow_for, load_spec_file, post_order, spec_from_table, veri
    from market.domain.rosters import SETTLE_BY_ROUNDS, roster_shape, settlement_of
    from veritrain.chain.errors import WrongChainId
    from veritrain.keys import keystore_address

    session = Session(args)
    table = load_spec_file(args.spec)  # a malformed file is refused before any connection is made
    client = session.chain()
    buyer = keystore_address(session.keystore())
    spec = spec_from_table(table, buyer=buyer, now=client.pending_time())
    settlement = settlement_of(spec, args.settlement)  # the market's own choice when none is asked
    if settlement == SETTLE_BY_ROUNDS:
        roster_shape(spec)  # InvalidOrderSpec before anything is signed: the round path cannot serve it
    plan = escrow_for(spec, args.settlement)
    check_funds(client, buyer, plan)
    with session.market() as api:
        market_chain = int(api.dashboard_data()["chain_id"])
    if market_chain != client.chain_id:
        raise WrongChainId(client.chain_id, market_chain, f"market at {session.settings.market_url}")
    _say(
        args,
        f"order: {spec.recipe}, {spec.total_steps} steps in units of {spec.unit_steps}, {spec.replicas} "
        f"replicas, max {veri(spec.max_price_per_pflop)}/PFLOP, deadline {spec.deadline}\n"
        f"escrow to lock on chain {client.chain_id}: {veri(plan.total)} = {plan.units} units x "
        f"({plan.replicas} x {veri(plan.price_per_replica)} + verifier fee "
        f"{veri(plan.verifier_fee_per_unit)}); what is not spent comes back with `veritrain order close`\n"
        f"settlement: {settlement}",
    )
    if not args.yes:
        if not sys.stdin.isatty():
            raise InvalidInput("not confirmed: run in a terminal to answer, or pass --yes")
        if input("sign and post this order? [y/N] ").strip().lower() not in ("y", "yes"):
            _say(args, "not posted")
            return 1
    posted = post_order(
        client, session.signer(), spec, plan, session.settings.market_url, settlement=args.settlement
    )
    result = {
        "order_id": posted.market_order_id,
        "chain_order_id": posted.chain_order_id,
        "escrow": posted.escrow,
        "spec_hash": spec.spec_hash(),
        "spec": spec.model_dump(mode="json"),
        "settlement": settlement,
    }
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(
            f"posted: order {posted.market_order_id} (chain order {posted.chain_order_id}), "
            f"{veri(posted.escrow)} in escrow; follow it with "
            f"`veritrain order watch {posted.market_order_id}`"
        )
    return 0


# --- status and watch ---------------------------------------------------------------------------------


def configure_status(parser: argparse.ArgumentParser) -> None:
    _order_id(parser)
    add_session_arguments(parser, key=False)


def order_view(api: MarketClient, order_id: int) -> dict[str, Any]:
    """The market's status of the order, with what the dashboard adds: verdicts and the loss curve."""
    status = api.order_status(order_id).model_dump(mode="json")
    dashboard = api.dashboard_data()
    shown = next((o for o in dashboard["orders"] if o["id"] == order_id), None)
    units = dashboard.get("units", {})
    for unit in status["units"]:
        extra = units.get(str(unit["unit_id"]), {})
        verification = extra.get("verification") or {}
        unit["verdicts"] = [v["outcomes"] for v in verification.get("verdicts", [])]
        unit["slashed_verifiers"] = {
            v["verifier"]: int(v["slashed"]) for v in verification.get("verdicts", []) if v.get("slashed")
        }
    status["loss"] = shown["loss"] if shown else []
    return status


def status_lines(view: dict[str, Any]) -> list[str]:
    loss = f", loss {view['loss'][-1][1]:.4f} at step {int(view['loss'][-1][0])}" if view["loss"] else ""
    lines = [
        f"order {view['order_id']} (chain order {view['chain_order_id']}): {view['state']}, "
        f"rounds {view['rounds_accepted']}/{view['rounds_total']}{loss}"
    ]
    for unit in view["units"]:
        verdicts = f" verdicts {unit['verdicts']}" if unit["verdicts"] else ""
        slashed = unit.get("slashed_verifiers") or {}
        if slashed:  # VerifierSlashed: a verifier's own signature contradicted the verdict
            from apps.buyer import veri

            verdicts += " slashed verifiers " + ", ".join(f"{a} ({veri(n)})" for a, n in slashed.items())
        what = "aggregate" if unit["kind"] == "aggregate" else f"shard {unit['shard']}"
        lines.append(
            f"  round {unit['round_index']} {what} unit {unit['unit_id']} "
            f"(attempt {unit['attempt']}): {unit['state']}, {len(unit['providers'])} replicas{verdicts}"
        )
    return lines


def run_status(args: argparse.Namespace) -> int:
    session = Session(args)
    with session.market() as api:
        view = order_view(api, args.order_id)
    if args.json:
        print(json.dumps(view, sort_keys=True))
    else:
        print("\n".join(status_lines(view)))
    return 0


def configure_watch(parser: argparse.ArgumentParser) -> None:
    _order_id(parser)
    parser.add_argument("--timeout", type=float, default=None, help="give up after this many seconds")
    add_session_arguments(parser, key=False)


def run_watch(args: argparse.Namespace) -> int:
    """Live progress until the order finishes: a live rich view on a terminal, each new line elsewhere."""
    from rich.live import Live
    from rich.text import Text

    from veritrain.errors import MarketError
    from veritrain.progress import stderr_console

    session = Session(args)
    console = stderr_console()
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    printed: set[str] = set()
    live = Live(console=console, auto_refresh=False) if console.is_terminal else None
    with session.market() as api, live or nullcontext():
        while True:
            view = order_view(api, args.order_id)
            lines = status_lines(view)
            if live is not None:
                live.update(Text("\n".join(lines)), refresh=True)
            for line in lines if live is None else ():
                if line not in printed:  # off a terminal: each new line once, for logs and pipes
                    print(line, file=sys.stderr if args.json else sys.stdout, flush=True)
                    printed.add(line)
            if view["state"] in FINISHED:
                break
            if deadline is not None and time.monotonic() > deadline:
                raise MarketError(f"order {args.order_id} still {view['state']} after {args.timeout:.0f} s")
            time.sleep(POLL_S)
    if args.json:
        print(json.dumps(view, sort_keys=True))
    return 0 if view["state"] == "completed" else 1


# --- fetch --------------------------------------------------------------------------------------------


def configure_fetch(parser: argparse.ArgumentParser) -> None:
    _order_id(parser)
    parser.add_argument("--out", type=Path, required=True, help="folder for weights, loss curve and report")
    add_session_arguments(parser)


def run_fetch(args: argparse.Namespace) -> int:
    from apps.buyer import (
        collect_training,
        order_money,
        round_path_final,
        round_path_units,
        set_aside_digests,
    )
    from apps.demo_report import write_loss_curve
    from veritrain.agentkit import BlobPlane
    from veritrain.blobstore import BlobStore

    session = Session(args)
    client = session.chain()
    with session.market() as api:
        status = api.order_status(args.order_id)
        peers = api.order_peers(args.order_id).peers
        dashboard = api.dashboard_data()
    if status.state != "completed":
        raise InvalidInput(f"order {args.order_id} is {status.state}, not completed: nothing final to fetch")
    events = client.events()
    money, units = order_money(events, status.chain_order_id)
    set_aside_digests(client, units)
    recipe = next((o["recipe"] for o in dashboard["orders"] if o["id"] == args.order_id), "")
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    folder = session.settings.data_dir / "buyer"
    plane = BlobPlane(BlobStore(folder / "blobs"), session.signer(), 0, folder)
    plane.start()
    try:
        round_units = round_path_units(client, status, units, events)  # the final step reuses its last round
        final = round_path_final(plane, peers, status, events, round_units)
        training = collect_training(
            plane,
            units,
            peers,
            out / "final-weights.safetensors",
            recipe=recipe,
            final_digest=str(status.current_state_digest),
            aggregates=frozenset(
                u.chain_unit_id for u in status.units if u.kind == "aggregate" and u.chain_unit_id is not None
            ),
            final=final,
            round_units=round_units,
        )
    finally:
        plane.stop()
    write_loss_curve(training.losses, training.round_boundaries, out / "loss-curve.png")
    report = {
        "order_id": args.order_id,
        "chain_order_id": status.chain_order_id,
        "chain_id": client.chain_id,
        "recipe": recipe,
        "final_state_digest": training.final_state_digest,
        "final_weights": "final-weights.safetensors",
        "loss_curve": "loss-curve.png",
        "losses": training.losses,
        "round_boundaries": training.round_boundaries,
        "units": [
            {
                "chain_unit_id": u.chain_unit_id,
                "settlement": u.settlement,
                "providers": u.providers,
                "outcomes": u.outcomes,
                "result_digests": u.result_digests,
                "slashed_verifiers": u.slashed_verifiers,
            }
            for u in units
        ],
        "deposit": money.deposit,
        "payouts": money.payouts,
        "verifier_fees": money.verifier_fees,
        "refund": money.refund,
    }
    report["final_weights_sha256"] = hashlib.sha256(
        (out / "final-weights.safetensors").read_bytes()
    ).hexdigest()
    (out / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    if args.json:
        print(json.dumps({**report, "out": str(out)}, sort_keys=True))
    else:
        print(
            f"verified final state {training.final_state_digest} (checked against chain {client.chain_id}); "
            f"wrote {out / 'final-weights.safetensors'}, loss-curve.png and report.json "
            f"(loss {training.losses[0]:.4f} -> {training.losses[-1]:.4f})"
        )
    return 0


# --- close --------------------------------------------------------------------------------------------


def configure_close(parser: argparse.ArgumentParser) -> None:
    _order_id(parser)
    parser.add_argument(
        "--wait", type=float, default=120.0, help="seconds to wait for units still settling on chain"
    )
    add_session_arguments(parser)


def run_close(args: argparse.Namespace) -> int:
    from apps.buyer import close_order, veri

    session = Session(args)
    client = session.chain()
    with session.market() as api:
        status = api.order_status(args.order_id)
    account = session.signer()
    refund = close_order(client, status.chain_order_id, account, args.wait)
    credit = client.credits(account)
    if credit:
        client.withdraw_credit(account)
    result = {
        "order_id": args.order_id,
        "chain_order_id": status.chain_order_id,
        "refund": refund,
        "withdrawn": credit,
        "balance": client.token_balance(account),
    }
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(
            f"closed chain order {status.chain_order_id}: refund {veri(refund)} (paid by the close); "
            f"withdrew {veri(credit)} of other credit, "
            f"wallet {veri(result['balance'])}"
        )
    return 0
