"""`veritrain bench chaos`: seeded process, link and Redis faults against short orders through the real
marketplace.

Why: providers, verifiers and the market run on machines that crash, freeze and lose their network. Each
run posts a short DiLoCo order (M = 2, k = 2) to a whole marketplace of processes (apps.demo: hardhat
node, market API, Celery worker, agents) and injects a schedule of faults drawn from
`random.Random(seed)`: SIGKILL then a restart, or SIGSTOP then SIGCONT, of a provider, the verifier, the
market API, the Celery worker or (with `--broker redis`) the run's own Redis, and SIGSTOP then SIGCONT of
the EVM node (a hardhat node, whose state lives in its memory and survives the freeze); a partition or a
slow, lossy link of a provider or the verifier (each agent reaches the market API and the chain RPC
through its own link of apps.faultproxy, while the agent itself keeps running: a provider cut off while
its unit is being committed comes back late); and now and then the crash of a training provider that
returns only after the order has ended (or, if its commitment may have left, reboots and must reveal what
it saved). After the order ends it is checked from the chain's events and
balances and the market's database (its order status): the order completed or was refunded, no unit was
paid twice (a late result of a partitioned provider included), deposit = payouts + fees + refund exactly
(apps.demo_report's checks), no escrow, credit or locked collateral is left, no honest party was slashed
(every party is honest here; a withheld reveal's penalty counts), and no fault cost more than one unit of
re-run work.

Not faulted, on purpose: a restart of the EVM node (a hardhat node keeps its state in memory; a restart is
a new, empty chain, so no invariant could survive it: it is frozen instead), the machine's shared Redis
(a run with `--broker redis` starts and faults its own), and the libp2p data plane between agents (a
verifier fetches a partitioned provider's blobs directly: only the agent's links to the market and the
chain go through the proxy). Bandwidth caps (tbf) need the namespace testbed (apps.testbed, root) and are
not part of this harness.

Runs share one marketplace (starting one costs ~30 s of a 2-core machine); a run that breaks it (a child
that died unexpectedly) is recorded as a lost order and the next run starts a fresh one.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import signal
import socket
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from apps.buyer import order_money
from apps.demo import (
    BUYER_FUNDS,
    Buyer,
    DemoConfig,
    Marketplace,
    build_report,
    marketplace,
    progress_printer,
    start_stack,
)
from apps.demo_report import Checks, Holdings
from apps.faultproxy import PASS, FaultProxy, LinkMode
from apps.procs import free_port
from veritrain.errors import DemoCheckFailed, VeritrainError

# The money and slashing checks of apps.demo_report/build_report that must hold after every faulty run.
INVARIANT_CHECKS = (
    "escrow_balanced",
    "providers_paid_exactly",
    "fees_and_slashes_distributed",
    "parties_conserved",
    "supply_conserved",
    "honest_never_slashed",
)
PROVIDERS = 3  # k = 2 plus one, so a unit whose provider died can run again elsewhere
FAULTS_PER_RUN = (1, 3)
FAULT_WINDOW_S = (1.0, 15.0)  # offsets after the order is posted: a fault-free order takes ~15-25 s
AGENT_DOWN_S = (1.0, 8.0)  # around the 5 s heartbeat timeout: the agent resumes, or its replica is dropped
# A quarter of agent kills are long, past the commit window's first part: the unit must settle without
# the dead replica (expiry, or a verdict on the live one) and run again, costing at most that one unit.
LONG_DOWN_S = (20.0, 45.0)
LONG_DOWN_P = 0.25
# At most one provider per run "crash"es: the first one found training (its unit committing) is killed
# and comes back only once the order has ended, so its unit must settle without it and run again
# elsewhere (the one unit of work a fault may cost). A provider whose commitment was already on its disk
# when it was killed may have sent it: staying down would withhold its reveal, which loses the penalty by
# design (docs/TRUST.md), so its crash is a reboot, back after REBOOT_S, well inside the reveal window,
# and it must reveal from what it saved (run 132, seed 232 of the 2026-11-24 200-run bench: a crash 0.4 s
# after the commit, counted as a false slash).
CRASH_P = 0.3
REBOOT_S = 10.0
BUSY_PROVIDER = "busy-provider"
BUSY_PARTITION_P = 0.5  # half of the providers' partitions wait for a unit being committed
MARKET_DOWN_S = (1.0, 4.0)  # the market API, its Celery worker, (with --broker redis) its Redis, the EVM node
# A frozen EVM node: every RPC call of the market and the agents hangs until it thaws. Drawn after a run's
# other faults, so adding it left every seed's earlier faults as they were.
CHAIN_STOP_P = 0.25
CHAIN = "chain"
AGENT_ACTIONS = ("kill", "stop", "partition", "slow")
SERVICE_ACTIONS = ("kill", "stop")
# A slow link: +delay each way on every chunk, and each chunk lost (the connection reset) with prob. loss.
SLOW_S = (5.0, 20.0)
SLOW_DELAY_MS = (50, 1500)
SLOW_LOSS = (0.0, 0.15)  # up to 15 %: the bugs a lossy link found took 25 % to show in 3 orders
REDIS_READY_S = 30.0
BROKERS = ("filesystem", "redis")
# The reveal window outlasts the longest outage the schedule draws (LONG_DOWN_S) with room to relay a late
# reveal: a provider cut off between its commit and its reveal for longer than the window loses the withhold
# penalty by design (the chain cannot tell an outage from withholding, docs/TRUST.md), and the bench
# measures the faults a window is sized for, not that limit.
REVEAL_WINDOW_S = 60
ORDER_TIMEOUT_S = 300.0
CLOSE_TIMEOUT_S = 190.0  # a unit left open settles by expiry: commit 40 + reveal 60 + verdict 30 s windows


class ChaosError(VeritrainError):
    """Bad arguments to the chaos bench."""


@dataclass(frozen=True)
class Fault:
    """One fault: at `at_s` after the order is posted, `action` on `target` for `down_s` seconds.

    Process faults: "kill" (SIGKILL, then a restart), "stop" (SIGSTOP, then SIGCONT) and "crash" (SIGKILL,
    restarted only after the order has ended, or after REBOOT_S if it had committed; down_s 0). Link
    faults, of an agent's link to the market API and the chain (apps.faultproxy; the agent keeps running):
    "partition" (every connection reset) and "slow" (+`delay_ms` each way, each chunk lost with
    probability `loss`)."""

    at_s: float
    action: str
    target: str
    down_s: float
    delay_ms: int = 0
    loss: float = 0.0

    def describe(self) -> str:
        if self.action == "crash":
            return f"crash {self.target} at +{self.at_s:.1f}s until the order ends"
        slow = f" (+{self.delay_ms} ms each way, loss {self.loss:.1%})" if self.action == "slow" else ""
        return f"{self.action} {self.target}{slow} at +{self.at_s:.1f}s for {self.down_s:.1f}s"


def fault_schedule(
    seed: int, providers: int = PROVIDERS, verifiers: int = 1, redis: bool = False
) -> list[Fault]:
    """The faults of one run, a pure function of its seed and the harness (Redis is faulted only when the
    run has its own), so a run is reproduced from its seed."""
    rng = random.Random(seed)
    targets = [f"provider-{i}" for i in range(providers)] + [f"verifier-{i}" for i in range(verifiers)]
    targets += ["market", "worker"] + (["redis"] if redis else [])
    faults: list[Fault] = []
    for _ in range(rng.randint(*FAULTS_PER_RUN)):
        target, at = rng.choice(targets), rng.uniform(*FAULT_WINDOW_S)
        agent = target.startswith(("provider", "verifier"))
        action = rng.choice(AGENT_ACTIONS if agent else SERVICE_ACTIONS)
        if action == "slow":
            delay, loss = rng.randint(*SLOW_DELAY_MS), round(rng.uniform(*SLOW_LOSS), 3)
            faults.append(Fault(round(at, 1), action, target, round(rng.uniform(*SLOW_S), 1), delay, loss))
            continue
        down = AGENT_DOWN_S if agent else MARKET_DOWN_S
        crashes = rng.random() < CRASH_P and target.startswith("provider")
        if crashes and action == "kill" and not any(f.action == "crash" for f in faults):
            faults.append(Fault(round(at, 1), "crash", BUSY_PROVIDER, 0.0))
            continue
        if rng.random() < LONG_DOWN_P and action in ("kill", "partition") and agent:
            down = LONG_DOWN_S
        # a provider cut off while its unit is being committed (accepted, training, or committed but not
        # revealed) comes back late: whatever it sends then must be settled at most once
        if action == "partition" and target.startswith("provider") and rng.random() < BUSY_PARTITION_P:
            target = BUSY_PROVIDER
        faults.append(Fault(round(at, 1), action, target, round(rng.uniform(*down), 1)))
    if rng.random() < CHAIN_STOP_P:
        at, frozen = rng.uniform(*FAULT_WINDOW_S), rng.uniform(*MARKET_DOWN_S)
        faults.append(Fault(round(at, 1), "stop", CHAIN, round(frozen, 1)))
    return sorted(faults, key=lambda fault: fault.at_s)


@dataclass
class ChaosStack:
    """One marketplace of the bench and the fault proxy its agents reach the market and chain through."""

    market: Marketplace
    links: FaultProxy


class FaultInjector:
    """Applies a schedule while the buyer polls its order (`tick` is Buyer.wait_completed's on_tick); a
    fault on BUSY_PROVIDER waits for a provider of a unit being committed (accepted, training, committed).

    A fault is applied and undone within one tick: the market API cannot answer the buyer's next poll
    while it is down, and everything else keeps running meanwhile, as separate processes."""

    def __init__(self, stack: ChaosStack, schedule: list[Fault], emit: Callable[[str], None]) -> None:
        self.market = stack.market
        self.links = stack.links
        self.pending = list(schedule)
        self.emit = emit
        self.posted = time.monotonic()
        self.injected: list[dict[str, Any]] = []
        self.crashed: list[str] = []
        self.status: dict[str, Any] = {"units": []}

    def tick(self, status: dict[str, Any]) -> None:
        self.status = status
        while self.pending and time.monotonic() - self.posted >= self.pending[0].at_s:
            fault = self.pending[0]
            if fault.target == BUSY_PROVIDER:
                busy = self.busy_provider(status)
                if busy is None:  # nobody trains right now: try again at the next poll
                    return
                fault = replace(fault, target=busy)
            self.pending.pop(0)
            self.apply(fault)

    def busy_provider(self, status: dict[str, Any]) -> str | None:
        """The first provider (by unit, then replica) of a unit being trained, not crashed already."""
        names = {party.address: party.name for party in self.market.providers()}
        for unit in sorted(status["units"], key=lambda unit: int(unit["unit_id"])):
            if unit["state"] == "committing":
                for address in unit["providers"]:
                    if names.get(address, "") not in ("", *self.crashed):
                        return names[address]
        return None

    def commitment_on_disk(self, name: str) -> bool:
        """Whether provider `name` had saved the salt of a commitment it has not revealed, for a unit of the
        order (it saves one before the commitment leaves the process, node.agent)."""
        from node.agent import UnitRecord

        address = self.market.parties[name].address
        units = self.market.config.work_dir / name / "units"
        for unit in self.status["units"]:
            if address in unit["providers"]:
                record = UnitRecord.load(units / str(unit["unit_id"]), int(unit["unit_id"]))
                if record.salt is not None and not record.revealed:
                    return True
        return False

    def finish(self) -> None:
        """The order has ended: crashed agents come back (the next run needs every provider)."""
        for name in self.crashed:
            self.market.restart(name)
        self.crashed.clear()

    def send(self, target: str, sig: signal.Signals) -> None:
        """A signal to a process of the run; the EVM node is the demo's own HardhatNode on one host."""
        if target == CHAIN and self.market.node is not None:
            self.market.node.send_signal(sig)
        else:
            self.market.procs.send(target, sig)

    def apply(self, fault: Fault) -> None:
        market = self.market
        at = time.monotonic() - self.posted
        if fault.target in self.crashed:  # nothing left to fault until the order ends
            self.emit(f"chaos: {fault.describe()} not applied: {fault.target} has crashed")
            return
        self.emit(f"chaos: {fault.describe()} (applied at +{at:.1f}s)")
        if fault.action == "crash":
            market.kill(fault.target)
            if self.commitment_on_disk(fault.target):
                self.emit(f"chaos: {fault.target} had committed: a reboot, back in {REBOOT_S:.0f}s")
                time.sleep(REBOOT_S)
                market.restart(fault.target)
                self.injected.append({**asdict(fault), "applied_at_s": round(at, 1), "rebooted_s": REBOOT_S})
                return
            self.crashed.append(fault.target)
            self.injected.append({**asdict(fault), "applied_at_s": round(at, 1)})
            return
        if fault.action == "kill":
            market.kill(fault.target)
        elif fault.action == "stop":
            self.send(fault.target, signal.SIGSTOP)
        else:
            delay = fault.delay_ms / 1000
            self.links.set_mode(fault.target, LinkMode(fault.action, delay_s=delay, loss=fault.loss))
        time.sleep(fault.down_s)  # the fault's duration, part of the schedule
        if fault.action == "kill":
            market.restart(fault.target)
        elif fault.action == "stop":
            self.send(fault.target, signal.SIGCONT)
        else:
            self.links.set_mode(fault.target, PASS)
        self.injected.append({**asdict(fault), "applied_at_s": round(at, 1)})


@dataclass
class RunRecord:
    """What one run did and what its checks found (counts are per run; the summary adds them up)."""

    run: int
    seed: int
    schedule: list[dict[str, Any]]
    injected: list[dict[str, Any]] = field(default_factory=list)
    outcome: str = "error"  # completed | refunded | open | error
    detail: str = ""
    wall_s: float = 0.0
    chain_order_id: int = 0
    units_assigned: int = 0
    lost_units: int = 0
    double_payments: int = 0
    stuck_escrow: int = 0
    false_slashes: int = 0
    failed_checks: list[str] = field(default_factory=list)
    chain_ahead_s: int = 0  # latest block time minus the wall clock after the run (market: wall clock)

    @property
    def lost_units_per_fault(self) -> int:
        return math.ceil(self.lost_units / max(1, len(self.injected)))


def order_findings(
    market: Marketplace, buyer: Buyer, status: dict[str, Any], checks: Checks
) -> dict[str, Any]:
    """The run's counts, from JobMarket events and state (chain) and the order status (market database)."""
    from veritrain.chain.client import UnitState

    client = market.client
    events = market.events(buyer.posted_block)
    money, units = order_money(events, buyer.chain_order_id)
    ours = {unit.chain_unit_id for unit in units}
    settled = Counter(
        int(e.args["unitId"])
        for e in events
        if e.name in ("UnitFinalized", "VerdictRecorded") and int(e.args["unitId"]) in ours
    )
    logical = {
        row["chain_unit_id"]: (row["round_index"], row["kind"], row["shard"])
        for row in status["units"]
        if row["chain_unit_id"] is not None
    }
    paid = [unit.chain_unit_id for unit in units if "accept" in unit.outcomes]
    paid_per_logical = Counter(logical.get(unit_id, ("unknown", unit_id)) for unit_id in paid)
    double = sum(n - 1 for n in settled.values()) + sum(n - 1 for n in paid_per_logical.values())
    order = client.get_order(buyer.chain_order_id)
    terminal = {UnitState.FINALIZED, UnitState.VERDICTED, UnitState.EXPIRED}
    stuck = [f"order {order.order_id} holds {order.balance}"] if order.balance or not order.closed else []
    stuck += [f"unit {u} open" for u in sorted(ours) if client.get_unit(u).state not in terminal]
    stuck += [f"JobMarket escrow {client.total_escrow()}"] if client.total_escrow() else []
    stuck += [f"JobMarket credits {client.total_credits()}"] if client.total_credits() else []
    stuck += [f"{p.name} locked {client.stake_of(p.account).locked}" for p in market.agents()]
    stuck = [item for item in stuck if not item.endswith(" locked 0")]
    return {
        "units_assigned": len(units),
        "lost_units": sum(1 for unit in units if "accept" not in unit.outcomes),
        "double_payments": double,
        "stuck_escrow": len(stuck),
        "false_slashes": len(money.slashed) + len(money.slashed_verifiers),
        "failed_checks": [name for name in INVARIANT_CHECKS if not checks.results.get(name, False)],
        "detail": "; ".join(stuck),
    }


def top_up_buyer(market: Marketplace) -> None:
    """Mint the buyer its starting funds again once it is down to a tenth of them: every order pays its
    providers (about 5 VERI), so a bench of hundreds of orders on one marketplace runs the buyer dry (run
    181 of the first 200-run bench could not post its order). Before the run's first balance snapshot, so
    the run's money checks see the minted tokens as the buyer's own."""
    buyer = market.parties["buyer"].account
    if market.client.token_balance(buyer) < BUYER_FUNDS // 10:
        market.client.mint(buyer, BUYER_FUNDS)


def run_order(
    stack: ChaosStack, record: RunRecord, schedule: list[Fault], emit: Callable[[str], None]
) -> None:
    """Post one order, inject the faults while it runs, close it, withdraw every credit, check it."""
    market = stack.market
    market.config = replace(market.config, seed=record.seed)
    started = time.monotonic()
    top_up_buyer(market)
    before: Holdings = market.holdings()
    buyer = Buyer(market)
    buyer.post_order()
    record.chain_order_id = buyer.chain_order_id
    injector = FaultInjector(stack, schedule, emit)
    try:
        buyer.wait_completed(started + ORDER_TIMEOUT_S, on_tick=injector.tick)
        record.outcome = "completed"
    except DemoCheckFailed as err:  # not completed in time, or ended expired/cancelled
        record.outcome, record.detail = "open", str(err)
    finally:
        record.injected = injector.injected
        injector.finish()
    status = buyer.status()
    buyer.close(time.monotonic() + CLOSE_TIMEOUT_S)
    buyer.wait_truth_fixed(time.monotonic() + CLOSE_TIMEOUT_S)
    if record.outcome == "open":
        record.outcome = "refunded"
    market.withdraw_all_credits()
    record.chain_ahead_s = market.client.now() - int(time.time())
    after = market.holdings()
    _, checks = build_report(market, buyer, before, after, None, started)
    found = order_findings(market, buyer, status, checks)
    detail = found.pop("detail")
    record.detail = "; ".join(part for part in (record.detail, detail) if part)
    for key, value in found.items():
        setattr(record, key, value)


def chaos_config(out_dir: Path, broker_url: str | None, queue: str) -> DemoConfig:
    """The short order of every run (M = 2, k = 2, one round of 40-step units) and the kill tests' short
    chain windows, so a unit whose provider died settles by expiry within about a minute."""
    return DemoConfig(
        out_dir=out_dir,
        providers=PROVIDERS,
        dishonest=0,
        verifiers=1,
        replicas=2,
        shards=2,
        rounds=1,
        unit_steps=40,
        commit_window_s=40,
        reveal_window_s=REVEAL_WINDOW_S,
        verdict_window_s=30,
        broker_url=broker_url,
        extra_env={"VERITRAIN_CELERY_QUEUE": queue, "VERITRAIN_HEARTBEAT_TIMEOUT_S": "5"},
    )


def summarize(
    records: list[RunRecord],
    seed: int,
    wall_s: float,
    requested: int | None = None,
    broker: str = "filesystem",
) -> dict[str, Any]:
    """The bench's JSON: the issue's counts over all runs, then every run's record."""
    return {
        "runs": len(records),
        "runs_requested": len(records) if requested is None else requested,
        "broker": broker,
        "lost_orders": sum(1 for r in records if r.outcome not in ("completed", "refunded")),
        "double_payments": sum(r.double_payments for r in records),
        "stuck_escrow": sum(r.stuck_escrow for r in records),
        "false_slashes": sum(r.false_slashes for r in records),
        "max_lost_units_per_fault": max((r.lost_units_per_fault for r in records), default=0),
        "incomplete_orders": sum(1 for r in records if r.outcome != "completed"),
        "failed_money_checks": sum(len(r.failed_checks) for r in records),
        "faults_injected": sum(len(r.injected) for r in records),
        "lost_units": sum(r.lost_units for r in records),
        "seed": seed,
        "wall_time_s": round(wall_s, 1),
        "mean_run_s": round(sum(r.wall_s for r in records) / max(1, len(records)), 1),
        "records": [asdict(r) for r in records],
    }


def resumed_records(path: Path, seed: int, broker: str) -> tuple[list[RunRecord], float]:
    """The runs an earlier, interrupted invocation wrote to `path` (and their wall time), so a long bench
    goes on where it stopped; a file of another seed or broker is refused rather than mixed in."""
    try:
        earlier = json.loads(path.read_text())
        records = [RunRecord(**record) for record in earlier["records"]]
        wall_s = float(earlier["wall_time_s"])
        earlier_seed, earlier_broker = earlier["seed"], earlier["broker"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ChaosError(f"--resume: {path} is not a chaos bench result: {err}") from err
    if (earlier_seed, earlier_broker) != (seed, broker):
        raise ChaosError(
            f"--resume: {path} holds seed {earlier_seed} with broker {earlier_broker}, "
            f"not seed {seed} with broker {broker}"
        )
    if [record.run for record in records] != list(range(len(records))):
        raise ChaosError(f"--resume: {path} does not hold runs 0..{len(records) - 1} in order")
    return records, wall_s


def run_chaos(
    runs: int,
    seed: int,
    out_dir: Path,
    broker: str,
    emit: Callable[[str], None],
    checkpoint: Path | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """`runs` seeded runs (run i uses seed + i), each checked; returns the summary (see summarize).

    `broker`: "filesystem" (the demo's default) or "redis": a private redis-server, faulted like the rest.
    `checkpoint`: rewritten after every run with the summary so far, so an interrupted bench loses at most
    the run in progress; with `resume` the runs it already holds are kept and the bench goes on from there.
    """
    if runs < 1:
        raise ChaosError(f"--runs must be at least 1, not {runs}")
    if broker not in BROKERS:
        raise ChaosError(f"--broker must be one of {BROKERS}, not {broker!r}")
    if resume and checkpoint is None:
        raise ChaosError("--resume needs --json: the file of the runs to go on from")
    records: list[RunRecord] = []
    earlier_s = 0.0
    if resume and checkpoint is not None and checkpoint.exists():
        records, earlier_s = resumed_records(checkpoint, seed, broker)
        emit(f"chaos: resuming after {len(records)} runs from {checkpoint}")
    began = time.monotonic() - earlier_s
    with ExitStack() as holder:
        stack: ChaosStack | None = None
        for index in range(len(records), runs):
            if stack is None:
                queue = f"veritrain-chaos-{uuid.uuid4().hex[:12]}"
                redis_port = free_port() if broker == "redis" else None
                broker_url = f"redis://127.0.0.1:{redis_port}/0" if redis_port else None
                config = chaos_config(out_dir / f"stack-{index}", broker_url, queue)
                stack = holder.enter_context(started_marketplace(config, emit, redis_port, seed + index))
            run_seed = seed + index
            schedule = fault_schedule(run_seed, redis=broker == "redis")
            record = RunRecord(run=index, seed=run_seed, schedule=[asdict(f) for f in schedule])
            emit(f"chaos: run {index + 1}/{runs} seed {run_seed}: {[f.describe() for f in schedule]}")
            started = time.monotonic()
            try:
                run_order(stack, record, schedule, emit)
            except VeritrainError as err:  # the stack broke (a child died, a close never landed)
                record.outcome, record.detail = "error", f"{type(err).__name__}: {err}"[:2000]
                holder.close()
                stack = None
            record.wall_s = round(time.monotonic() - started, 1)
            records.append(record)
            emit(
                f"chaos: run {index + 1}/{runs}: {record.outcome} in {record.wall_s} s, "
                f"{len(record.injected)} faults, {record.lost_units} units lost, "
                f"double {record.double_payments}, stuck {record.stuck_escrow}, "
                f"slashed {record.false_slashes}, failed checks {record.failed_checks or 'none'}"
            )
            if checkpoint is not None:
                write_summary(checkpoint, summarize(records, seed, time.monotonic() - began, runs, broker))
    return summarize(records, seed, time.monotonic() - began, runs, broker)


def write_summary(path: Path, summary: dict[str, Any]) -> None:
    """Replace `path` whole (write, then rename), so a reader or a resume never sees half a file."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    partial.replace(path)


@contextmanager
def started_marketplace(
    config: DemoConfig, emit: Callable[[str], None], redis_port: int | None, seed: int
) -> Iterator[ChaosStack]:
    """A fresh marketplace with every agent staked and linked through the fault proxy (and, given a port,
    its own Redis), stopped on leaving."""
    with FaultProxy(seed) as links, marketplace(config, emit) as market:
        if redis_port is not None:
            start_private_redis(market, redis_port)
        start_stack(market, before_agents=lambda market: link_agents(market, links))
        yield ChaosStack(market, links)


def link_agents(market: Marketplace, links: FaultProxy) -> None:
    """Open one link per agent to the market API and the chain RPC; the agent is started on its ports."""
    chain = urlsplit(market.rpc_url)
    upstreams = [("127.0.0.1", market.market_port), (chain.hostname or "127.0.0.1", chain.port or 80)]
    for party in market.agents():
        market_port, chain_port = links.open(party.name, upstreams)
        market.agent_env[party.name] = {
            "VERITRAIN_MARKET_URL": f"http://127.0.0.1:{market_port}",
            "VERITRAIN_CHAIN_RPC_URL": f"http://127.0.0.1:{chain_port}",
        }


def start_private_redis(market: Marketplace, port: int) -> None:
    """A redis-server of the bench's own on a loopback port, so that it can be killed and frozen without
    touching the machine's shared Redis; `market.restart("redis")` starts it again on the same port.

    It keeps no data across a restart (no RDB snapshots, no append-only file), on purpose: the market's
    state lives in its database and the periodic tick re-sends whatever step is pending, so Redis holds
    only disposable triggers; a restart that loses them all is the harsher test of that claim."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise ChaosError(
            "--broker redis needs redis-server on the PATH (Debian: apt-get install redis-server)"
        )
    folder = market.config.work_dir / "redis"
    folder.mkdir(parents=True, exist_ok=True)
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder)]
    argv += ["--save", "", "--appendonly", "no", "--protected-mode", "yes"]

    def start() -> None:
        market.procs.start("redis", argv, cwd=folder)
        market.procs.wait_ready("redis", lambda: _redis_pong(port), timeout=REDIS_READY_S)

    start()
    market.restarters["redis"] = start
    market.emit(f"redis: private redis-server pid {market.procs['redis'].pid} on 127.0.0.1:{port}")


def _redis_pong(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--runs", type=int, default=10, help="orders to run, each with its own fault schedule"
    )
    parser.add_argument("--seed", type=int, default=0, help="run i draws its faults from seed + i")
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        help="write the counts and per-run records here (rewritten after every run)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the runs the --json file already holds (same seed and broker) and go on from there",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="work folder of the runs (default: a temp dir)"
    )
    parser.add_argument(
        "--broker",
        choices=BROKERS,
        default="filesystem",
        help="Celery broker: filesystem, or redis (a private redis-server the faults include)",
    )


def run(args: argparse.Namespace) -> int:
    emit = progress_printer(sys.stderr)
    with tempfile.TemporaryDirectory(prefix="veritrain-chaos-") as scratch:
        out_dir = (args.out or Path(scratch)).resolve()
        summary = run_chaos(args.runs, args.seed, out_dir, args.broker, emit, args.json, args.resume)
    if args.json is not None:
        write_summary(args.json, summary)
    counts = {k: v for k, v in summary.items() if k != "records"}
    print(json.dumps(counts, sort_keys=True))
    bad = summary["lost_orders"] + summary["double_payments"] + summary["stuck_escrow"]
    bad += summary["false_slashes"] + summary["failed_money_checks"]
    return 1 if bad or summary["max_lost_units_per_fault"] > 1 else 0
