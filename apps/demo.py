"""`veritrain demo`: the whole marketplace on one machine, as separate processes on loopback.

Why separate processes: the demo must show the real system, not a simulation — a local `hardhat node`,
the market API, a Celery worker with a real broker, five provider agents (one clearly marked dishonest)
and three verifier agents each run as their own OS process and talk over HTTP, JSON-RPC and libp2p, exactly
as they would across machines. A buyer (this process) posts an order to train the language-model recipe,
watches it live and, at the end, proves from on-chain balances and events that every token is accounted
for.

`Marketplace` is the reusable part: the e2e tests start the same stack (on PostgreSQL and Redis when given
URLs), kill a provider mid-unit, and apply the same money checks (apps.demo_report).
"""

from __future__ import annotations

import argparse
import json
import secrets
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from apps.buyer import AUTO_MAX_REPLICAS, TrainingResult, UnitOutcome, order_money
from apps.buyer import collect_training as collect_training_from
from apps.demo_report import (
    Checks,
    Holdings,
    conservation_checks,
    write_loss_curve,
    write_report,
)
from apps.procs import ProcessGroup, free_port, http_ok, signals_ignored, terminate_as_interrupt
from veritrain.errors import ConfigError, DemoCheckFailed, VeritrainError
from veritrain.messages import TRUSTED_STREAK
from veritrain.progress import progress_bar

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from veritrain.chain.client import ChainClient
    from veritrain.chain.tx import Event

TOKEN = 10**18
DEFAULT_RECIPE = "charlm-tiny"
DEFAULT_DISHONEST_STRATEGY = "skip-50pct"
DEV_ACCOUNT_ROLES = ("deployer", "operator", "buyer")  # dev accounts 0..2; providers and verifiers follow
PLANT_KEYS = 2  # keys the demo's plant agent may spend (a caught key is spent)
PROVIDER_FUNDS = 1_000 * TOKEN
# A dishonest demo provider holds 20x an honest one's stake. Replicas are drawn by stake, so it is in
# almost every unit: P(left out of a k = 3 unit among the default 4 honest + 1) = 4/24·3/23·2/22 ≈ 2e-3,
# of a k = 2 unit among 2 honest + 1 = 2/22·1/21 ≈ 4e-3, so out of every unit of a 4-round demo ≈ 1e-11.
# With equal stakes a run missed it often enough (1 in 9 for the dashboard test's 2 units of k = 2
# among 3; 1 in 39 for the default demo) that the demo, which must show a cheat caught, failed its check.
DISHONEST_FUNDS = 20 * PROVIDER_FUNDS
VERIFIER_FUNDS = 500 * TOKEN
BUYER_FUNDS = 1_000 * TOKEN
HONEST_PRICE_PER_PFLOP = TOKEN  # the matching score's reference price
DISHONEST_PRICE_PER_PFLOP = TOKEN // 4  # cheats undercut (the draw ignores price beyond the order's max)
PRICE_STEP_BPS = 10_000  # providers raise their ask by 100 % of base per unit done: work rotates
MAX_PRICE_PER_PFLOP = 30_000 * TOKEN  # about 1 VERI per replica of a 40-step charlm-tiny unit
VERIFIER_FEE_PER_UNIT = TOKEN
POLL_S = 0.5
RUN_MARKER = ".veritrain-demo-run"
# As a process supervisor would (systemd's StartLimitBurst in StartLimitIntervalSec): a worker that died is
# restarted unless it already was this often within the window, which bounds a crash loop, not a long life.
MAX_WORKER_RESTARTS = 3
WORKER_RESTART_WINDOW_S = 300.0


# Honest CPU configurations that change the bits of training (DESIGN.md §4.6): the vector path, the thread
# count (part of the hardware class) and MKL's conditional-numerical-reproducibility mode.
HONEST_CPU_CONFIGURATIONS: tuple[dict[str, str], ...] = (
    {},
    {"ATEN_CPU_CAPABILITY": "default"},
    {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"},
    {"MKL_CBWR": "COMPATIBLE"},
)
# The demo's verifiers each replay in their own configuration, so a disputed unit's majority is reached by
# verifiers whose measured distances differ (they sign outcomes, not their floats).
VERIFIER_CPU_CONFIGURATIONS = (HONEST_CPU_CONFIGURATIONS[0], *HONEST_CPU_CONFIGURATIONS[1::2])


@dataclass(frozen=True)
class DemoConfig:
    """Everything one demo run needs; the defaults are the README's `veritrain demo`."""

    out_dir: Path
    providers: int = 5
    dishonest: int = 1
    dishonest_strategy: str = DEFAULT_DISHONEST_STRATEGY
    dishonest_after: int = 0  # units a dishonest provider trains honestly first (to earn trust)
    verifiers: int = 3  # each unit gets every verifier; a verdict needs a majority of them (2 of 3)
    verifiers_per_unit: int | None = None  # the chain's min_verifiers when not every verifier (None)
    referees: bool = False  # every verifier also sits in VerdictAppeals' referee pool (`--referee`)
    recipe: str = DEFAULT_RECIPE
    rounds: int = 4
    unit_steps: int = 40
    replicas: int = 3  # with adaptive_replication: the most a unit gets
    adaptive_replication: bool = False  # `--replicas auto`: k = 1 for providers past trusted_streak
    trusted_streak: int = TRUSTED_STREAK
    solo_spot_check_ppm: int | None = None  # the chain's audit rate of one-replica units (None: default)
    probation_streak: int | None = None  # valid units before a provider's units may skip verification
    # a funded canary account replays verified units at this rate (market/canary.py); None: no canaries
    canary_rate_ppm: int | None = None
    # the operator's planted cheats (verifier canaries): its plant agent (`node run --plant --plant-keys`,
    # forging with plant_strategy under PLANT_KEYS funded keys, each enrolled by the canary account, the
    # next once one is caught) and the rate at which verified units are replayed for it (needs the canary)
    plant: bool = False
    plant_strategy: str = "start-state"
    plant_rate_ppm: int = 0
    lazy_verifiers: int = 0  # the first N verifiers accept unanimous units unchecked (`verifier run --lazy`)
    shards: int = 1  # M > 1: DiLoCo rounds of M shard units (and an aggregate unit per round: outer_step)
    # folded: the shard units run the outer step (M > 1); None: the spec's default (folded for M > 1)
    outer_step: Literal["unit", "folded"] | None = None
    # rounds: a roster per order, one stepRound per round; None: the market's default (rounds where it can)
    settlement: Literal["units", "rounds"] | None = None
    provider_env: tuple[dict[str, str], ...] = ()  # extra environment of provider i (CPU configurations)
    verifier_env: tuple[dict[str, str], ...] = VERIFIER_CPU_CONFIGURATIONS  # of verifier i, cycled
    seed: int = 2026
    timeout_s: float = 300.0
    database_url: str | None = None
    broker_url: str | None = None
    torch_threads: int = 1
    commit_window_s: int = 180
    reveal_window_s: int = 120
    verdict_window_s: int = 240
    # a verdict's fraud is held this long for an appeal before it is slashed (the default is an hour)
    appeal_window_s: int = 15
    tolerances: Path | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    metrics: bool = False  # serve /metrics on a free port per agent and for the worker

    @property
    def work_dir(self) -> Path:
        """Per-run state of every process (database, blob stores, keys, logs), below the output folder."""
        return self.out_dir / "demo-run"

    @property
    def log_dir(self) -> Path:
        return self.work_dir / "logs"

    def fresh_work_dir(self) -> None:
        """Start from an empty run folder: a new chain must not meet an old database or old unit records.

        Only a folder this demo created (it carries a marker file) is ever deleted."""
        marker = self.work_dir / RUN_MARKER
        if self.work_dir.exists():
            if not marker.exists():
                raise DemoCheckFailed(
                    f"{self.work_dir} exists and was not made by `veritrain demo`; move it away"
                )
            shutil.rmtree(self.work_dir)
        self.work_dir.mkdir(parents=True)
        marker.write_text("created by `veritrain demo`; deleted and recreated by the next run\n")


@dataclass(frozen=True)
class Placement:
    """Where each process of the marketplace runs: the address of its host, and the command prefix that
    starts a process there. Names are "chain", "market" (API and worker) and the parties' names. The
    default is this machine's loopback for all; apps.testbed puts each on a host of its own."""

    addresses: Mapping[str, str] = field(default_factory=dict)
    launch: Callable[[str, list[str]], list[str]] | None = None

    def address(self, name: str) -> str:
        return self.addresses.get(name, "127.0.0.1")

    def wrap(self, name: str, argv: list[str]) -> list[str]:
        return self.launch(name, argv) if self.launch is not None else argv


@dataclass
class Party:
    """One account of the demo and the process (if any) acting for it."""

    role: str
    name: str
    account: LocalAccount
    dishonest_strategy: str | None = None
    plant: bool = False  # the operator's planted cheat (`node run --plant`), never a buyer's provider
    lazy: bool = False  # a verifier that accepts unanimous units without re-executing them
    p2p_port: int = 0
    peer_addr: str = ""
    metrics_port: int = 0

    @property
    def address(self) -> str:
        return str(self.account.address)


def progress_printer(stream: Any = None) -> Callable[[str], None]:
    """Live progress lines with seconds since start, flushed at once (a pipe must not buffer them)."""
    started = time.monotonic()
    out = stream or sys.stdout

    def emit(line: str) -> None:
        out.write(f"[{time.monotonic() - started:6.1f}s] {line}\n")
        out.flush()

    return emit


class Marketplace:
    """A whole Veritrain marketplace on loopback: chain node, market API, worker, agents — all processes.

    `stop()` (or leaving the context) stops every child process by PID, also after a failure or Ctrl-C.
    """

    def __init__(
        self, config: DemoConfig, emit: Callable[[str], None], placement: Placement | None = None
    ) -> None:
        self.config = config
        self.placement = placement or Placement()
        self.emit = emit
        self.procs = ProcessGroup(config.log_dir)
        self.parties: dict[str, Party] = {}
        self.plant_keys: list[LocalAccount] = []  # the plant agent's keys, in the order it spends them
        self.market_port = free_port()
        self.node: Any = None
        self.rpc_url = ""
        self.deployments_path = config.work_dir / "deployments.json"
        self.chain: ChainClient | None = None
        self.killed: set[str] = set()
        # Extra environment per agent name (the chaos bench routes an agent's market and chain traffic
        # through a link of its own), and how to restart an extra child (its private Redis) by name.
        self.agent_env: dict[str, dict[str, str]] = {}
        self.restarters: dict[str, Callable[[], None]] = {}
        self._worker_restarts: list[float] = []  # when the worker was restarted (monotonic clock)
        self._market_launch: tuple[dict[str, str], Path] = ({}, config.work_dir)
        self.worker_metrics_port = free_port() if config.metrics else 0
        self.keystore_folder = config.work_dir / "keystore"
        self.keystore_passphrase = secrets.token_hex(16)

    def __enter__(self) -> Marketplace:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop every child process we started: agents, worker, market, then the chain node."""
        with signals_ignored():
            self.procs.stop_all()
            if self.node is not None:
                self.node.stop()
                self.node = None

    @property
    def market_url(self) -> str:
        return f"http://{self.placement.address('market')}:{self.market_port}"

    @property
    def client(self) -> ChainClient:
        if self.chain is None:
            raise DemoCheckFailed("the chain is not deployed yet")
        return self.chain

    # --- set-up --------------------------------------------------------------------------------------

    def allocate_parties(self) -> None:
        """Give each role a funded dev account: deployer, operator (market relayer), buyer, agents."""
        from veritrain.chain.backends import dev_accounts

        config = self.config
        needed = len(DEV_ACCOUNT_ROLES) + config.providers + config.verifiers + 1 + PLANT_KEYS
        accounts = dev_accounts(max(needed, 20))
        for index, role in enumerate(DEV_ACCOUNT_ROLES):
            self.parties[role] = Party(role=role, name=role, account=accounts[index])
        offset = len(DEV_ACCOUNT_ROLES)
        honest = self.config.providers - self.config.dishonest
        for i in range(self.config.providers):
            strategy = self.config.dishonest_strategy if i >= honest else None
            name = f"provider-{i}" + ("-DISHONEST" if strategy else "")
            self.parties[name] = Party("provider", name, accounts[offset + i], dishonest_strategy=strategy)
        offset += self.config.providers
        for i in range(self.config.verifiers):
            lazy = i < self.config.lazy_verifiers
            name = f"verifier-{i}" + ("-LAZY" if lazy else "")
            self.parties[name] = Party("verifier", name, accounts[offset + i], lazy=lazy)
        offset += self.config.verifiers
        if self.config.canary_rate_ppm is not None:  # the market's canary buyer, an account of its own
            self.parties["canary"] = Party("canary", "canary", accounts[offset])
        if self.config.plant:  # its keys are enrolled by the canary account, whose key the agent holds
            if "canary" not in self.parties:
                raise ConfigError(
                    "a plant agent's keys are enrolled by the canary account: set canary_rate_ppm"
                )
            canary = self.parties["canary"].account
            self.parties["plant"] = Party("provider", "plant", canary, config.plant_strategy, plant=True)
            self.plant_keys = list(accounts[offset + 1 : offset + 1 + PLANT_KEYS])

    def providers(self) -> list[Party]:
        return [p for p in self.parties.values() if p.role == "provider"]

    def verifiers(self) -> list[Party]:
        return [p for p in self.parties.values() if p.role == "verifier"]

    def agents(self) -> list[Party]:
        return self.providers() + self.verifiers()

    def start_chain(self) -> None:
        """Start a local hardhat node (veritrain.chain.HardhatNode stops it by its own PID), or, placed on a
        host of its own, a `hardhat node` listening on that host's address."""
        from veritrain.chain.backends import HardhatNode, find_repo_root

        self.config.log_dir.mkdir(parents=True, exist_ok=True)
        if "chain" not in self.placement.addresses:
            self.node = HardhatNode(log_path=self.config.log_dir / "hardhat-node.log").start()
            self.rpc_url = self.node.url
            self.emit(f"chain: hardhat node pid {self.node.pid} on {self.rpc_url}")
            return
        root = find_repo_root()
        host, port = self.placement.address("chain"), free_port()
        hardhat = str(root / "node_modules" / ".bin" / "hardhat")
        argv = [hardhat, "node", "--hostname", host, "--port", str(port)]
        env = {"HARDHAT_DISABLE_TELEMETRY_PROMPT": "true"}
        self.procs.start("chain", self.placement.wrap("chain", argv), env=env, cwd=root)
        self.rpc_url = f"http://{host}:{port}"
        self.procs.wait_ready("chain", lambda: _rpc_ok(self.rpc_url), timeout=60)
        self.emit(f"chain: hardhat node pid {self.procs['chain'].pid} on {self.rpc_url}")

    def deploy_and_fund(self) -> None:
        """Deploy the contracts (short windows for a demo) and mint tokens to the buyer and the agents."""
        from veritrain.chain.client import ChainClient
        from veritrain.chain.deployment import AppealParams, MarketParams

        params = MarketParams(
            commit_window=self.config.commit_window_s,
            reveal_window=self.config.reveal_window_s,
            verdict_window=self.config.verdict_window_s,
            min_verifiers=self.config.verifiers_per_unit or self.config.verifiers,
        )
        if self.config.solo_spot_check_ppm is not None:
            params = replace(params, solo_spot_check_ppm=self.config.solo_spot_check_ppm)
        if self.config.probation_streak is not None:
            params = replace(params, probation_streak=self.config.probation_streak)
        from veritrain.chain.backends import RpcBackend

        self.chain = ChainClient.deploy(
            RpcBackend(self.rpc_url),
            self.parties["deployer"].account,
            operator=self.parties["operator"].account,
            params=params,
            appeal_params=AppealParams(appeal_window=self.config.appeal_window_s),
            save_to=self.deployments_path,
        )
        deployment = self.chain.deployment
        self.emit(
            f"chain: deployed VeriToken {deployment.token}, StakeManager {deployment.stake_manager}, "
            f"JobMarket {deployment.job_market}"
        )
        self.chain.mint(self.parties["buyer"].account, BUYER_FUNDS)
        for party in self.providers():
            funds = DISHONEST_FUNDS if party.dishonest_strategy else PROVIDER_FUNDS
            if not party.plant:  # the plant works under keys of its own, funded below
                self.chain.mint(party.account, funds)
        for party in self.verifiers():
            self.chain.mint(party.account, VERIFIER_FUNDS)
        if "canary" in self.parties:
            self.chain.mint(self.parties["canary"].account, BUYER_FUNDS)
        for key in self.plant_keys:  # funded on their own, like any provider: nothing links them on chain
            self.chain.mint(key, PROVIDER_FUNDS)
        self.emit(
            f"chain: minted {BUYER_FUNDS // TOKEN} VERI to the buyer, {PROVIDER_FUNDS // TOKEN} to each "
            f"honest provider, {DISHONEST_FUNDS // TOKEN} to each dishonest one, "
            f"{VERIFIER_FUNDS // TOKEN} to each verifier"
        )

    def child_env(self, data_dir: Path) -> dict[str, str]:
        """Environment every child gets: its own data dir, and the shared chain, market, database, broker."""
        market_dir = self.config.work_dir / "market"
        env = {
            "VERITRAIN_DATA_DIR": str(data_dir),
            "VERITRAIN_CHAIN_RPC_URL": self.rpc_url,
            "VERITRAIN_CHAIN_ID": str(self.client.chain_id),
            "VERITRAIN_DEPLOYMENTS_FILE": str(self.deployments_path),
            "VERITRAIN_MARKET_URL": self.market_url,
            "VERITRAIN_MARKET_HOST": self.placement.address("market"),
            "VERITRAIN_MARKET_PORT": str(self.market_port),
            "VERITRAIN_DATABASE_URL": self.config.database_url
            or f"sqlite:///{market_dir / 'market.sqlite3'}",
            "OMP_NUM_THREADS": str(self.config.torch_threads),
            "MKL_NUM_THREADS": str(self.config.torch_threads),
            "HARDHAT_DISABLE_TELEMETRY_PROMPT": "true",
            "VERITRAIN_KEYSTORE_PASSWORD": self.keystore_passphrase,
        }
        if self.config.broker_url:  # else API and worker share a filesystem:// broker in the market dir
            env["VERITRAIN_BROKER_URL"] = self.config.broker_url
            env["VERITRAIN_RESULT_BACKEND_URL"] = self.config.broker_url
        env.update(self.config.extra_env)
        return env

    def write_keystore(self, party: Party) -> Path:
        """The party's key in an encrypted keystore (cheap scrypt: these are the public dev accounts); the
        run's random passphrase reaches the children in their environment, never on a command line."""
        from veritrain.keys import encrypt_key, write_keystore

        path = self.keystore_folder / f"{party.name}.json"
        if not path.exists():
            keystore = encrypt_key(bytes(party.account.key), self.keystore_passphrase, light=True)
            write_keystore(self.keystore_folder, party.name, keystore)
        return path

    def write_plant_keys(self) -> Path:
        """The plant agent's keys, one keystore each, named so that they are spent in order."""
        from veritrain.keys import encrypt_key, write_keystore

        folder = self.config.work_dir / "plant-keys"
        for index, key in enumerate(self.plant_keys):
            if not (folder / f"plant-{index}.json").exists():
                keystore = encrypt_key(bytes(key.key), self.keystore_passphrase, light=True)
                write_keystore(folder, f"plant-{index}", keystore)
        return folder

    def cli(self, *words: str) -> list[str]:
        """A `veritrain` subcommand run by this interpreter (needs no installed console script)."""
        return [sys.executable, "-m", "apps", *words]

    def start_market(self) -> None:
        """Start the market API and one Celery worker; return once the API answers."""
        market_dir = self.config.work_dir / "market"
        market_dir.mkdir(parents=True, exist_ok=True)
        env = self.child_env(market_dir)
        env["VERITRAIN_KEYSTORE"] = str(self.write_keystore(self.parties["operator"]))
        if self.config.canary_rate_ppm is not None:  # the canary account also enrolls the plant's keys
            env["VERITRAIN_CANARY_KEY"] = self.parties["canary"].account.key.hex()
            env["VERITRAIN_CANARY_RATE_PPM"] = str(self.config.canary_rate_ppm)
            env["VERITRAIN_PLANT_RATE_PPM"] = str(self.config.plant_rate_ppm)
        self._market_launch = (env, market_dir)
        self.start_market_process("market")
        self.start_market_process("worker")
        self.wait_market_ready()
        self.emit(
            f"market: API pid {self.procs['market'].pid} on {self.market_url}, "
            f"Celery worker pid {self.procs['worker'].pid}"
        )

    def start_market_process(self, name: str) -> None:
        """Start the market's API ("market") or its Celery worker ("worker") with the environment and
        folder start_market gave it (each child runs in its own folder: what a library writes to its cwd
        stays with it); also how a killed one is restarted."""
        env, cwd = self._market_launch
        argv = self.cli("market", "serve") if name == "market" else self.worker_argv()
        self.procs.start(name, self.placement.wrap("market", argv), env=env, cwd=cwd)

    def wait_market_ready(self) -> None:
        self.procs.wait_ready("market", lambda: http_ok(f"{self.market_url}/health"), timeout=90)

    def restart(self, name: str) -> None:
        """Start a killed child again as it was started: an agent (same key, data dir, libp2p identity and
        port), the market API (same port, database, broker; returns once it answers) or the worker."""
        self.killed.discard(name)
        if name in self.restarters:
            self.restarters[name]()
        elif name in ("market", "worker"):
            self.start_market_process(name)
            if name == "market":
                self.wait_market_ready()
        else:
            self.start_agent(self.parties[name])

    def worker_argv(self) -> list[str]:
        argv = self.cli("market", "worker")
        return [*argv, "--metrics-port", str(self.worker_metrics_port)] if self.worker_metrics_port else argv

    def agent_argv(self, party: Party) -> list[str]:
        command = "node" if party.role == "provider" else "verifier"
        argv = self.cli(
            command,
            "run",
            "--keystore",
            str(self.write_keystore(party)),
            "--p2p-port",
            str(party.p2p_port),
            "--p2p-host",
            self.placement.address(party.name),
            "--name",
            party.name,
        )
        if party.metrics_port:
            argv += ["--metrics-port", str(party.metrics_port)]
        if party.role == "verifier" and self.config.tolerances is not None:
            argv += ["--tolerances", str(self.config.tolerances)]
        if party.role == "verifier" and self.config.referees:
            argv.append("--referee")
        if party.lazy:
            argv.append("--lazy")
        if party.role == "provider":
            price = DISHONEST_PRICE_PER_PFLOP if party.dishonest_strategy else HONEST_PRICE_PER_PFLOP
            index = self.providers().index(party)
            argv += [
                "--price-per-pflop",
                str(price + index * TOKEN // 100),
                "--price-step-bps",
                str(PRICE_STEP_BPS),
            ]
            if party.dishonest_strategy:
                argv += ["--dishonest", party.dishonest_strategy]
                after = ["--dishonest-after", str(self.config.dishonest_after)]
                argv += ["--plant", "--plant-keys", str(self.write_plant_keys())] if party.plant else after
        return argv

    def start_agent(self, party: Party) -> None:
        """Start one provider or verifier agent with its own key, data dir and libp2p identity and port."""
        from veritrain.p2p import load_or_create_peer_key, peer_id_of

        data_dir = self.config.work_dir / party.name
        data_dir.mkdir(parents=True, exist_ok=True)
        if not party.p2p_port:
            party.p2p_port = free_port()
        if self.config.metrics and not party.metrics_port:
            party.metrics_port = free_port()
        peer_id = peer_id_of(load_or_create_peer_key(data_dir / "peer.key"))
        party.peer_addr = f"/ip4/{self.placement.address(party.name)}/tcp/{party.p2p_port}/p2p/{peer_id}"
        argv = self.placement.wrap(party.name, self.agent_argv(party))
        env = self.child_env(data_dir)
        env.update(self.cpu_configuration(party))
        env.update(self.agent_env.get(party.name, {}))
        self.procs.start(party.name, argv, env=env, cwd=data_dir)
        marker = f" *** DISHONEST ({party.dishonest_strategy}) ***" if party.dishonest_strategy else ""
        self.emit(f"{party.name}: pid {self.procs[party.name].pid}, {party.address}{marker}")

    def cpu_configuration(self, party: Party) -> dict[str, str]:
        """The extra environment that puts an agent in its CPU configuration ({} = the machine's default)."""
        if party.role == "provider" and self.providers().index(party) < len(self.config.provider_env):
            return self.config.provider_env[self.providers().index(party)]
        if party.role == "verifier" and self.config.verifier_env:
            envs = self.config.verifier_env
            return envs[self.verifiers().index(party) % len(envs)]
        return {}

    def check_children(self) -> None:
        """Fail fast, with its log tail, if a child process died that was not killed on purpose.

        The Celery worker is the exception: its tasks are idempotent and its queue outlives it, so a worker
        that died is restarted, as any process supervisor would do, up to MAX_WORKER_RESTARTS times within
        WORKER_RESTART_WINDOW_S (a marketplace that serves many orders, as the chaos bench's does, may see
        its worker's deaf exit 75 many times in its life)."""
        worker = next((proc for proc in self.procs if proc.name == "worker"), None)
        if worker is not None and not worker.alive():
            now = time.monotonic()
            self._worker_restarts = [t for t in self._worker_restarts if now - t < WORKER_RESTART_WINDOW_S]
            if len(self._worker_restarts) < MAX_WORKER_RESTARTS:
                self._worker_restarts.append(now)
                self.emit(
                    f"market: Celery worker exited with code {worker.returncode()}; restarting it "
                    f"({len(self._worker_restarts)} in {WORKER_RESTART_WINDOW_S:.0f} s, at most "
                    f"{MAX_WORKER_RESTARTS}), see {worker.log_path}"
                )
                self.start_market_process("worker")
        self.procs.check_alive([proc.name for proc in self.procs if proc.name not in self.killed])

    def kill(self, name: str) -> None:
        """SIGKILL one child (tests: a provider crashing mid-unit); it is no longer expected to live."""
        self.killed.add(name)
        self.procs.kill(name)

    def staker(self, party: Party) -> str:
        """The address an agent stakes and works under: its own, or for the plant its current key."""
        from node.plant import current_plant

        plant = current_plant(self.client, self.plant_keys) if party.plant else None
        return party.address if plant is None else str(plant.address)

    def wait_agents_staked(self, timeout: float = 120.0) -> None:
        """Return once every agent has bonded its stake on chain (they register before they stake)."""
        deadline = time.monotonic() + timeout
        pending = {party.name for party in self.agents()}
        while pending:
            self.check_children()
            for party in self.agents():
                bonded = self.client.stake_of(self.staker(party)).bonded
                if party.name in pending and bonded > 0:
                    pending.discard(party.name)
                    self.emit(f"{party.name}: registered and staked {bonded // TOKEN} VERI")
            if pending and time.monotonic() > deadline:
                raise DemoCheckFailed(f"agents not staked after {timeout:.0f} s: {sorted(pending)}")
            time.sleep(POLL_S)

    # --- snapshots and money -------------------------------------------------------------------------

    def holdings(self) -> Holdings:
        """Wallets, stakes and credits of every party, plus what each contract holds, read from the chain."""
        client = self.client
        wallets = {p.address: client.token_balance(p.account) for p in self.parties.values()}
        stakes = {
            p.address: client.stake_of(p.account).bonded + client.stake_of(p.account).unbonding
            for p in self.parties.values()
        }
        credits = {p.address: client.credits(p.account) for p in self.parties.values()}
        deployment = client.deployment
        contracts = {name: client.token_balance(address) for name, address in deployment.addresses.items()}
        supply = int(client.token.functions.totalSupply().call())
        return Holdings(
            wallets=wallets, stakes=stakes, credits=credits, contracts=contracts, total_supply=supply
        )

    def events(self, from_block: int) -> list[Event]:
        """Every decoded JobMarket event since `from_block`, in chain order."""
        client = self.client
        from eth_typing import ChecksumAddress, HexAddress, HexStr

        address = ChecksumAddress(HexAddress(HexStr(client.deployment.job_market)))
        logs = client.w3.eth.get_logs({"address": address, "fromBlock": from_block, "toBlock": "latest"})
        decoded = (client.transactor.event_decoder.decode(log) for log in logs)
        return [event for event in decoded if event is not None]

    def withdraw_all_credits(self) -> None:
        """Every party with credit withdraws it by a signed message the deployer relays (no gas needed)."""
        client = self.client
        relayer = self.parties["deployer"].account
        for party in self.parties.values():
            if client.credits(party.account) > 0:
                signed = client.sign_withdraw_credit(party.account, client.deadline(600))
                client.withdraw_credit_with_sig(party.account, signed, relayer=relayer)


def _rpc_ok(url: str) -> bool:
    from veritrain.chain.backends import RpcBackend
    from veritrain.chain.errors import RpcUnavailable

    try:
        return RpcBackend(url, timeout=1.0).chain_id > 0
    except RpcUnavailable:
        return False


class Buyer:
    """The demo's buyer: posts and escrows the order, watches it, closes it and collects the results."""

    def __init__(self, market: Marketplace) -> None:
        self.market = market
        self.party = market.parties["buyer"]
        self.chain_order_id = 0
        self.order_id = 0
        self.posted_block = 0

    def post_order(self) -> None:
        """Escrow the order on chain at the max price (by permit), then register its spec with the market."""
        from apps.buyer import escrow_for, post_order
        from veritrain.api_client import MarketRefused
        from veritrain.datasets import load_dataset
        from veritrain.messages import OrderSpec
        from veritrain.recipes import get_recipe

        config, client = self.market.config, self.market.client
        fields: dict[str, Any] = {
            "buyer": self.party.address,
            "recipe": config.recipe,
            "dataset_digest": "0x" + load_dataset(get_recipe(config.recipe).dataset).digest_hex,
            "total_steps": config.rounds * config.unit_steps,
            "unit_steps": config.unit_steps,
            "replicas": config.replicas,
            "adaptive_replication": config.adaptive_replication,
            "trusted_streak": config.trusted_streak,
            "shards": config.shards,
            "seed": config.seed,
            "max_price_per_pflop": MAX_PRICE_PER_PFLOP,
            "verifier_fee_per_unit": VERIFIER_FEE_PER_UNIT,
            "deadline": client.pending_time() + 3600,
        }
        if config.outer_step is not None:  # else the spec's default (folded for M > 1)
            fields["outer_step"] = config.outer_step
        spec = OrderSpec.model_validate(fields)
        plan = escrow_for(spec, config.settlement)
        try:
            posted = post_order(
                client, self.party.account, spec, plan, self.market.market_url, settlement=config.settlement
            )
        except MarketRefused as err:
            raise DemoCheckFailed(f"the market refused the order: {err}") from err
        self.chain_order_id, self.order_id = posted.chain_order_id, posted.market_order_id
        self.posted_block = posted.posted_block
        self.market.emit(
            f"buyer: order {self.chain_order_id} posted — {config.recipe}, {config.rounds} rounds x "
            f"{config.shards} shard(s) x {config.unit_steps} steps, "
            f"k = {'auto, at most ' if config.adaptive_replication else ''}{config.replicas}, "
            f"escrow {plan.total / TOKEN:.4f} VERI "
            f"({plan.price_per_replica / TOKEN:.4f} per replica, {plan.verifier_fee_per_unit / TOKEN:.1f} "
            "verifier fee per unit)"
        )

    def status(self) -> dict[str, Any]:
        from veritrain.api_client import MarketClient

        with MarketClient(self.market.market_url, timeout=30) as api:
            return api.order_status(self.order_id).model_dump(mode="json")

    def wait_completed(
        self, deadline: float, on_tick: Callable[[dict[str, Any]], None] | None = None
    ) -> None:
        """Poll the order until it completes, printing each unit's state changes as they happen."""
        seen: dict[int, str] = {}
        names = {party.address: party.name for party in self.market.parties.values()}
        while True:
            self.market.check_children()
            status = self.status()
            for unit in status["units"]:
                line = f"{unit['state']}"
                if seen.get(unit["unit_id"]) != line:
                    seen[unit["unit_id"]] = line
                    who = ", ".join(names.get(p, p[:10]) for p in unit["providers"]) or "-"
                    self.market.emit(
                        f"round {unit['round_index'] + 1}/{status['rounds_total']} unit {unit['unit_id']} "
                        f"({_unit_label(unit)}attempt {unit['attempt']}): {unit['state']:<10} "
                        f"providers [{who}]"
                    )
            if on_tick is not None:
                on_tick(status)
            if status["state"] == "completed":
                return
            if status["state"] in ("expired", "cancelled"):
                raise DemoCheckFailed(f"order ended {status['state']}")
            if time.monotonic() > deadline:
                raise DemoCheckFailed(
                    f"order not completed in time (state {status['state']}, "
                    f"{status['rounds_accepted']}/{status['rounds_total']} rounds accepted)"
                )
            time.sleep(POLL_S)

    def wait_truth_fixed(self, deadline: float) -> None:
        """Wait until the chain settled every replica a verdict of this order called fraud: the chain holds
        them until nobody appealed within the appeal window, then the market relays the settlement."""
        from apps.buyer import order_money

        announced = False
        while True:
            money, _ = order_money(self.market.events(self.posted_block), self.chain_order_id)
            if money.held_replicas == 0:
                return
            if not announced:
                self.market.emit(
                    f"buyer: {money.held_replicas} replica(s) a verdict called fraud are held for the "
                    f"{self.market.config.appeal_window_s} s appeal window before the chain slashes them"
                )
                announced = True
            self.market.check_children()
            if time.monotonic() > deadline:
                raise DemoCheckFailed(f"{money.held_replicas} replica(s) still held after the timeout")
            time.sleep(POLL_S)

    def close(self, deadline: float) -> None:
        """Close the order (the close pays the buyer its leftover escrow); waits for settlements to land:
        a completed round-path order's roster first (`wait_roster_closed`)."""
        from apps.buyer import close_order

        if self.status()["state"] == "completed":
            self.wait_roster_closed(deadline)
        close_order(self.market.client, self.chain_order_id, self.party.account, deadline - time.monotonic())

    def wait_roster_closed(self, deadline: float) -> None:
        """A round-path order pays its roster's slots only at `closeRoster`, which the market sends once
        every round is revealed, no set-aside unit is open and its last audit posting's challenge window has
        passed: wait for it (an order without a roster returns at once), so the money checks see it."""
        announced = False
        while (roster := self.status()["roster"]) is not None and roster["state"] != "closed":
            if not announced:
                self.market.emit("buyer: waiting for the market to close the order's roster (its payouts)")
                announced = True
            self.market.check_children()
            if time.monotonic() > deadline:
                raise DemoCheckFailed(f"the order's roster is still {roster['state']} after the timeout")
            time.sleep(POLL_S)


def _unit_label(unit: dict[str, Any]) -> str:
    if unit["kind"] == "aggregate":
        return "aggregate, "
    return f"shard {unit['shard']}, " if unit["shard"] else ""


def collect_training(
    market: Marketplace, units: list[UnitOutcome], status: dict[str, Any], out_dir: Path
) -> TrainingResult:
    """Fetch the verified results from the providers over libp2p (apps.buyer.collect_training): each
    training unit's PoL manifest and the order's final state (for M > 1 the last aggregate's output, or on
    the round path the buyer's own last outer step)."""
    from apps.buyer import round_path_final, round_path_units, set_aside_digests
    from veritrain.agentkit import BlobPlane
    from veritrain.blobstore import BlobStore
    from veritrain.messages import OrderStatus

    folder = market.config.work_dir / "buyer"
    peers = {party.address: party.peer_addr for party in market.providers()}
    plane = BlobPlane(BlobStore(folder / "blobs"), market.parties["buyer"].account, free_port(), folder)
    set_aside_digests(market.client, units)
    events, order = market.client.events(), OrderStatus.model_validate(status)
    plane.start()
    try:
        round_units = round_path_units(market.client, order, units, events)
        final = round_path_final(plane, peers, order, events, round_units)
        return collect_training_from(
            plane,
            units,
            peers,
            out_dir / "final-weights.safetensors",
            recipe=market.config.recipe,
            final_digest=str(status["current_state_digest"]),
            aggregates=frozenset(u["chain_unit_id"] for u in status["units"] if u["kind"] == "aggregate"),
            final=final,
            round_units=round_units,
        )
    finally:
        plane.stop()


def start_stack(market: Marketplace, before_agents: Callable[[Marketplace], None] | None = None) -> Holdings:
    """Chain, contracts, market + worker, then every agent; returns once all agents are staked, with the
    on-chain holdings taken after funding (before anything was staked or spent). `before_agents` runs
    when the market and chain listen but no agent has started (the chaos bench opens their links)."""
    market.allocate_parties()
    market.start_chain()
    market.deploy_and_fund()
    before = market.holdings()
    market.start_market()
    if before_agents is not None:
        before_agents(market)
    for party in market.agents():
        market.start_agent(party)
    market.wait_agents_staked()
    return before


def _describe_cpu(env: dict[str, str]) -> str:
    return " ".join(f"{key}={value}" for key, value in sorted(env.items())) or "machine default"


def build_report(
    market: Marketplace,
    buyer: Buyer,
    before: Holdings,
    after: Holdings,
    training: TrainingResult | None,
    started: float,
) -> tuple[dict[str, Any], Checks]:
    """The report dictionary and its acceptance checks, from chain events and balances."""
    client = market.client
    money, units = order_money(market.events(buyer.posted_block), buyer.chain_order_id)
    names = {party.address: party.name for party in market.parties.values()}
    providers = [p.address for p in market.providers() if not p.plant]
    verifiers = [p.address for p in market.verifiers()]
    checks = Checks()
    conservation_ok = conservation_checks(
        money,
        before,
        after,
        buyer=buyer.party.address,
        providers=providers,
        verifiers=verifiers,
        checks=checks,
    )
    dishonest = [p.address for p in market.providers() if p.dishonest_strategy and not p.plant]
    honest = [p.address for p in market.providers() if not p.dishonest_strategy]
    checks.check(
        "dishonest_slashed",
        all(money.slashed.get(a, 0) > 0 for a in dishonest),
        f"slashed: { {names[a]: v for a, v in money.slashed.items()} }",
    )
    # replicas are drawn by stake, so an honest provider may get no unit (about 1 run in 30 of the
    # default demo): it is owed nothing; every honest provider that worked a unit must have been paid
    worked = [a for a in honest if any(a in u.providers for u in units)]
    checks.check(
        "honest_paid",
        bool(worked) and all(money.payouts.get(a, 0) > 0 for a in worked),
        f"paid: { {names[a]: v for a, v in money.payouts.items()} }; "
        f"never drawn: {[names[a] for a in honest if a not in worked]}",
    )
    checks.check("honest_never_slashed", not any(money.slashed.get(a, 0) for a in honest))
    verifier_cpu = {p.address: _describe_cpu(market.cpu_configuration(p)) for p in market.verifiers()}
    if dishonest and len(set(verifier_cpu.values())) > 1:
        # a dispute must settle although the verifiers' replays differ in the last bits
        verdicts = {
            u.chain_unit_id: sorted({verifier_cpu[v] for v in u.signing_verifiers})
            for u in units
            if u.settlement == "verdict"
        }
        checks.check(
            "verdicts_across_cpu_configurations",
            bool(verdicts) and all(len(configs) > 1 for configs in verdicts.values()),
            f"signing verifiers' CPU configurations per verdict unit: {verdicts}",
        )
    initial_loss = training.losses[0] if training else float("nan")
    final_loss = training.losses[-1] if training else float("nan")
    checks.check("loss_decreased", final_loss < initial_loss, f"{initial_loss:.4f} -> {final_loss:.4f}")

    def balances(snapshot: Holdings) -> dict[str, dict[str, Any]]:
        return {
            party.name: {
                "address": party.address,
                "wallet": snapshot.wallets[party.address],
                "stake": snapshot.stakes[party.address],
                "credit": snapshot.credits[party.address],
            }
            for party in market.parties.values()
            if party.role != "deployer"
        }

    report: dict[str, Any] = {
        "units": [
            {
                "chain_unit_id": unit.chain_unit_id,
                "settlement": unit.settlement,
                "replicas": [
                    {
                        "provider": provider,
                        "name": names.get(provider, provider),
                        "outcome": outcome,
                        "result_digest": unit.result_digests.get(provider),
                        "slashed": unit.slashed.get(provider, 0),
                    }
                    for provider, outcome in zip(
                        unit.providers, unit.outcomes or ["open"] * len(unit.providers), strict=True
                    )
                ],
                "verifiers": [names.get(v, v) for v in unit.verifiers],
                "signing_verifiers": [names.get(v, v) for v in unit.signing_verifiers],
            }
            for unit in units
        ],
        "verifier_cpu": {names[a]: config for a, config in verifier_cpu.items()},
        "slashed": sorted(money.slashed),
        "slashed_verifiers": {names.get(a, a): v for a, v in money.slashed_verifiers.items()},
        "payouts": {names[a]: v for a, v in money.payouts.items()},
        "deposit": money.deposit,
        "verifier_fees": money.verifier_fees,
        "refund": money.refund,
        "held_refunds": money.held_refunds,
        "balances": {"before": balances(before), "after": balances(after)},
        "total_supply": {"before": before.total_supply, "after": after.total_supply},
        "reputation": {party.name: vars(client.reputation(party.account)) for party in market.agents()},
        "conservation_ok": conservation_ok,
        "initial_loss": initial_loss,
        "final_loss": final_loss,
        "losses": training.losses if training else [],
        "final_state_digest": training.final_state_digest if training else None,
        "final_weights": training.weights_path.name if training else None,
        "loss_curve": "loss-curve.png" if training else None,
        "checks": checks.results,
        "check_details": checks.details,
        "order": {
            "chain_order_id": buyer.chain_order_id,
            "market_order_id": buyer.order_id,
            "recipe": market.config.recipe,
            "rounds": market.config.rounds,
            "unit_steps": market.config.unit_steps,
            "replicas": market.config.replicas,
            "shards": market.config.shards,
        },
        "wall_time_s": round(time.monotonic() - started, 1),
    }
    return report, checks


@contextmanager
def marketplace(
    config: DemoConfig, emit: Callable[[str], None], placement: Placement | None = None
) -> Iterator[Marketplace]:
    """A marketplace that is stopped whatever happens (failure, Ctrl-C, SIGTERM)."""
    config.fresh_work_dir()
    with terminate_as_interrupt(), Marketplace(config, emit, placement) as market:
        yield market


def run_demo(config: DemoConfig, emit: Callable[[str], None]) -> dict[str, Any]:
    """Run the whole demo, write the report; raise DemoCheckFailed if an acceptance check fails."""
    started = time.monotonic()
    deadline = started + config.timeout_s
    with marketplace(config, emit) as market:
        before = start_stack(market)
        buyer = Buyer(market)
        buyer.post_order()
        with progress_bar("rounds accepted", config.rounds) as rounds_bar:
            buyer.wait_completed(deadline, on_tick=lambda status: rounds_bar(status["rounds_accepted"]))
        buyer.close(deadline)
        buyer.wait_truth_fixed(deadline)
        market.withdraw_all_credits()
        after = market.holdings()
        emit(
            "buyer: order closed (the closes paid), every credit left withdrawn; fetching results over libp2p"
        )
        _, units = order_money(market.events(buyer.posted_block), buyer.chain_order_id)
        training = collect_training(market, units, buyer.status(), config.out_dir)
        write_loss_curve(training.losses, training.round_boundaries, config.out_dir / "loss-curve.png")
        report, checks = build_report(market, buyer, before, after, training, started)
    write_report(config.out_dir / "demo-report.json", report)
    print_summary(report, emit)
    if not checks.all_ok:
        raise DemoCheckFailed(
            f"acceptance checks failed: {checks.failed()} — see {config.out_dir / 'demo-report.json'}"
        )
    return report


def print_summary(report: dict[str, Any], emit: Callable[[str], None]) -> None:
    for unit in report["units"]:
        replicas = ", ".join(f"{r['name']}={r['outcome']}" for r in unit["replicas"])
        emit(f"unit {unit['chain_unit_id']}: {unit['settlement']}: {replicas}")
    emit(
        f"deposit {report['deposit'] / TOKEN:.4f} = payouts {sum(report['payouts'].values()) / TOKEN:.4f} + "
        f"verifier fees {report['verifier_fees'] / TOKEN:.4f} + refund {report['refund'] / TOKEN:.4f} + "
        f"fraud's prices refunded {report['held_refunds'] / TOKEN:.4f} VERI"
    )
    emit(f"slashed: {report['slashed']}")
    emit(f"loss {report['initial_loss']:.4f} -> {report['final_loss']:.4f}")
    for name, ok in report["checks"].items():
        emit(f"check {name}: {'ok' if ok else 'FAILED'}")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=None, help="folder for the report (default: current dir)")
    parser.add_argument("--providers", type=int, default=5)
    parser.add_argument(
        "--verifiers", type=int, default=3, help="verifiers per unit; a verdict needs a majority of them"
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="rounds of the order (default: 4 / shards, the same compute)"
    )
    parser.add_argument("--unit-steps", type=int, default=40)
    parser.add_argument(
        "--replicas",
        type=_replicas,
        default=3,
        help="replicas per unit (1-5), or 'auto': adaptive, at most 3 (1 for providers with a streak)",
    )
    parser.add_argument(
        "--shards", type=int, default=1, help="M shards per round (M > 1: DiLoCo, by default folded)"
    )
    parser.add_argument(
        "--outer-step",
        choices=("unit", "folded"),
        default=None,
        help="M > 1: the outer step as an aggregate unit per round (unit) or run by the next round's shard "
        "units themselves (folded, the default: its rounds settle on the round path where the order can, "
        "the buyer running the last outer step; per unit, one aggregate unit after the last round)",
    )
    parser.add_argument(
        "--settlement",
        choices=("units", "rounds"),
        default=None,
        help="settle each unit on chain (units) or the order's rounds by one roster, one step per round "
        "(rounds: needs a folded outer step and a fixed --replicas); default: the market's, rounds where "
        "the order can take them",
    )
    parser.add_argument("--dishonest-strategy", default=DEFAULT_DISHONEST_STRATEGY)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before the demo gives up")
    parser.add_argument("--database-url", default=None, help="market database (default: a SQLite file)")
    parser.add_argument("--broker-url", default=None, help="Celery broker (default: filesystem://)")
    parser.add_argument(
        "--json", action="store_true", help="print the report as JSON on stdout (progress goes to stderr)"
    )


def _replicas(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"give a number of replicas or 'auto', not {text!r}") from None


def run(args: argparse.Namespace) -> int:
    config = DemoConfig(
        out_dir=(args.out or Path.cwd()).resolve(),
        providers=args.providers,
        verifiers=args.verifiers,
        rounds=args.rounds or max(1, DemoConfig.rounds // args.shards),
        unit_steps=args.unit_steps,
        replicas=AUTO_MAX_REPLICAS if args.replicas == "auto" else args.replicas,
        adaptive_replication=args.replicas == "auto",
        shards=args.shards,
        outer_step=args.outer_step,
        settlement=args.settlement,
        dishonest_strategy=args.dishonest_strategy,
        timeout_s=args.timeout,
        database_url=args.database_url,
        broker_url=args.broker_url,
    )
    emit = progress_printer(sys.stderr if args.json else None)
    try:
        report = run_demo(config, emit)
    except DemoCheckFailed as err:
        emit(f"FAILED: {err}")
        return 1
    except VeritrainError as err:
        emit(f"ERROR: {type(err).__name__}: {err}")
        return 2
    except KeyboardInterrupt:
        emit("interrupted: every child process was stopped")
        return 130
    emit(f"report: {config.out_dir / 'demo-report.json'} ({report['wall_time_s']} s)")
    if args.json:
        print(json.dumps(report, sort_keys=True))
    return 0


def measure_orchestration_overhead(
    work_dir: Path,
    target_direct_s: float = 60.0,
    recipe: str = DEFAULT_RECIPE,
    emit: Callable[[str], None] | None = None,
) -> dict[str, float]:
    """Wall time of a verified k = 1 order through the market ÷ the same training run done directly.

    The stack (chain, API, worker, one provider, one verifier) is started first and not timed. Then, with
    the same processes idling in the background: the direct run (node.unit.run_unit in this process, one
    torch thread like an agent), its length chosen from a short timed probe so that it takes about
    `target_direct_s`; then the same unit as an order, timed from posting until the market reports it
    completed — matching, signed accept, assignment on chain, training, commit, reveal, spot check if
    drawn, settlement; then the direct run once more. The ratio divides by the mean of the two direct runs.
    """
    import torch

    from node.unit import run_unit
    from veritrain.datasets import load_dataset
    from veritrain.messages import default_checkpoint_every
    from veritrain.pol import UnitSpec, initial_state, train_steps
    from veritrain.recipes import get_recipe

    say = emit or progress_printer()
    torch.set_num_threads(1)
    recipe_config = get_recipe(recipe)
    dataset = load_dataset(recipe_config.dataset)
    seed = 7
    start = initial_state(recipe_config, seed)
    config = DemoConfig(
        out_dir=work_dir,
        providers=1,
        dishonest=0,
        verifiers=1,
        replicas=1,
        rounds=1,
        unit_steps=4,
        recipe=recipe,
        seed=seed,
        reveal_window_s=600,
        verdict_window_s=1200,
        commit_window_s=int(20 * target_direct_s) + 120,
        timeout_s=30 * target_direct_s + 600,
    )
    with marketplace(config, say) as market:
        start_stack(market)
        probe = UnitSpec(
            recipe=recipe, order_seed=seed, round_index=0, shard=0, steps=30, checkpoint_every=30
        )
        train_steps(recipe_config, dataset, start, probe, 0, 5)  # warm-up: allocations, kernel choice
        began = time.perf_counter()
        train_steps(recipe_config, dataset, start, probe, 5, 30)
        steps = max(8, int(target_direct_s * 25 / (time.perf_counter() - began)) // 4 * 4)
        spec = UnitSpec(
            recipe=recipe,
            order_seed=seed,
            round_index=0,
            shard=0,
            steps=steps,
            checkpoint_every=default_checkpoint_every(steps),
        )

        def direct_run(folder: str) -> float:
            began = time.perf_counter()
            run_unit(spec, start, work_dir / folder, dataset=dataset)
            return time.perf_counter() - began

        direct_before_s = direct_run("direct-unit")
        say(f"overhead: direct run of {steps} steps of {recipe}: {direct_before_s:.1f} s")
        market.config = replace(config, unit_steps=steps, rounds=1)
        buyer = Buyer(market)
        began = time.perf_counter()
        buyer.post_order()
        buyer.wait_completed(time.monotonic() + config.timeout_s)
        market_s = time.perf_counter() - began
        say(f"overhead: the same unit as a verified k = 1 order through the market: {market_s:.1f} s")
        # Once more after the order: on a shared machine the load drifts, and the agents were still
        # settling in (datasets, libp2p) during the first run; the mean brackets the market run.
        direct_after_s = direct_run("direct-unit-again")
        say(f"overhead: direct run again: {direct_after_s:.1f} s")
    direct_s = (direct_before_s + direct_after_s) / 2
    return {
        "direct_s": direct_s,
        "direct_before_s": direct_before_s,
        "direct_after_s": direct_after_s,
        "market_s": market_s,
        "orchestration_overhead_ratio": market_s / direct_s,
        "steps": float(steps),
    }
