"""Stateful invariant tests of the contracts on a hardhat node (SECURITY.md A1, A2, A7, A8, A15).

`test_market_invariants_hold` runs random market histories (invariants_machine.MarketMachine: per-unit
units and round-path rosters on the same orders) against
the bytecode shipped in veritrain/contracts_data and a Python reference model, checking the named
invariants after every step and that every fund exits at the end of every example. The mutation tests
seed one bug at a time into the Solidity sources (tests/chain/mutants/mutants.json), compile it with
scripts/compile-mutant.js (or read it from the committed cache of compiled variants while that is current:
tests/chain/mutant_cache.py, scripts/refresh-mutant-cache), and require the invariant that targets the
bug to trip — so a passing run is not a vacuous one.

Budget knobs (environment): VERITRAIN_INVARIANT_EXAMPLES, VERITRAIN_INVARIANT_STEPS,
VERITRAIN_INVARIANT_SEED (an integer, or "random" for a fresh seed that is printed for replay).
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.stateful import get_state_machine_test

from tests.chain.invariants_harness import (
    PANEL_OF_THREE,
    AppealParams,
    MarketParams,
    compile_variant,
    compile_variants,
    load_package_artifacts,
)
from tests.chain.invariants_machine import INVARIANTS, InvariantViolation, build_chain, machine_for
from tests.chain.invariants_model import UnitState
from tests.chain.invariants_scenarios import (
    SCENARIOS,
    appeal_params_of,
    roster_overturn_slashes_missed_fraud,
    run_scenario,
)

pytestmark = [pytest.mark.chain, pytest.mark.node_backend]

MUTANTS_FILE = Path(__file__).parent / "mutants" / "mutants.json"
DEFAULT_SEED = 20261122
EXAMPLES = int(os.environ.get("VERITRAIN_INVARIANT_EXAMPLES", "60"))
STEPS = int(os.environ.get("VERITRAIN_INVARIANT_STEPS", "40"))


def _seed() -> int:
    configured = os.environ.get("VERITRAIN_INVARIANT_SEED", "")
    if configured == "random":
        return random.SystemRandom().randrange(2**32)
    return int(configured) if configured else DEFAULT_SEED


def _layouts(variant: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {name: data["storageLayout"] for name, data in variant.items()}


def _mutants() -> list[dict[str, Any]]:
    mutants: list[dict[str, Any]] = json.loads(MUTANTS_FILE.read_text())["mutants"]
    return mutants


def _random_histories(params: MarketParams, examples: int, appeal_params: AppealParams | None = None) -> Any:
    """Hypothesis runs `examples` random histories of STEPS calls on the shipped bytecode deployed with
    `params` (and `appeal_params`), every call checked against the model and every invariant after each;
    returns the machine class with its call counts."""
    chain = build_chain(load_package_artifacts(), _layouts(compile_variant(None)), params, appeal_params)
    machine = machine_for(chain)
    run_seed = _seed()
    print(f"\ninvariant run: seed {run_seed} (replay: VERITRAIN_INVARIANT_SEED={run_seed}), {params}")
    print(f"{chain.appeal_params}")
    print(f"{examples} examples x {STEPS} steps")
    test = get_state_machine_test(
        machine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=STEPS,
            deadline=None,
            database=None,
            suppress_health_check=[
                HealthCheck.too_slow,
                HealthCheck.data_too_large,
                HealthCheck.filter_too_much,
            ],
        ),
    )
    started = time.monotonic()
    hypothesis_seed(run_seed)(test)()
    elapsed = time.monotonic() - started
    calls = sum(ok + bad for ok, bad in machine.call_stats.values())
    print(f"{calls} contract calls in {elapsed:.0f} s")
    for fn, (ok, bad) in sorted(machine.call_stats.items()):
        print(f"  {fn:24s} succeeded {ok:5d}  reverted as the model predicted {bad:5d}")
    for name, count in sorted(machine.error_stats.items()):
        print(f"    {name:50s} {count:5d}")
    return machine


def test_market_invariants_hold() -> None:
    """Random histories on the shipped bytecode: no invariant trips, and most calls of each kind succeed.
    Probation off: fresh providers reach the fast path (the next test turns it on)."""
    machine = _random_histories(MarketParams(), EXAMPLES)
    # Vacuous-pass guard (foundry #1572): every action must have succeeded, and settled units,
    # verdicts, slashes and held fraud settled by a standing and by an overturned verdict (a framed
    # provider paid) must have happened, or the invariants were checked on an idle market.
    required = (
        "stake",
        "assign",
        "commit",
        "reveal",
        "finalize",
        "submitVerdict",
        "expireUnit",
        "closeOrder",
        "withdrawCredit",
        "withdrawCreditWithSig",
        "withdraw",
        "withdrawWithSig",
        "slash",
        "requestUnstake",
        "requestUnstakeWithSig",
        "commitWithSig",
        "requestVerification",
        "postAdaptiveOrder",
        "assign (reduced unit)",
        "appeal",
        "drawPanel",
        "vote",
        "resolve",
        "lapse",
        "settleVerdict",
        "leavePool",
        "settleHeld (stands)",
        "settleHeld (overturned)",
        "settleHeld (framed paid)",
        "openRoster",
        "stepRound",
        "stepRound (set aside)",
        "stepRound (withheld)",
        "publishOpening",
        "closeRoster",
        "stepRound (pending or posted)",
        "setAsidePending",
        "stepRound (posted by a bare quorum)",
        "challengeAudit",
        "slashRoundAudit",
        "slashRoundAudit (signers slashed by a rule)",  # not only by the drain at the example's end
    )
    idle = [fn for fn in required if machine.call_stats.get(fn, [0, 0])[0] == 0]
    assert not idle, f"these actions never succeeded, so the run proves little about them: {idle}"


def test_probation_in_random_histories() -> None:
    """Probation on (1 valid unit): a unit with a provider that has no valid unit since its last fault or
    fraud is drawn at assignment. The model predicts every unit's drawn bit and every finalize it refuses
    (`UnitUnderVerification`), and on the round path every unit such a provider works is set aside by the
    step that reveals it; the invariants hold. Fewer examples: the rest is the test above."""
    machine = _random_histories(MarketParams(probation_streak=1), max(EXAMPLES // 4, 5))
    assert machine.call_stats["assign"][0] > 0 and machine.call_stats["submitVerdict"][0] > 0
    assert machine.error_stats.get("finalize: UnitUnderVerification", 0) > 0
    assert machine.call_stats.get("stepRound (set aside)", [0, 0])[0] > 0


def test_panel_of_three_in_random_histories() -> None:
    """Three referees on every panel (PANEL_OF_THREE): the referees vote one by one, mostly the truth, so
    an appeal is decided 2 to 1 with the dissent cast first or between the majority's votes, or 2 to 0;
    panel_majority and the model's decisions hold. Fewer examples: the rest is the first test."""
    machine = _random_histories(MarketParams(), max(EXAMPLES // 3, 5), PANEL_OF_THREE)
    for path in (
        "resolve",
        "settleHeld (overturned)",
        "vote (decided over a dissent cast first)",
        "vote (decided over a dissent cast between the majority's votes)",
    ):
        assert machine.call_stats.get(path, [0, 0])[0] > 0, f"{path}: never in this run"


def test_every_invariant_has_a_mutant() -> None:
    """A2: each named invariant is the target of at least one seeded bug."""
    targeted = {mutant["invariant"] for mutant in _mutants()}
    assert set(INVARIANTS) <= targeted, f"no mutant targets {set(INVARIANTS) - targeted}"
    assert {mutant["scenario"] for mutant in _mutants()} <= set(SCENARIOS)


@pytest.mark.slow
def test_scenarios_pass_on_real_contracts_and_each_mutant_trips_its_invariant() -> None:
    """Unmutated contracts (the shipped bytecode, which test_compiled_data ties to the sources): every
    scenario trips nothing. Each mutant: its scenario trips its invariant."""
    mutants = _mutants()
    variants = compile_variants([None, *(m["id"] for m in mutants)], processes=2)  # compiles dominate
    original = variants[None]
    by_chain: dict[AppealParams, list[str]] = {}  # one chain at a time: a new one reverts the node past it
    for name in SCENARIOS:
        by_chain.setdefault(appeal_params_of(name), []).append(name)
    for appeal_params, names in by_chain.items():
        machine = machine_for(build_chain(original, _layouts(original), appeal_params=appeal_params))
        for name in names:
            tripped = run_scenario(machine(), SCENARIOS[name])
            assert not tripped, f"scenario {name} trips {sorted(tripped)} on the unmutated contracts"
    report = []
    for mutant in mutants:
        variant = variants[mutant["id"]]
        chain = build_chain(variant, _layouts(variant), appeal_params=appeal_params_of(mutant["scenario"]))
        tripped = run_scenario(machine_for(chain)(), SCENARIOS[mutant["scenario"]])
        report.append(f"{mutant['id']:30s} -> {sorted(tripped)}")
        assert mutant["invariant"] in tripped, (
            f"mutant {mutant['id']} ({mutant['description']}) should trip {mutant['invariant']}, "
            f"tripped {sorted(tripped)}"
        )
    print("\n" + "\n".join(report))


def test_an_appeal_slashing_a_set_aside_replica_leaves_the_providers_other_locks() -> None:
    """provider0's open per-unit unit must keep its collateral locked after an appeal had it slashed for a
    set-aside round replica's missed fraud and the roster closed: TRUST.md gap 6, closed by
    JobMarket.settleHeld releasing one slot of the roster's lock before that slash (collateral_locked skips
    slashed accounts, so the random machine cannot see this: the scenario asserts it)."""
    variant = compile_variant(None)
    machine = machine_for(build_chain(variant, _layouts(variant)))()
    tripped: list[Any] = []
    original_check = machine.check_step

    def check() -> None:
        try:
            original_check()
        except InvariantViolation as violation:
            tripped.append(violation)

    machine.check_step = check  # type: ignore[method-assign]
    roster_overturn_slashes_missed_fraud(machine)
    assert not tripped, tripped
    provider0 = machine.address_of["provider0"]
    assert machine.model.units[1].state == UnitState.COMMITTING  # its per-unit unit is still open
    bonded, locked, _, _ = machine.storage.stake_of(provider0)
    collateral = machine.chain.params.provider_collateral
    assert (bonded, locked) == (2_500 - machine.chain.params.slash_amount, collateral), (
        f"provider0 has {locked} locked, its open unit needs {collateral}"
    )


# Seeded bugs in how a panel's majority is counted that a panel of one cannot tell from the real contract
# (mutants.json: their scenario is panel_majority, on a panel of three).
LARGER_PANEL_MUTANTS = ("panel-decides-at-first-vote", "panel-counts-every-vote")


@pytest.mark.slow
def test_only_a_larger_panel_catches_a_miscounted_majority() -> None:
    """Every scenario on a panel of one passes on the mutants that miscount a larger panel's majority, so
    without panel_majority's panel of three (which trips them: the test above) nothing would test that
    count."""
    variants = compile_variants(list(LARGER_PANEL_MUTANTS), processes=2)
    for mutant_id in LARGER_PANEL_MUTANTS:
        variant = variants[mutant_id]
        machine = machine_for(build_chain(variant, _layouts(variant)))
        for name, scenario in SCENARIOS.items():
            if appeal_params_of(name) == AppealParams():
                tripped = run_scenario(machine(), scenario)
                assert not tripped, f"{mutant_id}: scenario {name} trips {sorted(tripped)}"


@pytest.mark.slow
def test_random_run_finds_a_seeded_double_payment() -> None:
    """The random machine alone (no scenario) finds a seeded bug: 'credit-twice' breaks solvency."""
    variant = compile_variant("credit-twice")
    machine = machine_for(build_chain(variant, _layouts(variant)))
    test = get_state_machine_test(
        machine,
        settings=settings(
            max_examples=20,
            stateful_step_count=STEPS,
            deadline=None,
            database=None,
            phases=[Phase.generate],
            report_multiple_bugs=False,
            suppress_health_check=[
                HealthCheck.too_slow,
                HealthCheck.data_too_large,
                HealthCheck.filter_too_much,
            ],
        ),
    )
    with pytest.raises(InvariantViolation) as caught:
        hypothesis_seed(DEFAULT_SEED)(test)()
    assert "solvency" in caught.value.names
