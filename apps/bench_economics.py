"""`veritrain bench economics --json FILE`: does cheating pay, and what does verification cost (issue 9)?

A Monte-Carlo simulation over the market's REAL policy code — ``replication.replication_factor`` picks k
from the unit's first drawn provider's ``Reputation``, ``replication.audit_rate_ppm`` and
``spot_check_drawn`` draw the audit (always for a unit with a provider ``on_probation``, as the contract)
— with reputations updated as ``JobMarket._applyOutcomes`` does them (accept: valid + 1, consecutive_valid
+ 1; fault: fault + 1, consecutive_valid = 0; fraud: fraud + 1, consecutive_valid = 0 and ``slash_amount``
slashed; a committed replica that never reveals also loses
``withhold_penalty``). Replicas are drawn by stake without replacement, as ``selection.sample`` does.

Inputs, each named with its source in the output's ``inputs``:

- **Audit detection per strategy** (``measure_audits``): MEASURED in this run by the verifier core
  (``verify_unit``, spot-check path) on a lone replica of each attack-suite strategy
  (``node/dishonest.py``, ``verifier/attacks.py``), charlm-tiny units of H = 16 steps with a checkpoint every
  2, for each number of random segments per audit (plus one top-q segment). A lone or unanimous replica set
  is what an audit faces: nothing else contradicts it.
- **Dispute detection**: a cheater beside an honest replica is caught 50/50 for every strategy
  (docs/VERIFICATION.md §3); honest false fraud 0 of 1 650 heterogeneous honest verdicts (same source).
- **Verifier cost**: re-executed steps of an honest audited unit ÷ H, measured here per segment count; a
  dispute costs ``VERIFIER_STEP_FRACTION`` (docs/VERIFICATION.md). Each of ``verifiers_per_audit`` verifiers
  re-executes.
- **Slash, withhold penalty, audit rates**: ``MarketParams()`` (the deployment's defaults) and
  ``ReplicationPolicy()``; **price**: ``pricing.price_for_flops`` for charlm-25m units of 500 steps at the
  simulator's max price (``apps/bench_simulate.py``); **gas**: docs/BENCHMARKS.md.
- **Compute a strategy saves**: the share of the unit's training steps it skips (node/dishonest.py); bf16's
  share is an ASSUMPTION (bf16 tensor cores at twice fp32 speed), noise and other-data save nothing.

Adversary (worst case for detection): sybil keys holding a stake share f, each already past the
reputation threshold; they cheat only on units where no honest replica can contradict them (every replica
theirs), since a cheat beside an honest replica is caught every time; the copier needs a victim's
commitment, so it plays beside an honest replica. Canary units (issue 9 item 2, market/canary.py) are
``canary_ppm`` of the units: replays of verified units, indistinguishable to the agent here, whose wrong
answer the verifiers re-execute in full (measured: every strategy caught); their replicas' compute and,
for a wrong answer, the verifiers' full re-execution are not useful. The known answer costs nothing more:
it is the source unit's verified result.
Honest providers fault (crash, drop) at ``fault_ppm``
(ASSUMPTION), which resets their streak as the contract does.

The verifier's dilemma (``lazy_verifier``): a verifier that accepts every unanimous job without
re-executing it (`veritrain verifier run --lazy`) saves the audit's re-execution on each job, and loses
``verifier_slash`` on each planted cheat among its jobs (market/canary.py: the operator's plant works a
replayed unit alone and forges it, so the job is unanimous and its truth is fraud). Its jobs are the
audits of the mature honest network plus one job per plant, at the market's default plant rate per
verified unit; saved compute is priced at the unit's price, like the cheaters' savings.

Figures: ``compute_multiplier`` = (provider + verifier + canary FLOPs) ÷ FLOPs of accepted honest training,
mature honest network; ``cheat_caught_within_10_units`` = share of cheating careers caught within their first
10 cheating units (worst strategy); ``cheater_expected_value`` = base units (10⁻¹⁸ token) per cheating unit,
relative to doing that unit honestly: saved compute at the unit's price minus, when caught, the lost
payment and the slash (future income lost to the reputation drop is ignored: that favours the cheater);
``honest_false_slash_rate`` = slashed honest replicas ÷ honest replicas settled. Deterministic for a seed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from apps.bench_simulate import MAX_PRICE_PER_PFLOP, VERIFIER_STEP_FRACTION
from market.context import MarketConfig
from market.domain.pricing import price_for_flops
from market.domain.replication import (
    PPM,
    ReplicationPolicy,
    Reputation,
    audit_rate_ppm,
    on_probation,
    replication_factor,
    spot_check_drawn,
)
from veritrain.chain.deployment import AppealParams, MarketParams
from veritrain.recipes import get_recipe
from veritrain.settings import Settings

COPY = "copy-commitment"
# share of a unit's training compute each strategy skips (node/dishonest.py)
SAVED_FRACTION = {
    "start-state": 1.0,
    "random-weights": 1.0,
    "skip-10pct": 0.1,
    "skip-50pct": 0.5,
    "skip-90pct": 0.9,
    "other-data": 0.0,
    "bf16": 0.5,  # ASSUMPTION: bf16 tensor cores at twice the fp32 throughput
    "noise": 0.0,
    "interpolated-checkpoints": 0.9,
    "collusion-2of3": 0.5,
    COPY: 1.0,
}
DISPUTE_DETECTION = 1.0  # measured: every strategy 50/50 beside honest replicas (docs/VERIFICATION.md §3)
HONEST_FALSE_FRAUD = 0.0  # measured: 0 of 1 650 heterogeneous honest verdicts (docs/VERIFICATION.md §3)
GAS_PER_SETTLED_UNIT_K3 = 432_578  # measured, batched path, 3 replicas (docs/BENCHMARKS.md)
GAS_PER_VERDICT = 315_955  # measured, verdict with verifier collateral (docs/BENCHMARKS.md)
RECIPE = "charlm-25m"
UNIT_STEPS = 500
CANARY_DETECTION = 1.0  # a wrong canary is re-executed on every segment: measured d = 1.0 for every strategy
CANARY_PPM = 370_000  # the canary share of units that alone gives 1-(1-c)^10 >= 0.99
# the market's default canary rate per verified unit, as a share of all units worked: r / (1 + r)
DEFAULT_CANARY_RATE_PPM = Settings.model_fields["canary_rate_ppm"].default
IMPLEMENTED_CANARY_PPM = PPM * DEFAULT_CANARY_RATE_PPM // (PPM + DEFAULT_CANARY_RATE_PPM)
DEFAULT_PLANT_RATE_PPM = Settings.model_fields["plant_rate_ppm"].default  # planted cheats per verified unit
WINDOW = 10  # cheating units in `cheat_caught_within_10_units`
TARGETS = {"compute_multiplier_max": 1.3, "cheat_caught_within_10_units_min": 0.99}


@dataclass(frozen=True)
class AuditMeasurement:
    """Per audit of a lone replica: detection per strategy and the honest unit's verifier cost (÷ H)."""

    random_segments: int
    detection: dict[str, float]
    honest_cost: float
    trials: int
    honest_false_fraud: int


@dataclass(frozen=True)
class Network:
    """One scenario: who holds the stake, how the adversary plays, and the policy under test."""

    honest_providers: int = 100
    adversary_keys: int = 20  # sybil keys, equal stake: ~50 solo units each at 10 % of 10 000 units
    adversary_stake: float = 0.0  # share of provider stake
    strategy: str | None = None
    mature: bool = True  # every key starts past the reputation threshold
    units: int = 10_000
    fault_ppm: int = 1_000  # ASSUMPTION: an honest replica crashes or drops 1 time in 1 000
    max_k: int = 3  # a buyer's `auto` order (apps.buyer AUTO_MAX_REPLICAS)
    canary_ppm: int = 0
    verifiers_per_audit: int = MarketConfig().verifiers_per_unit
    policy: ReplicationPolicy = field(default_factory=ReplicationPolicy)
    seed: int = 0


@dataclass
class Tally:
    provider_flops: float = 0.0
    verifier_flops: float = 0.0
    useful_flops: float = 0.0
    honest_settled: int = 0
    honest_slashed: int = 0
    cheating_units: int = 0
    caught_units: int = 0
    cheater_gain: int = 0  # base units, relative to honest play
    units_by_k: dict[int, int] = field(default_factory=dict)
    audits: int = 0


@dataclass(eq=False)
class Key:
    address: str
    stake: float
    adversarial: bool
    reputation: Reputation
    cheats: int = 0  # cheating units played so far
    caught_at: int | None = None  # its cheating unit count when first caught


def unit_price() -> int:
    """What one replica of a charlm-25m unit of 500 steps earns at the simulator's max price."""
    return price_for_flops(MAX_PRICE_PER_PFLOP, get_recipe(RECIPE).flops_per_step() * UNIT_STEPS)


def _accept(r: Reputation) -> Reputation:
    return replace(r, valid=r.valid + 1, consecutive_valid=r.consecutive_valid + 1)


def _fault(r: Reputation) -> Reputation:
    return replace(r, fault=r.fault + 1, consecutive_valid=0)


def _fraud(r: Reputation) -> Reputation:
    return replace(r, fraud=r.fraud + 1, consecutive_valid=0)


class Simulation:
    """Units drawn one by one over a fixed set of staked keys; see the module docstring."""

    def __init__(self, net: Network, audit: AuditMeasurement, params: MarketParams) -> None:
        self.net = net
        self.audit = audit
        self.params = params
        self.rng = random.Random(f"economics/{net.seed}/{net.adversary_stake}/{net.strategy}")
        self.price = unit_price()
        start = Reputation(valid=100, consecutive_valid=100) if net.mature else Reputation()
        honest_stake = 1.0 / net.honest_providers * (1 - net.adversary_stake)
        self.keys = [Key(f"h{i}", honest_stake, False, start) for i in range(net.honest_providers)]
        if net.adversary_stake > 0:
            each = net.adversary_stake / net.adversary_keys
            self.keys += [Key(f"a{i}", each, True, start) for i in range(net.adversary_keys)]
        self.cumulative = list(itertools.accumulate(key.stake for key in self.keys))
        self.tally = Tally()

    def _draw(self, count: int, first: Key | None = None) -> list[Key]:
        """Stake-weighted draw without replacement: redrawing a key already chosen is the same as drawing
        the next one over the remaining stake."""
        chosen = [first] if first else []
        while len(chosen) < count:
            key = self.rng.choices(self.keys, cum_weights=self.cumulative)[0]
            if key not in chosen:
                chosen.append(key)
        return chosen

    def run(self) -> Tally:
        for unit in range(self.net.units):
            self._unit(unit)
        return self.tally

    def _unit(self, unit: int) -> None:
        net, t = self.net, self.tally
        primary = self._draw(1)[0]
        k = replication_factor(primary.reputation, net.max_k, net.policy)
        replicas = self._draw(k, primary)
        t.units_by_k[k] = t.units_by_k.get(k, 0) + 1
        canary = self.rng.randrange(PPM) < net.canary_ppm
        randomness = self.rng.getrandbits(256).to_bytes(32, "big").hex()
        audited = any(on_probation(key.reputation, net.policy) for key in replicas) or spot_check_drawn(
            randomness, unit.to_bytes(8, "big").hex(), audit_rate_ppm(k, net.policy)
        )
        strategy = net.strategy
        theirs = [key for key in replicas if key.adversarial]
        if strategy == COPY:
            cheating = bool(theirs) and len(theirs) < k  # it copies an honest replica's commitment
        else:
            cheating = strategy is not None and len(theirs) == k
        if not cheating:
            theirs = []
        saved = SAVED_FRACTION[strategy] if cheating and strategy else 0.0
        t.provider_flops += sum(1.0 - saved if key in theirs else 1.0 for key in replicas)
        if audited:
            t.audits += 1
            t.verifier_flops += net.verifiers_per_audit * self.audit.honest_cost
        honest = [key for key in replicas if key not in theirs]
        caught = False
        if theirs:
            detection = self._detection(strategy, honest, canary, audited)
            caught = self.rng.random() < detection
            if canary and not honest:  # the known answer is not theirs: every segment re-executed
                t.verifier_flops += net.verifiers_per_audit * 1.0
            elif len(honest) > 0 or caught:
                t.verifier_flops += net.verifiers_per_audit * VERIFIER_STEP_FRACTION
            self._settle_cheaters(theirs, caught, saved)
        faulted = [key for key in honest if self.rng.randrange(PPM) < net.fault_ppm]
        for key in honest:
            if key in faulted:
                key.reputation = _fault(key.reputation)
                continue
            t.honest_settled += 1
            if audited and self.rng.random() < HONEST_FALSE_FRAUD:
                t.honest_slashed += 1
                key.reputation = _fraud(key.reputation)
            else:
                key.reputation = _accept(key.reputation)
        if not canary and len(faulted) < len(honest):  # an honest result is accepted
            t.useful_flops += 1.0

    def _detection(self, strategy: str | None, honest: list[Key], canary: bool, audited: bool) -> float:
        """Chance the unit's cheaters are caught: contradicted by an honest replica or a canary's known
        answer (dispute path), else only by the audit's re-executed segments."""
        if honest or canary:
            return DISPUTE_DETECTION if honest else CANARY_DETECTION
        return self.audit.detection[strategy or ""] if audited else 0.0

    def _settle_cheaters(self, theirs: list[Key], caught: bool, saved: float) -> None:
        t = self.tally
        t.cheating_units += 1
        t.caught_units += caught
        penalty = self.params.withhold_penalty if self.net.strategy == COPY else self.params.slash_amount
        for key in theirs:
            key.cheats += 1
            t.cheater_gain += round(saved * self.price)
            if caught:
                t.cheater_gain -= self.price + penalty
                if key.caught_at is None:
                    key.caught_at = key.cheats
                key.reputation = (
                    _fault(key.reputation) if self.net.strategy == COPY else _fraud(key.reputation)
                )
            else:
                key.reputation = _accept(key.reputation)


def run_network(net: Network, audit: AuditMeasurement, params: MarketParams) -> dict[str, Any]:
    """One simulated network's counts and figures (see the module docstring)."""
    sim = Simulation(net, audit, params)
    t = sim.run()
    careers = [key for key in sim.keys if key.adversarial and (key.caught_at or key.cheats >= WINDOW)]
    counts = {
        "units": net.units,
        "provider_flops": t.provider_flops,
        "verifier_flops": t.verifier_flops,
        "useful_flops": t.useful_flops,
        "units_by_k": {str(k): n for k, n in sorted(t.units_by_k.items())},
        "audits": t.audits,
        "honest_replicas_settled": t.honest_settled,
        "honest_slashed": t.honest_slashed,
        "cheating_units": t.cheating_units,
        "cheating_units_caught": t.caught_units,
        "cheating_careers": len(careers),
        "careers_caught_within_10": sum(1 for key in careers if key.caught_at and key.caught_at <= WINDOW),
        "cheater_gain_total": t.cheater_gain,
        "cheating_replicas": sum(key.cheats for key in sim.keys if key.adversarial),
    }
    return {**counts, **_figures(counts)}


def _figures(c: dict[str, Any]) -> dict[str, Any]:
    """Ratios from (summed) counts; None where nothing was counted."""
    useful = c["useful_flops"]
    return {
        "compute_multiplier": round((c["provider_flops"] + c["verifier_flops"]) / useful, 4)
        if useful
        else None,
        "verifier_flops_per_useful": round(c["verifier_flops"] / useful, 4) if useful else None,
        "cheater_ev_per_cheating_unit": c["cheater_gain_total"] // c["cheating_replicas"]
        if c["cheating_replicas"]
        else None,
        "caught_within_10": round(c["careers_caught_within_10"] / c["cheating_careers"], 4)
        if c["cheating_careers"]
        else None,
        "honest_false_slash_rate": c["honest_slashed"] / c["honest_replicas_settled"],
        "gas_per_useful_unit_upper_bound": round(
            (c["units"] * GAS_PER_SETTLED_UNIT_K3 + c["audits"] * GAS_PER_VERDICT) / useful
        )
        if useful
        else None,
    }


def formula(
    policy: ReplicationPolicy, detection: float, saved: float, price: int, slash: int
) -> dict[str, Any]:
    """The closed forms for a cheater on k = 1 units: p·d per unit, 1-(1-p·d)^10, and the EV."""
    caught = policy.trusted_audit_ppm / PPM * detection
    return {
        "caught_per_unit": round(caught, 6),
        "caught_within_10": round(1 - (1 - caught) ** WINDOW, 6),
        "ev_per_unit": round(saved * price - caught * (price + slash)),
    }


def measure_audits(seeds: int, segment_counts: tuple[int, ...]) -> list[AuditMeasurement]:
    """Audit a lone replica of every strategy (and of an honest run) with the real verifier core."""
    import hashlib

    from node.dishonest import STRATEGIES, forge_unit
    from verifier.attacks import Bench
    from verifier.calibrate import load_tolerances
    from verifier.core import Verdict, VerifierPolicy
    from veritrain import pol

    bench = Bench("charlm-tiny", 16, 2, load_tolerances("charlm-tiny"), VerifierPolicy())
    recipe = bench.spec_for(0).recipe_config()
    caught = {r: dict.fromkeys(STRATEGIES, 0) for r in segment_counts}
    honest_cost = dict.fromkeys(segment_counts, 0.0)
    false_fraud = dict.fromkeys(segment_counts, 0)
    for seed in range(seeds):
        spec = bench.spec_for(2 * seed)  # a fresh init per seed
        start = pol.initial_state(recipe, 2 * seed)
        results = {name: forge_unit(name, spec, start, bench.dataset, seed) for name in STRATEGIES}
        results["honest"] = pol.execute_unit(bench.dataset, spec, start)
        for r in segment_counts:
            bench.policy = VerifierPolicy(random_segments=r, top_q=1)
            for index, (name, execution) in enumerate(results.items()):
                unit = 10_000 + seed * 100 + index
                randomness = hashlib.sha256(f"audit/{seed}/{name}".encode()).digest()
                request = bench.request(spec, start, randomness, True, unit)
                verdict = bench.verify(request, [bench.submission(f"{seed}/{name}", execution, unit)])
                outcome = verdict.replicas[0].verdict
                if name == "honest":
                    honest_cost[r] += verdict.reexecuted_steps / spec.steps
                    false_fraud[r] += outcome is Verdict.FRAUD
                else:
                    caught[r][name] += outcome is not Verdict.ACCEPT
    return [
        AuditMeasurement(
            random_segments=r,
            detection={
                **{name: n / seeds for name, n in caught[r].items()},
                COPY: DISPUTE_DETECTION,  # cannot open a copied commitment, alone or not (§3)
            },
            honest_cost=honest_cost[r] / seeds,
            trials=seeds,
            honest_false_fraud=false_fraud[r],
        )
        for r in segment_counts
    ]


STAKES = {"honest": 0.0, "adversary_10pct": 0.1, "adversary_30pct": 0.3}
SEGMENT_COUNTS = (1, 3, 7)  # random segments per audit (+ 1 top-q); 7 + 1 = every segment of H = 16, c = 2
AUDIT_PPM_GRID = (200_000, 300_000, 370_000, 400_000, 500_000, 700_000)
VERIFIERS_GRID = (1, 2)


def _merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Sum the counts of several trials and recompute the figures from the sums."""
    counted = [
        *("units", "provider_flops", "verifier_flops", "useful_flops", "audits", "honest_replicas_settled"),
        *("honest_slashed", "cheating_units", "cheating_units_caught", "cheating_careers"),
        *("careers_caught_within_10", "cheater_gain_total", "cheating_replicas"),
    ]
    counts: dict[str, Any] = {key: sum(run[key] for run in runs) for key in counted}
    counts["units_by_k"] = {}
    for run in runs:
        for k, n in run["units_by_k"].items():
            counts["units_by_k"][k] = counts["units_by_k"].get(k, 0) + n
    counts["provider_flops"] = round(counts["provider_flops"], 2)
    counts["verifier_flops"] = round(counts["verifier_flops"], 2)
    return {**counts, **_figures(counts), "trials": len(runs)}


def evaluate(
    base: Network, audit: AuditMeasurement, params: MarketParams, trials: int, strategies: list[str]
) -> dict[str, Any]:
    """Every scenario under one policy: honest (mature and newcomers) and each strategy at 10 % and 30 %."""

    def trial_runs(net: Network) -> dict[str, Any]:
        return _merge([run_network(replace(net, seed=base.seed + i), audit, params) for i in range(trials)])

    scenarios: dict[str, Any] = {
        "honest_mature": trial_runs(base),
        "honest_newcomers": trial_runs(replace(base, mature=False)),
    }
    for label, stake in STAKES.items():
        if stake == 0:
            continue
        scenarios[label] = {
            name: trial_runs(replace(base, adversary_stake=stake, strategy=name)) for name in strategies
        }
    return scenarios


def headline(scenarios: dict[str, Any], strategies: list[str]) -> dict[str, Any]:
    """The four acceptance figures from a policy's scenarios (cheaters: the 10 % network)."""
    observed = {  # a strategy with no finished career in a network (the copier needs k > 1) is left out there
        name: [scenarios[label][name]["caught_within_10"] for label in STAKES if label != "honest"]
        for name in strategies
    }
    caught = {
        name: min(v for v in values if v is not None)
        for name, values in observed.items()
        if any(v is not None for v in values)
    }
    worst = min(caught, key=lambda name: caught[name])
    honest = [scenarios["honest_mature"], scenarios["honest_newcomers"]]
    honest += [scenarios[label][name] for label in STAKES if label != "honest" for name in strategies]
    slashed = sum(s["honest_slashed"] for s in honest)
    settled = sum(s["honest_replicas_settled"] for s in honest)
    return {
        "compute_multiplier": scenarios["honest_mature"]["compute_multiplier"],
        "cheat_caught_within_10_units": caught[worst],
        "cheat_caught_within_10_units_worst_strategy": worst,
        "cheat_caught_within_10_units_by_strategy": caught,
        "cheating_careers_by_strategy": {
            name: [scenarios[label][name]["cheating_careers"] for label in STAKES if label != "honest"]
            for name in strategies
        },
        "cheater_expected_value": {
            name: scenarios["adversary_10pct"][name]["cheater_ev_per_cheating_unit"] for name in strategies
        },
        "honest_false_slash_rate": slashed / settled,
    }


def lazy_verifier(
    honest: dict[str, Any], audit: AuditMeasurement, price: int, verifiers_per_audit: int
) -> dict[str, Any]:
    """What accepting unanimous jobs unchecked is worth to a verifier, per job, vs re-executing them: the
    re-execution saved, at the unit's price, minus the verifier slash times the share of its jobs that
    are planted cheats (each plant: one more unanimous job, whose truth is fraud)."""
    slash = AppealParams().verifier_slash
    plants = honest["units"] * DEFAULT_PLANT_RATE_PPM / PPM
    planted_share = plants / (honest["audits"] + plants)
    saved = audit.honest_cost * price
    return {
        "plant_rate_ppm": DEFAULT_PLANT_RATE_PPM,
        "planted_share_of_jobs": round(planted_share, 5),
        "saved_per_job": round(saved),
        "verifier_slash": slash,
        "expected_value_per_job": round(saved - planted_share * slash),
        "break_even_planted_share": round(saved / slash, 7),
        # what plants add to the network's compute: each is re-executed by its verifiers like an audit
        "compute_multiplier_added": round(
            plants * verifiers_per_audit * audit.honest_cost / honest["useful_flops"], 5
        ),
        "unit": "base units (1e-18 token)",
    }


def meets(figures: dict[str, Any]) -> bool:
    return bool(
        figures["compute_multiplier"] <= TARGETS["compute_multiplier_max"]
        and figures["cheat_caught_within_10_units"] >= TARGETS["cheat_caught_within_10_units_min"]
        and all(ev is not None and ev < 0 for ev in figures["cheater_expected_value"].values())
        and figures["honest_false_slash_rate"] == 0
    )


def search(
    base: Network, audits: list[AuditMeasurement], params: MarketParams, strategies: list[str]
) -> list[dict[str, Any]]:
    """Closed-form screen of (solo audit rate, segments per audit, verifiers per audit): worst strategy's
    1-(1-p·d)^10 and the mature honest multiplier simulated once; cheapest first."""
    price = unit_price()
    rows = []
    for audit in audits:
        for ppm in AUDIT_PPM_GRID:
            policy = replace(base.policy, trusted_audit_ppm=ppm)
            caught = {
                name: formula(policy, audit.detection[name], SAVED_FRACTION[name], price, params.slash_amount)
                for name in strategies
            }
            worst = min(strategies, key=lambda name: caught[name]["caught_within_10"])
            saving = [name for name in strategies if SAVED_FRACTION[name] > 0]
            worst_saving = min(saving, key=lambda name: caught[name]["caught_within_10"])
            for verifiers in VERIFIERS_GRID:
                net = replace(base, policy=policy, verifiers_per_audit=verifiers)
                multiplier = run_network(net, audit, params)["compute_multiplier"]
                rows.append(
                    {
                        "trusted_audit_ppm": ppm,
                        "random_segments": audit.random_segments,
                        "verifiers_per_audit": verifiers,
                        "compute_multiplier": multiplier,
                        "caught_within_10_worst": caught[worst]["caught_within_10"],
                        "worst_strategy": worst,
                        "caught_within_10_worst_compute_saving": caught[worst_saving]["caught_within_10"],
                        "worst_compute_saving_strategy": worst_saving,
                    }
                )
    rows.sort(key=lambda row: row["compute_multiplier"])
    return rows


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, required=True, help="write the figures here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trials", type=int, default=10, help="simulated networks per scenario")
    parser.add_argument("--units", type=int, default=Network().units, help="units per simulated network")
    parser.add_argument(
        "--audit-seeds", type=int, default=24, help="units audited per strategy and segment count"
    )
    parser.add_argument(
        "--audits", type=Path, default=None, help="reuse the audit measurement of an earlier output"
    )


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    if args.audits is not None:
        earlier = json.loads(args.audits.read_text())  # an earlier output keeps its audits with its inputs
        audits = [AuditMeasurement(**row) for row in earlier["inputs"]["audits"]]
        measured_in = f"read from {args.audits}"
    else:
        audits = measure_audits(args.audit_seeds, SEGMENT_COUNTS)
        measured_in = "this run"
    audit_seconds = time.monotonic() - started
    result = economics(audits, args.trials, args.units, args.seed)
    result["audits_measured_in"] = measured_in
    result["wall_seconds"] = {
        "audits": round(audit_seconds, 1),
        "total": round(time.monotonic() - started, 1),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(json.dumps({key: result[key] for key in ("compute_multiplier", "cheat_caught_within_10_units")}))
    return 0


def economics(audits: list[AuditMeasurement], trials: int, units: int, seed: int) -> dict[str, Any]:
    """The whole bench from audit measurements: today's policy, the cheapest audit policy meeting issue 9,
    and canaries alone at the rate the catch target needs."""
    params = MarketParams()
    base = Network(units=units, seed=seed)
    strategies = list(SAVED_FRACTION)
    today = next(audit for audit in audits if audit.random_segments == 1)  # VerifierPolicy() default
    scenarios = evaluate(base, today, params, trials, strategies)
    figures = headline(scenarios, strategies)
    rows = search(base, audits, params, strategies)
    # proposals keep today's verifier panel (a lone verifier would be cheaper but is a weaker referee)
    panel = [row for row in rows if row["verifiers_per_audit"] == base.verifiers_per_audit]
    least = TARGETS["cheat_caught_within_10_units_min"]
    found = [row for row in panel if row["caught_within_10_worst"] >= least]
    saving = [row for row in panel if row["caught_within_10_worst_compute_saving"] >= least]
    proposal = None
    if saving:
        chosen, criterion = (
            (found[0], "every strategy") if found else (saving[0], "compute-saving strategies")
        )
        if chosen["compute_multiplier"] > TARGETS["compute_multiplier_max"]:
            chosen, criterion = saving[0], "compute-saving strategies"
        audit = next(a for a in audits if a.random_segments == chosen["random_segments"])
        net = replace(
            base,
            policy=replace(base.policy, trusted_audit_ppm=chosen["trusted_audit_ppm"]),
            verifiers_per_audit=chosen["verifiers_per_audit"],
        )
        proposed = headline(evaluate(net, audit, params, trials, strategies), strategies)
        proposal = {
            "parameters": chosen,
            "caught_target_met_for": criterion,
            **proposed,
            "meets_targets": meets(proposed),
        }

    def with_canaries(canary_ppm: int) -> dict[str, Any]:
        canaries = replace(base, canary_ppm=canary_ppm)
        return {
            "canary_ppm": canary_ppm,
            "honest_mature": _merge(
                [run_network(replace(canaries, seed=seed + i), today, params) for i in range(trials)]
            ),
            "noise_10pct": _merge(
                [
                    run_network(
                        replace(canaries, seed=seed + i, adversary_stake=0.1, strategy="noise"), today, params
                    )
                    for i in range(trials)
                ]
            ),
        }

    implemented = {"canary_rate_ppm": DEFAULT_CANARY_RATE_PPM, **with_canaries(IMPLEMENTED_CANARY_PPM)}
    lazy = lazy_verifier(scenarios["honest_mature"], today, unit_price(), base.verifiers_per_audit)
    return {
        **figures,
        "lazy_verifier": lazy,
        "meets_targets": meets(figures),
        "canary_alternative": with_canaries(CANARY_PPM),
        "canaries_default_rate": implemented,
        "targets": TARGETS,
        "cheater_expected_value_unit": "base units (1e-18 token) per cheating replica-unit, vs honest play",
        "scenarios": scenarios,
        "search": rows,
        "cheapest_meeting_caught_target": found[0] if found else None,
        "cheapest_meeting_caught_target_compute_saving": saving[0] if saving else None,
        "proposal": proposal,
        "parameters": {
            "policy": asdict(base.policy),
            "market_params": {key: str(value) for key, value in asdict(params).items()},
            "network": {k: v for k, v in asdict(base).items() if k != "policy"},
            "verifier_random_segments": today.random_segments,
            "trials": trials,
            "seed": seed,
        },
        "inputs": {
            "audits": [asdict(audit) for audit in audits],
            "audit_source": "verify_unit spot check of a lone replica, charlm-tiny H=16 c=2 (measure_audits)",
            "dispute_detection": DISPUTE_DETECTION,
            "honest_false_fraud": HONEST_FALSE_FRAUD,
            "dispute_source": "docs/VERIFICATION.md section 3: 50/50 per strategy, 0 false fraud in 1 650",
            "verifier_step_fraction_dispute": VERIFIER_STEP_FRACTION,
            "saved_fraction": SAVED_FRACTION,
            "saved_source": "node/dishonest.py steps skipped; bf16 ASSUMPTION 0.5",
            "unit_price": unit_price(),
            "price_source": f"price_for_flops({RECIPE}, {UNIT_STEPS} steps, 1 token/PFLOP)",
            "gas_per_settled_unit_k3": GAS_PER_SETTLED_UNIT_K3,
            "gas_per_verdict": GAS_PER_VERDICT,
            "gas_source": "docs/BENCHMARKS.md (hardhat gas test, batched path; verdict with collateral)",
            "fault_ppm": base.fault_ppm,
            "fault_source": "ASSUMPTION",
        },
    }
