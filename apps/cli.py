"""The `veritrain` command line: one entry point, each subcommand owned by the module that implements it.

Subcommand modules are imported lazily (only the chosen one), so `veritrain --help` stays fast and a
missing optional part breaks only its own command. Each module exposes
``configure(parser: argparse.ArgumentParser) -> None`` and ``run(args: argparse.Namespace) -> int``; a
module holding several commands of one group is named "module:name" and exposes ``configure_<name>`` and
``run_<name>``.

``veritrain --config FILE <command>`` names the TOML configuration for the command and every process it
starts (it sets ``VERITRAIN_CONFIG``; see :mod:`veritrain.settings`).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from veritrain.errors import VeritrainError

# (words, module, help). Keep heavy imports (torch, web3) inside each module's run().
COMMANDS: list[tuple[tuple[str, ...], str, str]] = [
    (("demo",), "apps.demo", "run the whole marketplace on embedded defaults and write a report"),
    (("keys", "new"), "apps.keys:new", "create a key in an encrypted keystore"),
    (("keys", "import"), "apps.keys:import", "encrypt an existing private key into a keystore"),
    (("keys", "list"), "apps.keys:list", "list the keystores and their addresses"),
    (("keys", "address"), "apps.keys:address", "print the address of a keystore"),
    (("config", "show"), "apps.config:show", "print the resolved configuration (secrets redacted)"),
    (("chain", "deploy"), "apps.chain_deploy", "deploy the contracts, write the deployments JSON"),
    (("chain", "fund"), "apps.chain_fund", "development faucet: mint VERI to an address, send it gas"),
    (("chain", "smoke"), "veritrain.chain.smoke", "deploy, stake, post an order, settle one unit"),
    (("market", "serve"), "market.serve", "run the market API (FastAPI) on embedded defaults or given URLs"),
    (("market", "worker"), "market.worker", "run a Celery worker for the market"),
    (("node", "run"), "node.agent", "run a provider agent"),
    (("verifier", "run"), "verifier.agent", "run a verifier agent"),
    (("order", "post"), "apps.order:post", "show the escrow, sign, post an order on chain and to the market"),
    (("order", "status"), "apps.order:status", "an order's rounds, units, verdicts and loss"),
    (("order", "watch"), "apps.order:watch", "live progress of an order until it finishes"),
    (("order", "fetch"), "apps.order:fetch", "verified final weights, loss curve and report of an order"),
    (("order", "close"), "apps.order:close", "close an order and withdraw what is left of its escrow"),
    (
        ("wallet", "status"),
        "apps.wallet:status",
        "a key's tokens, credit, stake and reputation",
    ),
    (
        ("wallet", "withdraw"),
        "apps.wallet:withdraw",
        "withdraw the key's credit to its wallet",
    ),
    (
        ("wallet", "unstake"),
        "apps.wallet:unstake",
        "start unbonding free stake",
    ),
    (("wallet", "release"), "apps.wallet:release", "take thawed stake back to the wallet"),
    (("bench", "chain"), "apps.bench_chain", "gas per contract action and per settled unit, market path too"),
    (("bench", "training"), "apps.bench_training", "DiLoCo vs data-parallel, robust rounds, real size"),
    (("bench", "simulate"), "apps.bench_simulate", "network-scale simulation: time to train, GPU use, cost"),
    (("bench", "calibrate"), "verifier.calibrate", "honest-vs-honest distances and tolerances"),
    (("bench", "verification"), "verifier.attacks", "run the attack suite against the verifier core"),
    (("bench", "market"), "apps.bench_market", "matching throughput/latency and orchestration overhead"),
    (("bench", "collusion"), "apps.bench_collusion", "sybil stake vs stake-weighted random selection"),
    (("bench", "speedup"), "apps.bench_speedup", "speedup_m2: an order's wall time at M = 1 vs M = 2"),
    (("bench", "protocol"), "apps.bench_protocol", "adversaries through market and contracts: gains, losses"),
    (("bench", "economics"), "apps.bench_economics", "does cheating pay; compute multiplier of verification"),
    (("bench", "chaos"), "apps.chaos", "seeded process faults against short orders: lost, paid twice, stuck"),
]


def _available(module: str) -> bool:
    """True if the module exists (a role package may be absent from a partial install)."""
    try:
        return importlib.util.find_spec(module.partition(":")[0]) is not None
    except ModuleNotFoundError:
        return False


def _entry(module: str, kind: str) -> tuple[ModuleType, str]:
    """The imported module of a command and the name of its `configure`/`run` function."""
    name, _, command = module.partition(":")
    return importlib.import_module(name), f"{kind}_{command}" if command else kind


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """Build the parser; only the module of the command named in argv is imported."""
    group_lines = [" ".join([w[0], *(x[1] for x in COMMANDS if x[0][0] == w[0])]) for w, _, _ in COMMANDS]
    parser = argparse.ArgumentParser(
        prog="veritrain",
        description="Veritrain: verified AI training on idle GPUs",
        # wide enough that a group's line ("bench  bench chain|training|…") never wraps, however many
        # commands a group gains: the help column starts at 24 (argparse's default) plus the longest line
        formatter_class=functools.partial(
            argparse.HelpFormatter, width=max(120, 30 + max(len(line) for line in group_lines))
        ),
    )
    parser.add_argument(
        "--config", type=Path, metavar="FILE", help="TOML configuration file (default: $VERITRAIN_CONFIG)"
    )
    groups: dict[str, argparse._SubParsersAction] = {}
    top = parser.add_subparsers(dest="command", required=True)
    for words, module, help_text in COMMANDS:
        if not _available(module):
            continue
        if len(words) == 1:
            sub = top.add_parser(words[0], help=help_text)
        else:
            if words[0] not in groups:
                members = [w[1] for w, m, _ in COMMANDS if w[0] == words[0] and _available(m)]
                group_parser = top.add_parser(words[0], help=f"{words[0]} {'|'.join(members)}")
                groups[words[0]] = group_parser.add_subparsers(dest="subcommand", required=True)
            sub = groups[words[0]].add_parser(words[1], help=help_text)
        sub.set_defaults(_module=module)
        if list(words) == argv[: len(words)]:
            imported, function = _entry(module, "configure")
            getattr(imported, function)(sub)
    return parser


def _command_words(argv: list[str]) -> list[str]:
    """argv without the global options, so the chosen command's words can be recognised."""
    words = list(argv)
    while words and words[0].startswith("--config"):
        words = words[1:] if "=" in words[0] else words[2:]
    return words


def main(argv: list[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(_command_words(args_list)).parse_args(args_list)
    if args.config is not None:
        # the environment carries it to this process's settings and to every process the command starts
        os.environ["VERITRAIN_CONFIG"] = str(args.config.resolve())
    module, function = _entry(args._module, "run")
    try:
        return int(getattr(module, function)(args) or 0)
    except VeritrainError as err:  # a typed refusal (bad config, key, input) is one line, not a traceback
        print(f"veritrain: {type(err).__name__}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
