"""The `veritrain` command line: one entry point, each subcommand owned by the module that implements it.

Subcommand modules are imported lazily (only the chosen one), so `veritrain --help` stays fast and a
missing optional part breaks only its own command. Each module exposes
``configure(parser: argparse.ArgumentParser) -> None`` and ``run(args: argparse.Namespace) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

# (words, module, help). Keep heavy imports (torch, web3) inside each module's run().
COMMANDS: list[tuple[tuple[str, ...], str, str]] = [
    (("demo",), "veritrain.demo", "run the whole marketplace on embedded defaults and write a report"),
    (("chain", "smoke"), "veritrain.chain.smoke", "deploy, stake, post an order, settle one unit"),
    (("market", "serve"), "market.serve", "run the market API (FastAPI) on embedded defaults or given URLs"),
    (("market", "worker"), "market.worker", "run a Celery worker for the market"),
    (("node", "run"), "node.agent", "run a provider agent"),
    (("verifier", "run"), "verifier.agent", "run a verifier agent"),
    (("bench", "chain"), "veritrain.chain.bench", "gas of each contract action for one 3-replica unit"),
    (("bench", "calibrate"), "verifier.calibrate", "honest-vs-honest distances and tolerances"),
    (("bench", "training"), "veritrain.bench_training", "DiLoCo vs data-parallel, robust rounds, real size"),
    (("bench", "verification"), "verifier.attacks", "run the attack suite against the verifier core"),
    (("bench", "market"), "market.bench", "matching throughput/latency and orchestration overhead"),
]


def _available(module: str) -> bool:
    """True if the module exists (a role package may be absent from a partial install)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """Build the parser; only the module of the command named in argv is imported."""
    parser = argparse.ArgumentParser(
        prog="veritrain", description="Veritrain: verified AI training on idle GPUs"
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
                group_parser = top.add_parser(words[0], help=f"{words[0]} commands")
                groups[words[0]] = group_parser.add_subparsers(dest="subcommand", required=True)
            sub = groups[words[0]].add_parser(words[1], help=help_text)
        sub.set_defaults(_module=module)
        if list(words) == argv[: len(words)]:
            importlib.import_module(module).configure(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(args_list).parse_args(args_list)
    module = importlib.import_module(args._module)
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
