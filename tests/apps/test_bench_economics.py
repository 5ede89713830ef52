"""`veritrain bench economics`: its JSON schema and the simulation's real behaviour on injected audit
measurements, and one real audit per strategy (the full measurement takes minutes on a CPU)."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from apps.bench_economics import (
    COPY,
    SAVED_FRACTION,
    AuditMeasurement,
    Network,
    lazy_verifier,
    measure_audits,
    run_network,
)
from apps.cli import main
from market.domain.replication import ReplicationPolicy
from veritrain.chain.deployment import MarketParams

STRATEGIES = list(SAVED_FRACTION)


def audit(random_segments: int, detection: float, cost: float, **overrides: float) -> AuditMeasurement:
    return AuditMeasurement(
        random_segments=random_segments,
        detection={name: overrides.get(name, detection) for name in STRATEGIES},
        honest_cost=cost,
        trials=4,
        honest_false_fraud=0,
    )


AUDITS = [audit(1, 1.0, 0.25, noise=0.25), audit(3, 1.0, 0.5, noise=0.5), audit(7, 1.0, 1.0)]


def test_schema_and_honest_network(tmp_path: Path) -> None:
    source = tmp_path / "audits.json"
    source.write_text(json.dumps({"inputs": {"audits": [asdict(a) for a in AUDITS]}}))  # an earlier output
    out = tmp_path / "economics.json"
    argv = ["bench", "economics", "--audits", str(source), "--trials", "2", "--units", "1000"]
    assert main([*argv, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert isinstance(report["compute_multiplier"], float) and report["compute_multiplier"] > 1.0
    assert 0.0 <= report["cheat_caught_within_10_units"] <= 1.0
    assert set(report["cheater_expected_value"]) == set(STRATEGIES)
    assert all(isinstance(ev, int) for ev in report["cheater_expected_value"].values())
    assert report["honest_false_slash_rate"] == 0.0
    assert set(report["scenarios"]) == {
        "honest_mature",
        "honest_newcomers",
        "adversary_10pct",
        "adversary_30pct",
    }
    honest = report["scenarios"]["honest_mature"]
    assert honest["cheating_units"] == 0 and honest["honest_slashed"] == 0 and honest["audits"] > 0
    lazy = report["lazy_verifier"]
    assert lazy["expected_value_per_job"] < 0 < lazy["saved_per_job"]  # plants make laziness a loss
    # a mature network trusts most providers: most units run with one replica
    assert honest["units_by_k"]["1"] > 0.9 * 2 * 1000
    assert report["parameters"]["seed"] == 0 and report["parameters"]["trials"] == 2
    assert report["inputs"]["audits"][0]["random_segments"] == 1 and report["wall_seconds"]["total"] >= 0
    # the market's default canary rate (5 % of verified units) is 4.76 % of the units worked
    assert report["canaries_default_rate"]["canary_ppm"] == 47_619
    assert report["canaries_default_rate"]["canary_rate_ppm"] == 50_000
    # the worst strategy is the one the audits catch least (noise: only 1 segment in 4 here)
    assert report["cheat_caught_within_10_units_worst_strategy"] == "noise"
    assert (
        report["search"]
        and report["search"][0]["compute_multiplier"] <= report["search"][-1]["compute_multiplier"]
    )


def test_deterministic_per_seed() -> None:
    params = MarketParams()
    net = Network(adversary_stake=0.3, strategy="skip-10pct", units=2000)
    first, second = (run_network(net, AUDITS[0], params) for _ in range(2))
    assert first == second and first["cheating_units"] > 0
    assert run_network(replace(net, seed=1), AUDITS[0], params) != first


def test_a_strategy_never_caught_pays_and_one_always_caught_does_not() -> None:
    params = MarketParams()
    blind = audit(1, 1.0, 0.25, **{"skip-90pct": 0.0})
    never = run_network(Network(adversary_stake=0.1, strategy="skip-90pct"), blind, params)
    assert never["cheating_units"] > 0 and never["cheating_units_caught"] == 0
    assert never["cheater_ev_per_cheating_unit"] > 0
    caught = run_network(Network(adversary_stake=0.1, strategy="skip-90pct"), AUDITS[0], params)
    assert caught["cheating_units_caught"] > 0 and caught["cheater_ev_per_cheating_unit"] < 0
    # the copier is caught every time beside the replica it copies and loses the withhold penalty
    copier = run_network(Network(adversary_stake=0.3, strategy=COPY), blind, params)
    assert copier["cheating_units"] == copier["cheating_units_caught"] > 0


@pytest.mark.parametrize("strategy", ["skip-50pct", "noise"])
def test_raising_the_audit_rate_catches_cheaters_sooner(strategy: str) -> None:
    params = MarketParams()
    rates = (50_000, 200_000, 900_000)
    caught = []
    for ppm in rates:
        net = Network(adversary_stake=0.1, strategy=strategy, policy=ReplicationPolicy(trusted_audit_ppm=ppm))
        runs = [run_network(replace(net, seed=seed), AUDITS[0], params) for seed in range(3)]
        caught.append(
            sum(r["careers_caught_within_10"] for r in runs) / sum(r["cheating_careers"] for r in runs)
        )
    assert caught[0] < caught[1] < caught[2]


def test_audits_and_newcomers_cost_compute() -> None:
    params = MarketParams()
    mature = run_network(Network(), AUDITS[0], params)["compute_multiplier"]
    no_audits = run_network(Network(policy=ReplicationPolicy(trusted_audit_ppm=0)), AUDITS[0], params)
    newcomers = run_network(Network(mature=False), AUDITS[0], params)["compute_multiplier"]
    assert no_audits["audits"] < 0.01 * 10_000 and no_audits["compute_multiplier"] < mature < newcomers


def test_canaries_catch_what_audits_miss_and_cost_compute() -> None:
    params = MarketParams()
    blind = audit(1, 1.0, 0.25, noise=0.0)
    net = Network(adversary_stake=0.1, strategy="noise")
    missed = run_network(net, blind, params)
    assert missed["cheating_units"] > 0 and missed["cheating_units_caught"] == 0
    assert missed["cheater_ev_per_cheating_unit"] == 0  # noise saves no compute: never caught, it breaks even
    canaries = run_network(replace(net, canary_ppm=400_000), blind, params)
    assert canaries["caught_within_10"] > 0.9 and canaries["cheater_ev_per_cheating_unit"] < 0
    honest = run_network(Network(), blind, params)["compute_multiplier"]
    # 0.4 / 0.6 canaries per useful unit, each a replica (k = 1 on a mature network) and its audit draw;
    # no second run of the known answer (market/canary.py reuses the source unit's verified result)
    extra = run_network(Network(canary_ppm=400_000), blind, params)["compute_multiplier"] - honest
    assert 0.6 < extra < 0.8


def test_audit_measurement_runs_the_verifier_core() -> None:
    """One real audit per strategy (charlm-tiny, H = 16, c = 2): an honest unit passes at 2 + 2 of 16 steps,
    a unit that did no training is caught."""
    (measured,) = measure_audits(1, (1,))
    assert measured.random_segments == 1 and measured.trials == 1
    assert measured.honest_false_fraud == 0 and measured.honest_cost == 0.25
    assert set(measured.detection) == set(STRATEGIES)
    assert measured.detection["start-state"] == 1.0 and measured.detection["random-weights"] == 1.0


def test_a_lazy_verifier_saves_each_audit_and_loses_the_slash_on_each_plant_among_its_jobs() -> None:
    """100 plants among 1,000 units with 900 audits: a tenth of the jobs; 0.25 of a unit saved per job."""
    honest = {"units": 10_000, "audits": 900, "useful_flops": 10_000.0}
    lazy = lazy_verifier(honest, AUDITS[0], price=4 * 10**18, verifiers_per_audit=2)
    plants = 10_000 * lazy["plant_rate_ppm"] / 1_000_000
    share = plants / (900 + plants)
    assert lazy["planted_share_of_jobs"] == round(share, 5)
    assert lazy["saved_per_job"] == 10**18
    assert lazy["expected_value_per_job"] == round(10**18 - share * lazy["verifier_slash"])
    assert lazy["break_even_planted_share"] == round(10**18 / lazy["verifier_slash"], 7)
    assert lazy["compute_multiplier_added"] == round(plants * 2 * 0.25 / 10_000, 5)
