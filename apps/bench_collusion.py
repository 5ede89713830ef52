"""`veritrain bench collusion --json FILE`: how often an adversary with a share of the stake, split across
many sybil keys, gets every replica of a unit or a majority of its verifiers (issue 8 finding 3).

Method: a population of honest providers and verifiers (equal stake each) and an adversary holding
``f`` of the providers' stake and ``f`` of the verifiers' stake, spread evenly over ``--sybils`` keys per
role, each key declaring its own operator (the lie that self-declared operators cannot catch). For each of
``--units`` units the market's own code draws: :meth:`market.domain.matching.CandidatePool.match` for
the replicas (all hard constraints, distinct operators) and :func:`market.domain.selection.sample` for the
verifiers, both from ``selection_seed(blockhash, unit_key)``; the block hash is a fresh 32-byte hash per
unit (keccak of the run seed and unit index), standing in for blocks the adversary cannot choose.

Measured: (a) the share of units whose first k replicas are all adversarial, k = 1..5 (the draw's first
k are what a k-replica unit gets), and (b) the share whose v verifiers have an adversarial majority,
v = 3 and 5. Each is printed next to two models: ``binomial`` (each pick adversarial with probability f,
independently) and ``exact`` (weighted sampling without replacement from these keys: with equal stakes
per side, the chance the next pick is adversarial is the adversary's remaining stake over all remaining
stake), and the sampling error ``std_error = sqrt(p(1-p)/units)`` of the exact model.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from fractions import Fraction
from functools import cache
from pathlib import Path
from typing import Any

from eth_hash.auto import keccak

from market.domain.matching import CandidatePool, ProviderCandidate, UnitDemand
from market.domain.selection import ROLE_VERIFIERS, sample, selection_seed
from market.orders import unit_key_for

TOKEN = 10**18
HONEST_STAKE = 10 * TOKEN
RECIPE = "digits-mlp"
MAX_K = 5
VERIFIER_COUNTS = (3, 5)


@dataclass(frozen=True)
class Population:
    """Keys per side and their stakes; the adversary's stake is ``share`` of each role's total."""

    share: float
    honest_providers: int
    honest_verifiers: int
    sybils: int

    def sybil_stake(self, honest: int) -> int:
        """Stake per sybil key so that the adversary holds ``share`` of the role's stake (integer base
        units: share = p/q exactly as written, e.g. 0.3 = 3/10)."""
        p, q = Fraction(str(self.share)).as_integer_ratio()
        return p * honest * HONEST_STAKE // ((q - p) * self.sybils)


def _address(tag: str, i: int) -> str:
    return "0x" + keccak(f"{tag}/{i}".encode())[:20].hex()


def _provider(address: str, stake: int) -> ProviderCandidate:
    return ProviderCandidate(
        address=address,
        operator=address,  # every key claims its own operator: sybils lie, and nothing can tell
        memory_mb=8192,
        gflops=500,
        hardware_class="cuda-sm80",
        recipes=frozenset({RECIPE}),
        free_stake=stake,
        price_per_pflop=10**17,
        capacity=10**9,
        bonded_stake=stake,
    )


def exact_all_adversarial(k: int, adversary_keys: int, adversary_stake: int, honest_keys: int) -> float:
    """P(the first k picks are all adversarial) under weighted sampling without replacement."""
    honest_total = honest_keys * HONEST_STAKE
    p = 1.0
    for i in range(k):
        remaining = (adversary_keys - i) * adversary_stake
        p *= remaining / (remaining + honest_total) if remaining > 0 else 0.0
    return p


def exact_majority(v: int, adversary_keys: int, adversary_stake: int, honest_keys: int) -> float:
    """P(more than v/2 of v picks are adversarial) under weighted sampling without replacement."""

    @cache
    def at_least(need: int, adv_left: int, honest_left: int, picks: int) -> float:
        if need <= 0:
            return 1.0
        if picks == 0:
            return 0.0
        a, h = adv_left * adversary_stake, honest_left * HONEST_STAKE
        p_adv = a / (a + h)
        result = 0.0
        if adv_left:
            result += p_adv * at_least(need - 1, adv_left - 1, honest_left, picks - 1)
        if honest_left:
            result += (1 - p_adv) * at_least(need, adv_left, honest_left - 1, picks - 1)
        return result

    return at_least(v // 2 + 1, adversary_keys, honest_keys, v)


def binomial_majority(v: int, share: float) -> float:
    return sum(math.comb(v, x) * share**x * (1 - share) ** (v - x) for x in range(v // 2 + 1, v + 1))


def _figure(measured_count: int, units: int, binomial: float, exact: float) -> dict[str, float]:
    return {
        "measured": measured_count / units,
        "count": measured_count,
        "binomial": binomial,
        "exact": exact,
        "std_error": math.sqrt(exact * (1 - exact) / units),
    }


def run_scenario(population: Population, units: int, seed: int) -> dict[str, Any]:
    """Draw ``units`` units with the market's selection code and count the adversarial outcomes."""
    provider_sybil_stake = population.sybil_stake(population.honest_providers)
    verifier_sybil_stake = population.sybil_stake(population.honest_verifiers)
    adversary = {_address(f"sybil-provider/{seed}", i) for i in range(population.sybils)}
    adversary |= {_address(f"sybil-verifier/{seed}", i) for i in range(population.sybils)}
    pool = CandidatePool()
    for i in range(population.honest_providers):
        pool.upsert(_provider(_address(f"honest-provider/{seed}", i), HONEST_STAKE))
    for i in range(population.sybils):
        pool.upsert(_provider(_address(f"sybil-provider/{seed}", i), provider_sybil_stake))
    verifier_stakes = {
        _address(f"honest-verifier/{seed}", i): HONEST_STAKE for i in range(population.honest_verifiers)
    } | {_address(f"sybil-verifier/{seed}", i): verifier_sybil_stake for i in range(population.sybils)}

    all_adversarial = [0] * (MAX_K + 1)
    majority = dict.fromkeys(VERIFIER_COUNTS, 0)
    for unit in range(units):
        block_hash = "0x" + keccak(f"bench-collusion/{seed}/{unit}".encode()).hex()
        unit_seed = selection_seed(block_hash, unit_key_for(unit + 1, 0, 0, 0))
        demand = UnitDemand(
            unit_id=unit,
            recipe=RECIPE,
            min_memory_mb=1024,
            unit_flops=10**12,
            time_budget_s=600,
            max_price_per_pflop=10**18,
            collateral=TOKEN,
            needed=MAX_K,
        )
        match = pool.match(demand, block_hash, unit_seed)
        for address in match.selected:
            pool.release(address)
        if not match.complete:
            raise RuntimeError(f"unit {unit}: only {len(match.selected)} of {MAX_K} replicas matched")
        for k in range(1, MAX_K + 1):
            if all(a in adversary for a in match.selected[:k]):
                all_adversarial[k] += 1
        verifiers = sample(block_hash, unit_seed, ROLE_VERIFIERS, verifier_stakes, max(VERIFIER_COUNTS))
        for v in VERIFIER_COUNTS:
            if sum(a in adversary for a in verifiers[:v]) > v // 2:
                majority[v] += 1

    share = population.share
    return {
        "adversary_stake_share": share,
        "sybil_keys_per_role": population.sybils,
        "honest_providers": population.honest_providers,
        "honest_verifiers": population.honest_verifiers,
        "honest_stake_per_key": HONEST_STAKE,
        "sybil_provider_stake_per_key": provider_sybil_stake,
        "sybil_verifier_stake_per_key": verifier_sybil_stake,
        "all_replicas_adversarial": {
            str(k): _figure(
                all_adversarial[k],
                units,
                share**k,
                exact_all_adversarial(
                    k, population.sybils, provider_sybil_stake, population.honest_providers
                ),
            )
            for k in range(1, MAX_K + 1)
        },
        "verifier_majority_adversarial": {
            str(v): _figure(
                majority[v],
                units,
                binomial_majority(v, share),
                exact_majority(v, population.sybils, verifier_sybil_stake, population.honest_verifiers),
            )
            for v in VERIFIER_COUNTS
        },
    }


def run_benchmark(
    units: int,
    shares: tuple[float, ...],
    sybils: int,
    honest_providers: int,
    honest_verifiers: int,
    seed: int,
) -> dict[str, Any]:
    from apps.bench_speedup import machine  # lscpu's model name and the core count

    started = time.perf_counter()
    scenarios = {
        f"{round(share * 100)}%": run_scenario(
            Population(share, honest_providers, honest_verifiers, sybils), units, seed
        )
        for share in shares
    }
    return {
        "method": __doc__.split("\n\n", 2)[1].replace("\n", " ") if __doc__ else "",
        "units": units,
        "seed": seed,
        "machine": machine(),
        "wall_s": round(time.perf_counter() - started, 1),
        "scenarios": scenarios,
    }


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, required=True, help="write the results here")
    parser.add_argument("--units", type=int, default=20_000)
    parser.add_argument(
        "--shares", type=float, nargs="+", default=[0.10, 0.30], help="adversary's share of the stake"
    )
    parser.add_argument("--sybils", type=int, default=50, help="keys the adversary splits its stake over")
    parser.add_argument("--honest-providers", type=int, default=100)
    parser.add_argument("--honest-verifiers", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)


def run(args: argparse.Namespace) -> int:
    output = run_benchmark(
        args.units, tuple(args.shares), args.sybils, args.honest_providers, args.honest_verifiers, args.seed
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(output, indent=2) + "\n")
    for name, scenario in output["scenarios"].items():
        print(f"adversary {name} of stake over {scenario['sybil_keys_per_role']} sybil keys per role")
        for label, figures in (
            ("all k replicas adversarial, k =", scenario["all_replicas_adversarial"]),
            ("verifier majority adversarial, v =", scenario["verifier_majority_adversarial"]),
        ):
            for key, f in figures.items():
                print(
                    f"  {label} {key}: measured {f['measured']:.5f}  binomial {f['binomial']:.5f}"
                    f"  exact {f['exact']:.5f}  (± {f['std_error']:.5f})"
                )
    return 0
