"""`veritrain bench simulate --json FILE`: a discrete-event simulator of DiLoCo orders on a network of
home providers (issue 7 item 10). It drives the market's real domain logic — ``CandidatePool`` matching
with ``UnitDemand`` (hardware classes, speed budget, operators), ``plan_round`` / ``plan_aggregate`` for
each round's units, ``replication.audit_rate_ppm`` / ``spot_check_drawn`` for spot checks, and ``pricing``
for what the buyer pays — with simulated providers, links, churn and verification. No tensors move: time
and bytes only.

Model (assumptions are named so; everything else comes from the code or a measured figure):

- **Step time** = FLOPs per step (``Recipe.flops_per_step``: charlm-25m 157.2 GFLOP, charlm-tiny 0.84 GFLOP)
  ÷ (fp32 peak × ``MFU``), never under ``MIN_STEP_S``. fp32 because the GPU runner turns TF32 off for fp32
  recipes. Peaks are the vendors' datasheet figures (``GPUS``); the research note
  (../shared/research/GPU-AND-DILOCO.md) has no GPU throughputs and nothing was measured on a GPU yet, so
  peaks, ``MFU`` and ``MIN_STEP_S`` are ASSUMPTIONS. ``CPU_2CORE_GFLOPS`` is measured (docs/BENCHMARKS.md)
  and reported for comparison; CPUs are not in the simulated fleet.
- **Links**: each provider/verifier has an uplink and a downlink (home: 20 Mbit/s up, 100 Mbit/s down).
  A transfer of B bytes reserves B/up on the source's uplink and B/down on the destination's downlink,
  each link serving its transfers first come first served; it ends when both have moved it (a fluid
  bottleneck model: an aggregator pulling M results is bound by M·B/down, a state fanned out from one
  uplink by copies·B/up). Blobs as the data plane has them today: a result = weights + AdamW moments
  (3P fp32), a round state = weights + outer momentum (2P). Unit (r, m) downloads the round state and
  shard m's previous result unless its provider holds them; round 0's state is regenerated locally
  (portable genesis). ``swarm=True`` (an ASSUMPTION, not today's data plane) lets any holder serve a blob.
- **Verification**: all k replicas commit, then ``SETTLE_S`` (commit + reveal + finalize on chain,
  ASSUMPTION). A unit goes to the verifiers when its replicas span hardware classes (digests differ) or the
  spot-check draw says so; each of ``verifiers_per_unit`` verifiers downloads two checkpoint states and
  re-executes ``VERIFIER_STEP_FRACTION`` of the unit's steps (measured, docs/VERIFICATION.md).
- **Outer step**: an aggregate unit (k replicas, matched like any unit) fetches the M accepted results,
  runs at ``AGGREGATE_BYTES_PER_S`` (measured, docs/BENCHMARKS.md), settles, then serves the new state.
- **Overlap** (``overlap=True``, the default): a provider is released to the pool when it commits, so it
  can download and train another order's unit while its uplink still serves the result; the next round
  of the SAME order never starts before its outer step (the real round logic), so its state cannot be
  prefetched, and a unit's downloads never overlap its own compute (the agent fetches, then trains).
  ``overlap=False``: the provider pushes its result (B/up) before it takes other work.
- **Churn** (ASSUMPTION: exponential sessions, mean ``session_s``, offline ``offline_s``): a provider
  leaving mid-unit drops its replica (fault, unpaid); the unit is matched again without it. An agent
  keeps serving its committed results while its GPU is offline (it forfeits stake if it withholds).
- **Orders**: ``orders`` identical orders run at once (default: a backlog, max(1, 2N // (M·k)), so a
  provider freed early finds work); each trains ``units_per_order`` units of H steps, so the samples per
  order do not depend on M (rounds = units_per_order / M).

Figures per scenario: ``time_to_train_s`` (mean order completion), ``gpu_utilisation`` (provider-seconds
spent in inner steps of accepted replicas ÷ online provider-seconds, while every order still runs: the
steady state, without the idle tail of a finite batch of orders),
``training_efficiency`` (the same divided by k: the replicas are verification, not progress) and
``cost_per_order`` (integer token base units: accepted replicas × the escrow's price per replica, plus
verifier fees of verified units; the escrow pays an aggregate replica the same price per replica as a
training replica, as the v1 contract does). Aggregate units settle on the fast path here (their audit by
recomputation is not simulated). Deterministic for a seed; the whole bench takes ~40 s of CPU.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from eth_hash.auto import keccak

from market.context import MarketConfig
from market.domain.matching import CandidatePool, ProviderCandidate, UnitDemand
from market.domain.pricing import escrow_plan
from market.domain.replication import Reputation, audit_rate_ppm, spot_check_drawn
from market.domain.rounds import plan_aggregate, plan_round
from veritrain.messages import OrderSpec, UnitKind
from veritrain.recipes import Recipe, get_recipe

MBIT = 1_000_000 / 8  # bytes per second of one Mbit/s
MFU = 0.35  # ASSUMPTION: share of fp32 peak a small transformer step reaches
MIN_STEP_S = 0.003  # ASSUMPTION: a step is never faster than this (launch-bound small models)
SETTLE_S = 12.0  # ASSUMPTION: commit, reveal and finalize transactions (a few L2 blocks)
VERIFIER_STEP_FRACTION = 0.178  # measured: verifier steps per checked unit (docs/VERIFICATION.md)
AGGREGATE_BYTES_PER_S = 216e6  # measured: aggregate unit input bytes per second (docs/BENCHMARKS.md)
MAX_PRICE_PER_PFLOP = 10**18  # the order's max price: 1 token per PFLOP (18 decimals)
VERIFIER_FEE_PER_UNIT = 10**17
TRUSTED = Reputation(valid=100, consecutive_valid=100)


@dataclass(frozen=True)
class Gpu:
    """A provider device: fp32 peak (datasheet, ASSUMPTION until measured) and memory."""

    name: str
    fp32_tflops: float
    memory_mb: int
    source: str


GPUS = (
    Gpu("RTX 3060", 12.7, 12_288, "NVIDIA GeForce RTX 3060 spec sheet, 12.7 TFLOPS fp32"),
    Gpu("RTX 3090", 35.6, 24_576, "NVIDIA Ampere GA102 whitepaper, 35.6 TFLOPS fp32"),
    Gpu("RTX 4090", 82.6, 24_576, "NVIDIA Ada Lovelace whitepaper, 82.6 TFLOPS fp32"),
    Gpu("A100 40GB", 19.5, 40_960, "NVIDIA A100 datasheet, 19.5 TFLOPS fp32 (no TF32)"),
)
CPU_2CORE_GFLOPS = 57.0  # measured: charlm-25m on 1 thread of an AMD EPYC (docs/BENCHMARKS.md)


@dataclass(frozen=True)
class Links:
    up: float  # bytes per second
    down: float


Blob = tuple[Any, ...]  # ("round", order, r) | ("result", order, r, m) | ("checkpoint", order, r, m, i)
HOME = Links(up=20 * MBIT, down=100 * MBIT)
UNLIMITED = Links(up=math.inf, down=math.inf)


@dataclass(frozen=True)
class Scenario:
    providers: int
    shards: int
    inner_steps: int = 500
    units_per_order: int = 128
    replicas: int = 1
    recipe: str = "charlm-25m"
    links: Links = HOME
    session_s: float | None = None  # mean online session; None: no churn
    offline_s: float = 1800.0
    overlap: bool = True
    swarm: bool = False
    settle_s: float = SETTLE_S
    orders: int | None = None
    verifiers: int | None = None
    gpus: tuple[Gpu, ...] = GPUS
    spot_checks: bool = True
    result_bytes_per_param: int = 12  # today's result blob: fp32 weights + two AdamW moments
    round_bytes_per_param: int = 8  # today's round state: fp32 weights + outer momentum
    seed: int = 0

    @property
    def order_count(self) -> int:
        return self.orders or max(1, 2 * self.providers // (self.shards * self.replicas))

    @property
    def rounds(self) -> int:
        return -(-self.units_per_order // self.shards)


def step_seconds(recipe: Recipe, gpu: Gpu) -> float:
    """Modelled time of one training step of `recipe` on `gpu` (see MFU, MIN_STEP_S)."""
    return max(MIN_STEP_S, recipe.flops_per_step() / (gpu.fp32_tflops * 1e12 * MFU))


# ---------------------------------------------------------------- simulated parties


@dataclass(eq=False)
class Agent:
    """A provider or verifier: its device, links, the blobs it holds, and its time accounting."""

    address: str
    gpu: Gpu
    step_s: float
    links: Links
    up_free: float = 0.0
    down_free: float = 0.0
    held: set[Blob] = field(default_factory=set)
    online: bool = True
    online_since: float = 0.0
    offline_spells: list[tuple[float, float]] = field(default_factory=list)
    gpu_free: float = 0.0  # verifiers: when their re-executions queued so far are done
    job: Job | None = None
    churn: Iterator[float] | None = None


@dataclass(eq=False)
class Unit:
    order: int
    round_index: int
    shard: int  # M for the round's aggregate unit (rounds.plan_aggregate)
    steps: int
    k: int
    unit_id: int
    replicas: list[Job] = field(default_factory=list)
    kind: UnitKind = UnitKind.TRAIN
    excluded: set[str] = field(default_factory=set)
    committed: int = 0


@dataclass(eq=False)
class Job:
    """One replica of a unit on one agent; `live` until it commits or its agent leaves."""

    unit: Unit
    agent: Agent
    started: float
    compute_s: float
    live: bool = True


@dataclass
class OrderProgress:
    accepted: int = 0
    finished_at: float | None = None
    paid_replicas: int = 0
    paid_aggregates: int = 0
    verified_units: int = 0


class SimulationStalled(RuntimeError):
    """No event is left but an order is unfinished (a scenario the market could not serve)."""


class Simulation:
    """One scenario: an event queue over the real matching, round planning and spot-check draw."""

    def __init__(self, scenario: Scenario) -> None:
        self.s = scenario
        self.recipe = get_recipe(scenario.recipe)
        self.rng = random.Random(scenario.seed)
        self.config = MarketConfig()
        self.now = 0.0
        self.events: list[tuple[float, int, Callable[[], None]]] = []
        self.sequence = itertools.count()
        self.unit_ids = itertools.count(1)
        params = self.recipe.param_count()
        self.result_bytes = scenario.result_bytes_per_param * params
        self.round_bytes = scenario.round_bytes_per_param * params
        self.spec = self._order_spec()
        self.price_per_replica = escrow_plan(self.spec, self.recipe.flops_per_step()).price_per_replica
        steps = sorted(step_seconds(self.recipe, gpu) for gpu in scenario.gpus)
        # the operator's per-unit time budget: 3 × the unit on a median device (slower ones are declined)
        budget = math.ceil(3 * scenario.inner_steps * steps[len(steps) // 2])
        self.time_budget_s = max(self.config.unit_time_budget_s, budget)
        self.pool = CandidatePool()
        self.block_hash = "0x" + keccak(f"{scenario.seed}/block".encode()).hex()  # one chain block per run
        self.providers = [self._agent(f"p{i:05d}") for i in range(scenario.providers)]
        self.by_address = {agent.address: agent for agent in self.providers}
        low = MAX_PRICE_PER_PFLOP // 2
        self.offers = {a.address: self.rng.randint(low, MAX_PRICE_PER_PFLOP) for a in self.providers}
        verifiers = scenario.verifiers or max(2, scenario.providers // 16)
        self.verifiers = [self._agent(f"v{i:05d}") for i in range(verifiers)]
        self.orders = [OrderProgress() for _ in range(scenario.order_count)]
        self.ready: list[Unit] = []
        self.useful: list[tuple[float, float]] = []  # (start, end) of the inner steps of committed replicas
        self.sources: dict[Blob, list[Agent]] = {}
        self.stats = {"replicas_dropped": 0, "wasted_s": 0.0, "bytes_moved": 0, "units_verified": 0}
        for agent in self.providers:
            self.pool.upsert(self._candidate(agent))
            if scenario.session_s is not None:
                agent.churn = self._sessions(agent)
                self._at(next(agent.churn), lambda a=agent: self._leave(a))  # type: ignore[misc]

    # ---- setup

    def _agent(self, address: str) -> Agent:
        gpu = self.s.gpus[self.rng.randrange(len(self.s.gpus))]
        return Agent(address, gpu, step_seconds(self.recipe, gpu), self.s.links)

    def _candidate(self, agent: Agent) -> ProviderCandidate:
        return ProviderCandidate(
            address=agent.address,
            operator=agent.address,
            memory_mb=agent.gpu.memory_mb,
            gflops=int(self.recipe.flops_per_step() / agent.step_s / 1e9),
            hardware_class=agent.gpu.name,
            recipes=frozenset({self.s.recipe}),
            free_stake=10**24,
            price_per_pflop=self.offers[agent.address],
            reputation=TRUSTED,
            bonded_stake=10**24,
        )

    def _sessions(self, agent: Agent) -> Iterator[float]:
        """Alternating leave and return times of one provider (its own generator: deterministic)."""
        rng = random.Random(f"{self.s.seed}/{agent.address}")
        session_s = self.s.session_s or math.inf
        t = 0.0
        while True:
            t += rng.expovariate(1 / session_s)
            yield t
            t += rng.expovariate(1 / self.s.offline_s)
            yield t

    def _order_spec(self) -> OrderSpec:
        s = self.s
        return OrderSpec(
            buyer="0x" + "11" * 20,
            recipe=s.recipe,
            dataset_digest="0x" + "22" * 32,
            total_steps=s.rounds * s.inner_steps,
            unit_steps=s.inner_steps,
            replicas=s.replicas,
            shards=s.shards,
            # the simulation runs the per-unit path: an aggregate unit per round (M = 1 has no outer step)
            outer_step="unit",
            seed=s.seed,
            max_price_per_pflop=MAX_PRICE_PER_PFLOP,
            verifier_fee_per_unit=VERIFIER_FEE_PER_UNIT,
            deadline=2**40,
        )

    # ---- event queue

    def _at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self.events, (when, next(self.sequence), action))

    def run(self) -> dict[str, Any]:
        for order in range(len(self.orders)):
            self._open_round(order, 0)
        self._dispatch()
        while self.events and any(o.finished_at is None for o in self.orders):
            self.now, _, action = heapq.heappop(self.events)
            action()
        if any(o.finished_at is None for o in self.orders):
            raise SimulationStalled(f"{self.s}: units wait for providers that never come back")
        return self._figures()

    # ---- rounds and matching

    def _open_round(self, order: int, round_index: int) -> None:
        self.orders[order].accepted = 0
        for plan in plan_round(self.spec, round_index):
            unit = Unit(order, round_index, plan.shard, plan.steps, self.s.replicas, next(self.unit_ids))
            self.ready.append(unit)

    def _dispatch(self) -> None:
        """Match every waiting unit, oldest first, as the market's matching pass does (until no provider
        is free: then nothing else can match either)."""
        waiting = []
        for index, unit in enumerate(self.ready):
            if not self.pool.has_available(self.s.recipe):
                waiting.extend(self.ready[index:])
                break
            if not self._match(unit):
                waiting.append(unit)
        self.ready = waiting

    def _match(self, unit: Unit) -> bool:
        demand = UnitDemand(
            unit_id=unit.unit_id,
            recipe=self.s.recipe,
            min_memory_mb=self.recipe.memory_estimate().total // 2**20,
            unit_flops=self.recipe.flops_per_step() * unit.steps,
            time_budget_s=self.time_budget_s,
            max_price_per_pflop=MAX_PRICE_PER_PFLOP,
            collateral=0,
            needed=unit.k - len(unit.replicas),
            excluded=frozenset(unit.excluded),
            taken_operators=frozenset(job.agent.address for job in unit.replicas),
        )
        key = keccak(
            f"{self.s.seed}/{unit.order}/{unit.round_index}/{unit.shard}/{len(unit.excluded)}".encode()
        )
        match = self.pool.match(demand, self.block_hash, "0x" + key.hex())
        if not match.complete:
            for address in match.selected:
                self.pool.release(address)
            return False
        for address in match.selected:
            self._start(unit, self.by_address[address])
        return True

    def _start(self, unit: Unit, agent: Agent) -> None:
        """Fetch what the unit needs that the agent lacks, then compute; commit at the end."""
        ready = self.now
        if unit.kind is UnitKind.TRAIN:
            compute = unit.steps * agent.step_s
            if unit.round_index > 0 and self.s.shards > 1:
                ready = self._fetch(("round", unit.order, unit.round_index), self.round_bytes, agent, ready)
            if unit.round_index > 0:
                previous = ("result", unit.order, unit.round_index - 1, unit.shard)
                ready = self._fetch(previous, self.result_bytes, agent, ready)
        else:
            for shard in range(self.s.shards):
                blob = ("result", unit.order, unit.round_index, shard)
                ready = max(ready, self._fetch(blob, self.result_bytes, agent, self.now))
            compute = (self.s.shards * self.result_bytes + self.round_bytes) / AGGREGATE_BYTES_PER_S
        job = Job(unit, agent, self.now, compute)
        unit.replicas.append(job)
        agent.job = job
        self._at(ready + compute, lambda: self._commit(job))

    def _fetch(self, blob: Blob, size: int, agent: Agent, after: float) -> float:
        """When `agent` holds `blob`, fetched from the source whose uplink frees first (module docstring)."""
        if blob in agent.held:
            return after
        sources = self.sources[blob]
        if self.s.swarm:
            holders = [a for a in itertools.chain(self.providers, self.verifiers) if blob in a.held]
            sources = sources + [a for a in holders if a not in sources]
        source = min(sources, key=lambda a: (a.up_free, a.address))
        source.up_free = max(after, source.up_free) + size / source.links.up
        agent.down_free = max(after, agent.down_free) + size / agent.links.down
        agent.held.add(blob)
        self.stats["bytes_moved"] += size
        return max(source.up_free, agent.down_free)

    def _commit(self, job: Job) -> None:
        if not job.live:
            return
        job.live = False
        unit, agent = job.unit, job.agent
        agent.job = None
        unit.committed += 1
        blob: Blob = ("result", unit.order, unit.round_index, unit.shard)
        if unit.kind is UnitKind.AGGREGATE:
            blob = ("round", unit.order, unit.round_index + 1)
        else:
            # honest simulated providers: every committed replica is accepted, so its inner steps are useful
            self.useful.append((self.now - job.compute_s, self.now))
        agent.held.add(blob)
        self.sources.setdefault(blob, []).append(agent)
        if self.s.overlap or unit.kind is UnitKind.AGGREGATE:
            self._release(agent)
        else:  # a blocking upload: the provider pushes its result before it takes other work
            agent.up_free = max(self.now, agent.up_free) + self.result_bytes / agent.links.up
            self._at(agent.up_free, lambda: self._release(agent))
        if unit.committed == unit.k:
            self._settle(unit)

    def _release(self, agent: Agent) -> None:
        self.pool.release(agent.address)
        self._dispatch()

    def _settle(self, unit: Unit) -> None:
        """Fast path after the chain's commit–reveal, or the verifier path when drawn or classes differ."""
        jobs = list(unit.replicas)
        unit_key = bytes([unit.order % 256, unit.round_index % 256, unit.shard % 256]).hex()
        randomness = random.Random(f"{self.s.seed}/audit").getrandbits(256).to_bytes(32, "big").hex()
        drawn = self.s.spot_checks and spot_check_drawn(randomness, unit_key, audit_rate_ppm(unit.k))
        done = self.now
        if unit.kind is UnitKind.TRAIN and (drawn or len({job.agent.gpu.name for job in jobs}) > 1):
            done = self._verify(unit, jobs)
            self.orders[unit.order].verified_units += 1
            self.stats["units_verified"] += 1
        self._at(done + self.s.settle_s, lambda: self._accepted(unit, jobs))

    def _verify(self, unit: Unit, jobs: list[Job]) -> float:
        """Each verifier fetches two checkpoint states and re-executes a share of the unit's steps."""
        start = unit.unit_id % len(self.verifiers)
        chosen = (self.verifiers[start:] + self.verifiers[:start])[: self.config.verifiers_per_unit]
        verdicts = []
        for verifier in chosen:
            ready = self.now
            for segment in range(2):
                blob = ("checkpoint", unit.order, unit.round_index, unit.shard, segment)
                self.sources.setdefault(blob, [job.agent for job in jobs])
                ready = self._fetch(blob, self.result_bytes, verifier, ready)
            replay = VERIFIER_STEP_FRACTION * unit.steps * verifier.step_s
            verifier.gpu_free = max(ready, verifier.gpu_free) + replay
            verdicts.append(verifier.gpu_free)
        return max(verdicts)

    def _accepted(self, unit: Unit, jobs: list[Job]) -> None:
        order = self.orders[unit.order]
        if unit.kind is UnitKind.AGGREGATE:
            order.paid_aggregates += len(jobs)
            self._next_round(unit)
            return
        order.paid_replicas += len(jobs)
        order.accepted += 1
        if order.accepted < self.s.shards:
            return
        if self.s.shards == 1:  # M = 1: the accepted state is the next round's start (no aggregate unit)
            self._next_round(unit)
            return
        plan = plan_aggregate(self.spec, unit.round_index)
        aggregate = Unit(
            unit.order, plan.round_index, plan.shard, plan.steps, self.s.replicas, next(self.unit_ids)
        )
        aggregate.kind = plan.kind
        self.ready.append(aggregate)
        self._dispatch()

    def _next_round(self, unit: Unit) -> None:
        if unit.round_index + 1 == self.s.rounds:
            self.orders[unit.order].finished_at = self.now
            return
        self._open_round(unit.order, unit.round_index + 1)
        self._dispatch()

    # ---- churn

    def _leave(self, agent: Agent) -> None:
        """The provider goes offline: a replica it is still training is dropped and matched again."""
        agent.online = False
        agent.online_since = self.now  # while offline: since when
        job = agent.job
        if job is not None and job.live:
            job.live = False
            agent.job = None
            job.unit.replicas.remove(job)
            job.unit.excluded.add(agent.address)
            self.stats["replicas_dropped"] += 1
            self.stats["wasted_s"] += self.now - job.started
            self.ready.insert(0, job.unit)
        self.pool.remove(agent.address)
        assert agent.churn is not None
        self._at(next(agent.churn), lambda: self._return(agent))
        self._dispatch()

    def _return(self, agent: Agent) -> None:
        agent.online = True
        agent.offline_spells.append((agent.online_since, self.now))
        agent.online_since = self.now
        self.pool.upsert(self._candidate(agent))
        assert agent.churn is not None
        self._at(next(agent.churn), lambda: self._leave(agent))
        self._dispatch()

    # ---- figures

    def _figures(self) -> dict[str, Any]:
        finished = [o.finished_at or self.now for o in self.orders]
        # steady state: while every order is still running (no idle tail of a finite batch of orders)
        end = min(finished)
        offline = [*itertools.chain.from_iterable(a.offline_spells for a in self.providers)]
        offline += [(a.online_since, math.inf) for a in self.providers if not a.online]
        online = len(self.providers) * end - sum(max(0.0, min(stop, end) - start) for start, stop in offline)
        useful = sum(max(0.0, min(stop, end) - start) for start, stop in self.useful)
        costs = [
            (o.paid_replicas + o.paid_aggregates) * self.price_per_replica
            + o.verified_units * VERIFIER_FEE_PER_UNIT
            for o in self.orders
        ]
        utilisation = useful / online if online else 0.0
        return {
            "providers": self.s.providers,
            "shards": self.s.shards,
            "replicas": self.s.replicas,
            "inner_steps": self.s.inner_steps,
            "rounds": self.s.rounds,
            "orders": len(self.orders),
            "time_to_train_s": round(sum(finished) / len(finished), 1),
            "time_to_train_max_s": round(max(finished), 1),
            "gpu_utilisation": round(utilisation, 4),
            "training_efficiency": round(utilisation / self.s.replicas, 4),
            "cost_per_order": max(costs),
            "replicas_dropped": self.stats["replicas_dropped"],
            "wasted_provider_s": round(self.stats["wasted_s"], 1),
            "units_verified": self.stats["units_verified"],
            "bytes_moved_per_order": self.stats["bytes_moved"] // len(self.orders),
        }


def simulate(scenario: Scenario) -> dict[str, Any]:
    """The figures of one scenario (deterministic for its seed)."""
    return Simulation(scenario).run()


# ---------------------------------------------------------------- the bench

PROVIDERS = (8, 16, 32, 64, 128, 256, 512)
SHARDS = (8, 16, 32, 64)
TARGET = 0.85
HEADLINE = Scenario(providers=64, shards=8)


def headline_variants(base: Scenario) -> dict[str, Scenario]:
    """The headline scenario and what-ifs that show what limits it (each one named for what it changes)."""
    one_gpu = (GPUS[1],)
    return {
        "today": base,
        "single_order_m64": replace(base, shards=64, orders=1),
        "blocking_upload": replace(base, overlap=False),
        "swarm": replace(base, swarm=True),
        "swarm_int8_deltas": replace(base, swarm=True, result_bytes_per_param=1, round_bytes_per_param=1),
        "one_gpu_model": replace(base, gpus=one_gpu),
        "one_gpu_model_swarm_int8": replace(
            base, gpus=one_gpu, swarm=True, result_bytes_per_param=1, round_bytes_per_param=1
        ),
        "unlimited_links_no_checks": replace(base, links=UNLIMITED, settle_s=0.0, spot_checks=False),
    }


H_LADDER = (500, 4_000, 32_000, 131_072)
SEARCHED = ("today", "swarm_int8_deltas", "one_gpu_model_swarm_int8", "unlimited_links_no_checks")


def inner_steps_for(scenario: Scenario, target: float, limit: int = 2**17) -> int | None:
    """Smallest H (doubling from the scenario's) whose utilisation reaches `target`; None below `limit`."""
    steps = scenario.inner_steps
    while steps <= limit:
        if simulate(replace(scenario, inner_steps=steps))["gpu_utilisation"] >= target:
            return steps
        steps *= 2
    return None


def measure(base: Scenario, providers: tuple[int, ...], shards: tuple[int, ...]) -> dict[str, Any]:
    """The grid, churn and replication rows, the tiny recipe, and the headline with its what-ifs."""
    recipe = get_recipe(base.recipe)
    figures: dict[str, Any] = {
        "grid": [simulate(replace(base, providers=n, shards=m)) for n in providers for m in shards],
        "churn": {
            "none": simulate(replace(base, providers=64, shards=8)),
            "session_2h": simulate(replace(base, providers=64, shards=8, session_s=7200.0)),
        },
        "replicas_3": simulate(replace(base, providers=64, shards=8, replicas=3)),
        "charlm_tiny": simulate(replace(base, providers=64, shards=8, recipe="charlm-tiny")),
    }
    head = replace(base, providers=HEADLINE.providers, shards=HEADLINE.shards)
    variants = headline_variants(head)
    figures["headline"] = {name: simulate(scenario) for name, scenario in variants.items()}
    for name in SEARCHED:
        figures["headline"][name]["inner_steps_for_target"] = inner_steps_for(variants[name], TARGET)
    figures["utilisation_64_home_by_inner_steps"] = {
        steps: simulate(replace(head, inner_steps=steps))["gpu_utilisation"] for steps in H_LADDER
    }
    figures["utilisation_64_home"] = figures["headline"]["today"]["gpu_utilisation"]
    figures["target"] = TARGET
    figures["model"] = {
        "recipe": recipe.name,
        "parameters": recipe.param_count(),
        "flops_per_step": recipe.flops_per_step(),
        "step_seconds": {gpu.name: round(step_seconds(recipe, gpu), 5) for gpu in base.gpus},
        "gpus": [asdict(gpu) for gpu in base.gpus],
        "links_mbit": {"up": base.links.up / MBIT, "down": base.links.down / MBIT},
        "assumptions": {
            "mfu": MFU,
            "min_step_s": MIN_STEP_S,
            "settle_s": base.settle_s,
            "churn": "exponential sessions and offline spells (session_s, offline_s)",
        },
        "measured": {
            "verifier_step_fraction": VERIFIER_STEP_FRACTION,
            "aggregate_bytes_per_s": AGGREGATE_BYTES_PER_S,
            "cpu_2core_gflops": CPU_2CORE_GFLOPS,
        },
        "scenario": {k: v for k, v in asdict(base).items() if k not in {"gpus", "links"}},
    }
    return figures


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, required=True, help="write the figures here")
    parser.add_argument("--seed", type=int, default=0, help="seed of provider devices, offers and churn")
    default = Scenario(HEADLINE.providers, HEADLINE.shards).inner_steps
    parser.add_argument("--inner-steps", type=int, default=default, help="H of every order")
    parser.add_argument("--quick", action="store_true", help="a small grid (CI)")


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    base = replace(HEADLINE, inner_steps=args.inner_steps, seed=args.seed)
    if args.quick:
        base = replace(base, units_per_order=16)
    grid = ((8, 64), (8, 16)) if args.quick else (PROVIDERS, SHARDS)
    figures = measure(base, *grid)
    figures["wall_seconds"] = round(time.monotonic() - started, 1)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    print(json.dumps({"utilisation_64_home": figures["utilisation_64_home"], "target": TARGET}))
    return 0
