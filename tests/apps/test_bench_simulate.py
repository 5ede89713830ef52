"""The network simulator's invariants (apps/bench_simulate.py) and its command's JSON."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from apps.bench_simulate import (
    GPUS,
    HOME,
    MBIT,
    UNLIMITED,
    Links,
    Scenario,
    Simulation,
    simulate,
    step_seconds,
)
from apps.cli import main
from market.domain.pricing import escrow_plan
from veritrain.recipes import get_recipe

SMALL = Scenario(providers=16, shards=8, inner_steps=2000, units_per_order=16)


def test_more_bandwidth_never_lowers_utilisation() -> None:
    """Monotone up to list-scheduling noise (Graham's anomalies: faster transfers reorder the greedy
    matching and can shift which order ends first by a fraction of a step), bounded here at 0.002."""
    ladder = [Links(5 * MBIT, 25 * MBIT), HOME, Links(100 * MBIT, 500 * MBIT), Links(1e4 * MBIT, 1e4 * MBIT)]
    for base in (SMALL, replace(SMALL, swarm=True), replace(SMALL, replicas=2, providers=20)):
        figures = [simulate(replace(base, links=links)) for links in [*ladder, UNLIMITED]]
        utilisation = [f["gpu_utilisation"] for f in figures]
        assert all(b >= a - 0.002 for a, b in itertools.pairwise(utilisation)), utilisation
        times = [f["time_to_train_s"] for f in figures]
        assert all(b <= a * 1.002 for a, b in itertools.pairwise(times)), times
        assert utilisation[0] < utilisation[-1]


def test_churn_drops_replicas_and_costs_time_but_not_money() -> None:
    calm = simulate(SMALL)
    churn = simulate(replace(SMALL, session_s=600.0, offline_s=300.0))
    assert calm["replicas_dropped"] == 0 and calm["wasted_provider_s"] == 0
    assert churn["replicas_dropped"] > 0 and churn["wasted_provider_s"] > 0
    assert churn["time_to_train_s"] > calm["time_to_train_s"]
    # a dropped replica is a fault: unpaid, so the buyer pays for the same accepted replicas
    assert churn["cost_per_order"] - calm["cost_per_order"] == pytest.approx(0, abs=10**18)


def test_m1_is_sequential_training_on_one_provider() -> None:
    gpu = GPUS[1]
    units, steps = 5, 300
    one = Scenario(1, 1, inner_steps=steps, units_per_order=units, orders=1, gpus=(gpu,), spot_checks=False)
    sequential = units * steps * step_seconds(get_recipe(one.recipe), gpu)
    free = simulate(replace(one, links=UNLIMITED, settle_s=0.0))
    assert free["time_to_train_s"] == pytest.approx(sequential, abs=0.1)
    assert free["gpu_utilisation"] == pytest.approx(1.0)
    # on home links too: the provider holds its own previous result, so no blob moves at all
    home = simulate(one)
    assert home["bytes_moved_per_order"] == 0
    assert home["time_to_train_s"] == pytest.approx(sequential + units * one.settle_s, abs=0.1)


def test_cost_is_integer_escrow_price_times_accepted_replicas() -> None:
    scenario = replace(SMALL, shards=1, providers=4, orders=1, spot_checks=False, gpus=(GPUS[1],))
    figures = simulate(scenario)
    recipe = get_recipe(scenario.recipe)
    spec_price = escrow_plan(Simulation(scenario).spec, recipe.flops_per_step()).price_per_replica
    assert isinstance(figures["cost_per_order"], int)
    assert figures["cost_per_order"] == scenario.units_per_order * spec_price
    tripled = simulate(replace(scenario, replicas=3))
    assert tripled["cost_per_order"] == 3 * figures["cost_per_order"]


def test_deterministic_for_a_seed() -> None:
    churny = replace(SMALL, session_s=900.0)
    assert simulate(churny) == simulate(churny)
    assert simulate(churny) != simulate(replace(churny, seed=1))


def test_cli_writes_the_figures(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    assert main(["bench", "simulate", "--quick", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert isinstance(figures["utilisation_64_home"], float) and 0 < figures["utilisation_64_home"] <= 1
    assert figures["target"] == 0.85
    shapes = {(row["providers"], row["shards"]) for row in figures["grid"]}
    assert shapes == {(8, 8), (8, 16), (64, 8), (64, 16)}
    for row in figures["grid"]:
        assert isinstance(row["cost_per_order"], int) and row["cost_per_order"] > 0
        assert row["time_to_train_s"] > 0 and 0 < row["gpu_utilisation"] <= 1
    assert set(figures["headline"]) >= {"today", "swarm", "unlimited_links_no_checks"}
    assert figures["churn"]["session_2h"]["replicas_dropped"] > 0
    assert math.isfinite(figures["model"]["flops_per_step"])
