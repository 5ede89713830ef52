"""`veritrain bench verification`: the attack suite against the verifier core, with honest controls.

Each trial seed is one unit (a fresh init for even seeds; for odd seeds, the next round from the previous
unit's accepted state). Four honest replicas train it in long-lived worker processes, one per simulated
hardware config (verifier/bench_workers.py); the bench then

- verifies every 3-of-4 honest combination as a spot-checked unit (honest heterogeneous comparisons:
  false fraud / false fault must be 0),
- runs every cheating strategy of node/dishonest.py as one replica beside two honest replicas of other
  configs (collusion: two colluders with one forged result beside one honest replica; copy: a replica that
  copies another's on-chain commitment), with the spot-check draw the protocol would make,
- sweeps the noise magnitude to show the boundary below which noise cannot be told from honest drift.

The verifier re-executes in this process (native vector path, 1 thread). Output schema: see `run`.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import itertools
import json
import statistics
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from verifier.core import (
    Submission,
    ToleranceTable,
    UnitRequest,
    UnitVerdict,
    Verdict,
    VerifierPolicy,
    state_distance,
    verify_unit,
)
from verifier.segments import BASIS_POINTS, is_spot_checked

if TYPE_CHECKING:
    from verifier.bench_workers import WorkerPool
    from veritrain import pol
    from veritrain.datasets import Dataset

NOISE_MAGNITUDES = (1e-8, 3e-8, 1e-7, 3e-7, 1e-6, 3e-6, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3)
COPY_STRATEGY = "copy-commitment"


@dataclass
class Tally:
    """Counts for the report; `details` keeps per-strategy extras out of the fixed-schema entries."""

    trials: int = 0
    detected: int = 0
    slashed: int = 0
    paths: dict[str, int] = field(default_factory=dict)
    min_final_model_rel_l2: float = float("inf")
    reexecuted_steps: list[int] = field(default_factory=list)


@dataclass
class HonestTally:
    comparisons: int = 0
    false_fraud: int = 0
    false_fault: int = 0
    in_honest_units: int = 0
    in_attack_trials: int = 0
    reasons: dict[str, int] = field(default_factory=dict)

    def add(self, verdict: Verdict, reason: str, in_attack: bool) -> None:
        self.comparisons += 1
        if in_attack:
            self.in_attack_trials += 1
        else:
            self.in_honest_units += 1
        if verdict is Verdict.FRAUD:
            self.false_fraud += 1
        elif verdict is Verdict.FAULT:
            self.false_fault += 1
        if verdict is not Verdict.ACCEPT:
            self.reasons[reason] = self.reasons.get(reason, 0) + 1


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, required=True, help="write the benchmark result here")
    parser.add_argument("--quick", action="store_true", help="small CI version (6 trial seeds)")
    parser.add_argument("--recipe", default="charlm-tiny")
    parser.add_argument("--trials", type=int, default=None, help="trial seeds (default 50, quick 6)")
    parser.add_argument("--steps", type=int, default=16, help="unit length H")
    parser.add_argument("--checkpoint-every", type=int, default=2, help="PoL checkpoint interval c")
    parser.add_argument("--spot-check-bps", type=int, default=VerifierPolicy().spot_check_bps)
    parser.add_argument("--tolerances", type=Path, default=None, help="tolerance file (default: committed)")


def run(args: argparse.Namespace) -> int:
    import torch

    from verifier.bench_workers import CONFIGS, VERIFIER_CONFIG, WorkerPool
    from verifier.calibrate import load_tolerances
    from veritrain.progress import progress_bar

    torch.set_num_threads(VERIFIER_CONFIG.threads)
    trials = args.trials or (6 if args.quick else 50)
    boundary_seeds = min(trials, 4 if args.quick else 20)
    tolerances = load_tolerances(args.recipe, args.tolerances)
    policy = VerifierPolicy(spot_check_bps=args.spot_check_bps)
    started = time.monotonic()
    plain = functools.partial(print, flush=True)
    with WorkerPool(CONFIGS) as pool, progress_bar("attack-suite seeds", trials, plain=plain) as update:
        bench = Bench(args.recipe, args.steps, args.checkpoint_every, tolerances, policy)
        for seed, spec, start, runs in bench.honest_runs(pool, trials):
            bench.honest_units(seed, spec, start, runs)
            bench.attack_trials(seed, spec, start, runs)
            if seed < boundary_seeds:
                bench.noise_boundary(seed, spec, start, runs)
            update(seed + 1, elapsed=f"{time.monotonic() - started:.0f} s")
        identities = pool.identities
    result = bench.report(trials, identities, time.monotonic() - started, args)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(json.dumps({key: result[key] for key in ("strategies", "honest")}, sort_keys=True))
    print(
        f"verifier steps per checked unit {result['verifier_steps_per_checked_unit']:.3f}, expected overhead "
        f"{result['expected_verifier_overhead']:.4f}, wall {result['timings']['total_seconds']} s"
    )
    return 0


def _address(label: str) -> str:
    return "0x" + hashlib.sha256(label.encode()).digest()[:20].hex()


def _salt(label: str) -> bytes:
    return hashlib.sha256(b"salt" + label.encode()).digest()


class Bench:
    """State of one benchmark run: the recipe, tolerances and all tallies."""

    def __init__(
        self, recipe_name: str, steps: int, every: int, tolerances: ToleranceTable, policy: VerifierPolicy
    ) -> None:
        from node.dishonest import STRATEGIES
        from veritrain import pol
        from veritrain.datasets import load_dataset

        self.recipe_name = recipe_name
        self.steps = steps
        self.every = every
        self.tolerances = tolerances
        self.policy = policy
        self.dataset: Dataset = load_dataset(
            pol.UnitSpec(recipe_name, 0, 0, 0, steps, every).recipe_config().dataset
        )
        self.strategy_names = [*STRATEGIES, COPY_STRATEGY]
        self.tallies = {name: Tally() for name in self.strategy_names}
        self.honest = HonestTally()
        self.honest_spot_costs: list[float] = []
        self.checked_costs: list[float] = []
        self.boundary: dict[float, list[int]] = {magnitude: [0, 0] for magnitude in NOISE_MAGNITUDES}
        self.replay_cache: dict[tuple[bytes, pol.UnitSpec, int, int], tuple[pol.State, list[float]]] = {}
        self.seconds: dict[str, float] = {
            "waiting_for_honest_workers": 0.0,
            "cheating": 0.0,
            "verifying": 0.0,
        }

    # -------------------------------------------------------------- honest replicas (worker processes)

    def spec_for(self, seed: int) -> pol.UnitSpec:
        from veritrain import pol

        return pol.UnitSpec(self.recipe_name, 1000 + seed // 2, seed % 2, 0, self.steps, self.every)

    def honest_runs(
        self, pool: WorkerPool, trials: int
    ) -> Iterator[tuple[int, pol.UnitSpec, pol.State, dict[str, pol.UnitExecution]]]:
        """Yield each seed's honest runs while the workers already train the next seed."""
        from veritrain import pol

        recipe = self.spec_for(0).recipe_config()

        def submit(seed: int, start: pol.State) -> dict[str, Any]:
            spec = self.spec_for(seed)
            return {
                name: worker.submit("execute_unit", spec=spec, start_state=start)
                for name, worker in pool.workers.items()
            }

        start: pol.State = pol.initial_state(recipe, 0)
        pending = submit(0, start)
        for seed in range(trials):
            waited = time.monotonic()
            runs = {name: future.result() for name, future in pending.items()}
            self.seconds["waiting_for_honest_workers"] += time.monotonic() - waited
            current_start = start
            if seed + 1 < trials:
                start = (
                    runs["native-1t"].final_state if seed % 2 == 0 else pol.initial_state(recipe, seed + 1)
                )
                pending = submit(seed + 1, start)
            yield seed, self.spec_for(seed), current_start, runs

    # -------------------------------------------------------------- verification helpers

    def request(
        self, spec: pol.UnitSpec, start: pol.State, randomness: bytes, spot: bool, unit: int
    ) -> UnitRequest:
        from veritrain import pol

        order = pol.data_order_commitment(spec.recipe_config(), self.dataset, spec)
        return UnitRequest(
            spec=spec,
            start_state=start,
            data_order_commitment=order,
            randomness=randomness,
            spot_checked=spot,
            chain_unit_id=unit,
        )

    def submission(self, label: str, execution: pol.UnitExecution, unit: int) -> Submission:
        from veritrain.chain.eip712 import commitment

        provider, salt = _address(label), _salt(label)
        digest = execution.result_digest
        return Submission(
            provider=provider,
            result_digest=digest,
            transcript=execution.transcript,
            evidence=_Checkpoints(execution.checkpoints),
            commitment=commitment(digest, salt, provider, unit),
            salt=salt,
        )

    def verify(self, request: UnitRequest, submissions: list[Submission]) -> UnitVerdict:
        began = time.monotonic()
        verdict = verify_unit(
            request, submissions, self._reexecutor(request.spec), self.tolerances, self.policy
        )
        self.seconds["verifying"] += time.monotonic() - began
        if verdict.path != "fast":
            self.checked_costs.append(verdict.reexecuted_steps / request.spec.steps)
        return verdict

    # -------------------------------------------------------------- the three experiments

    def honest_units(self, seed: int, spec: pol.UnitSpec, start: pol.State, runs: dict[str, Any]) -> None:
        """Every 3-of-4 combination of honest configs, spot-checked (the strictest honest path)."""
        for combo in itertools.combinations(sorted(runs), 3):
            unit = 1 + seed * 1000
            randomness = hashlib.sha256(f"honest/{seed}/{combo}".encode()).digest()
            request = self.request(spec, start, randomness, True, unit)
            subs = [self.submission(f"{seed}/{name}", runs[name], unit) for name in combo]
            verdict = self.verify(request, subs)
            self.honest_spot_costs.append(verdict.reexecuted_steps / spec.steps)
            for replica in verdict.replicas:
                self.honest.add(replica.verdict, replica.reason, in_attack=False)

    def attack_trials(self, seed: int, spec: pol.UnitSpec, start: pol.State, runs: dict[str, Any]) -> None:
        from node.dishonest import NOISE_DEFAULT, CheatContext, collusion_forgery, forge_unit, noisy_copy

        configs = sorted(runs)
        context = CheatContext(spec=spec, start_state=start, dataset=self.dataset, seed=seed)
        for index, name in enumerate(self.strategy_names):
            unit = 2 + seed * 1000 + index
            first, second = configs[(seed + index) % 4], configs[(seed + index + 1) % 4]
            honest = [
                self.submission(f"{seed}/{name}/{first}", runs[first], unit),
                self.submission(f"{seed}/{name}/{second}", runs[second], unit),
            ]
            began = time.monotonic()
            if name == COPY_STRATEGY:
                victim = honest[0]
                cheaters = [
                    Submission(
                        provider=_address(f"{seed}/copier"),
                        result_digest=victim.result_digest,
                        transcript=victim.transcript,
                        evidence=victim.evidence,
                        commitment=victim.commitment,
                        salt=victim.salt,
                    )
                ]
                cheat_execution = None
            else:
                if name == "noise":
                    cheat_execution = noisy_copy(context, runs["native-1t"], NOISE_DEFAULT)
                elif name == "collusion-2of3":
                    cheat_execution = collusion_forgery(context)
                else:
                    cheat_execution = forge_unit(name, spec, start, self.dataset, seed)
                count = 2 if name == "collusion-2of3" else 1
                cheaters = [
                    self.submission(f"{seed}/{name}/cheater{k}", cheat_execution, unit) for k in range(count)
                ]
                if count == 2:
                    honest = honest[:1]
            self.seconds["cheating"] += time.monotonic() - began
            replicas = [*honest, *cheaters]
            order = sorted(
                range(len(replicas)), key=lambda i: hashlib.sha256(f"{seed}/{name}/{i}".encode()).digest()
            )
            randomness = hashlib.sha256(f"trial/{seed}/{name}".encode()).digest()
            spot = is_spot_checked(randomness, self.policy.spot_check_bps)
            verdict = self.verify(
                self.request(spec, start, randomness, spot, unit), [replicas[i] for i in order]
            )
            by_provider = {replica.provider: replica for replica in verdict.replicas}
            tally = self.tallies[name]
            tally.trials += 1
            outcomes = [by_provider[cheater.provider].verdict for cheater in cheaters]
            tally.detected += all(outcome is not Verdict.ACCEPT for outcome in outcomes)
            tally.slashed += all(outcome is Verdict.FRAUD for outcome in outcomes)
            tally.paths[verdict.path] = tally.paths.get(verdict.path, 0) + 1
            tally.reexecuted_steps.append(verdict.reexecuted_steps)
            if cheat_execution is not None:
                distance = state_distance(cheat_execution.final_state, runs[first].final_state, start)
                tally.min_final_model_rel_l2 = min(
                    tally.min_final_model_rel_l2, distance.groups["model"].rel_l2
                )
            for replica in honest:
                outcome = by_provider[replica.provider]
                self.honest.add(outcome.verdict, outcome.reason, in_attack=True)

    def noise_boundary(self, seed: int, spec: pol.UnitSpec, start: pol.State, runs: dict[str, Any]) -> None:
        """Noise of each magnitude on an honest result, dispute path only (no spot check)."""
        from node.dishonest import CheatContext, noisy_copy

        context = CheatContext(spec=spec, start_state=start, dataset=self.dataset, seed=seed)
        configs = sorted(runs)
        for index, magnitude in enumerate(NOISE_MAGNITUDES):
            unit = 500 + seed * 1000 + index
            first, second = configs[(seed + index) % 4], configs[(seed + index + 1) % 4]
            noisy = noisy_copy(context, runs["native-1t"], magnitude)
            subs = [
                self.submission(f"b{seed}/{first}", runs[first], unit),
                self.submission(f"b{seed}/{second}", runs[second], unit),
                self.submission(f"b{seed}/noisy", noisy, unit),
            ]
            randomness = hashlib.sha256(f"boundary/{seed}/{magnitude}".encode()).digest()
            verdict = verify_unit(
                self.request(spec, start, randomness, False, unit),
                subs,
                self._reexecutor(spec),
                self.tolerances,
                self.policy,
            )
            counts = self.boundary[magnitude]
            counts[0] += 1
            counts[1] += verdict.replicas[2].verdict is not Verdict.ACCEPT

    def _reexecutor(self, spec: pol.UnitSpec) -> Any:
        """The verifier's training, memoised across units: the same (state, segment) on the verifier's
        machine always gives the same result, so the bench computes it once (the core still counts it)."""
        from veritrain import pol

        recipe = spec.recipe_config()

        def reexecute(
            state: Mapping[str, Any], start_step: int, end_step: int
        ) -> tuple[pol.State, list[float]]:
            key = (pol.state_digest(state), spec, start_step, end_step)
            if key not in self.replay_cache:
                self.replay_cache[key] = pol.train_steps(
                    recipe, self.dataset, state, spec, start_step, end_step
                )
            return self.replay_cache[key]

        return reexecute

    # -------------------------------------------------------------- the report

    def report(
        self, trials: int, identities: Mapping[str, Any], seconds: float, args: argparse.Namespace
    ) -> dict[str, Any]:
        from verifier.bench_workers import CONFIGS

        rate = self.policy.spot_check_bps / BASIS_POINTS
        spot_mean = statistics.fmean(self.honest_spot_costs) if self.honest_spot_costs else 0.0
        smallest_always_caught = None  # the smallest magnitude from which every larger one was always caught
        for magnitude in sorted(self.boundary, reverse=True):
            trials_at, detected_at = self.boundary[magnitude]
            if not trials_at or detected_at < trials_at:
                break
            smallest_always_caught = magnitude
        final_tolerance = self.tolerances.for_steps(self.steps)
        return {
            "strategies": {
                name: {"trials": t.trials, "detected": t.detected} for name, t in self.tallies.items()
            },
            "honest": {
                "comparisons": self.honest.comparisons,
                "false_fraud": self.honest.false_fraud,
                "false_fault": self.honest.false_fault,
            },
            "verifier_steps_per_checked_unit": statistics.fmean(self.checked_costs)
            if self.checked_costs
            else 0.0,
            "expected_verifier_overhead": rate * spot_mean,
            "strategy_details": {
                name: {
                    "slashed_fraud": t.slashed,
                    "paths": t.paths,
                    "mean_reexecuted_steps": statistics.fmean(t.reexecuted_steps)
                    if t.reexecuted_steps
                    else 0.0,
                    "min_final_model_rel_l2_vs_honest": (
                        t.min_final_model_rel_l2 if t.min_final_model_rel_l2 != float("inf") else None
                    ),
                }
                for name, t in self.tallies.items()
            },
            "honest_details": {
                "verdicts_in_all_honest_units": self.honest.in_honest_units,
                "honest_verdicts_in_attack_trials": self.honest.in_attack_trials,
                "non_accept_reasons": self.honest.reasons,
                "all_honest_units_spot_checked": True,
            },
            "noise_boundary": {
                "dispute_path_only": True,
                "by_relative_l2": {
                    f"{m:.0e}": {"trials": n, "detected": d} for m, (n, d) in self.boundary.items()
                },
                "smallest_magnitude_always_caught": smallest_always_caught,
                "unit_tolerance_model": final_tolerance.groups["model"].to_json(),
            },
            "overhead_detail": {
                "spot_check_rate": rate,
                "honest_spot_check_mean_fraction": spot_mean,
                "basis": "expected = spot-check rate x mean re-executed steps of a spot-checked honest unit "
                "/ H; "
                "honest units that disagree only within tolerance cost no training steps unless drawn; "
                "disputes caused by cheaters are paid for by the slashed stake",
                "checked_units": len(self.checked_costs),
            },
            "setup": {
                "recipe": self.recipe_name,
                "unit_steps": self.steps,
                "checkpoint_every": self.every,
                "trial_seeds": trials,
                "replicas_per_unit": 3,
                "configs": {config.name: config.describe() for config in CONFIGS},
                "worker_identities": identities,
                "verifier": "main process, native vector path, 1 thread",
                "policy": {"random_segments": self.policy.random_segments, "top_q": self.policy.top_q},
                "tolerance_margin": self.tolerances.margin,
                "command": "veritrain bench verification --json FILE" + (" --quick" if args.quick else ""),
            },
            "timings": {
                "total_seconds": round(seconds, 1),
                **{key: round(value, 1) for key, value in self.seconds.items()},
            },
        }


class _Checkpoints:
    """In-memory evidence: the bench's replicas serve their checkpoints from a dict."""

    def __init__(self, checkpoints: Mapping[int, Any]) -> None:
        self._checkpoints = checkpoints

    def checkpoint(self, step: int) -> Any:
        return self._checkpoints[step]
