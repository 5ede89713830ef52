"""The dishonest strategies are well-formed (only re-execution can catch them) and the quick bench holds."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from node.dishonest import STRATEGIES, forge_unit
from verifier.calibrate import load_tolerances
from verifier.core import Submission, UnitRequest, submission_problem
from veritrain import pol
from veritrain.datasets import load_dataset

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.torch
@pytest.mark.parametrize("round_index", [0, 1])
def test_every_strategy_forges_a_self_consistent_transcript(round_index: int) -> None:
    """A forged result must pass every check that needs no re-execution, or the bench would test nothing.

    Round 1 starts from a trained state whose optimizer counter is not 0: a forger must continue it."""
    spec = pol.UnitSpec(
        recipe="digits-mlp", order_seed=3, round_index=round_index, shard=0, steps=8, checkpoint_every=2
    )
    recipe = spec.recipe_config()
    dataset = load_dataset(recipe.dataset)
    start = pol.initial_state(recipe, 1)
    if round_index:
        start = pol.execute_unit(dataset, pol.UnitSpec("digits-mlp", 3, 0, 0, 5, 5), start).final_state
    request = UnitRequest(
        spec=spec,
        start_state=start,
        data_order_commitment=pol.data_order_commitment(recipe, dataset, spec),
        randomness=b"\x00" * 32,
    )
    honest = pol.execute_unit(dataset, spec, start)
    for name in STRATEGIES:
        forged = forge_unit(name, spec, start, dataset, seed=5)
        submission = Submission(
            provider=name, result_digest=forged.result_digest, transcript=forged.transcript, evidence=None
        )
        problem = submission_problem(request, submission)
        # only the evidence is absent: everything that needs no re-execution passes
        assert problem == "no transcript or checkpoints served", (name, problem)
        assert forged.result_digest != honest.result_digest, name
        assert pol.state_step(forged.final_state) == pol.state_step(start) + spec.steps, name
        assert [pol.state_digest(forged.checkpoints[s]) for s in spec.checkpoint_steps()] == list(
            forged.transcript.checkpoint_digests
        ), name


def test_committed_tolerances_cover_both_recipes_and_grow_with_length() -> None:
    for recipe in ("charlm-tiny", "digits-mlp"):
        table = load_tolerances(recipe)
        lengths = sorted(table.by_steps)
        assert lengths[0] == 1 and lengths[-1] >= 16
        for shorter, longer in itertools.pairwise(lengths):
            assert (
                table.by_steps[shorter].groups["model"].rel_l2
                <= table.by_steps[longer].groups["model"].rel_l2
            )


@pytest.mark.slow
@pytest.mark.torch
def test_quick_verification_bench_schema_and_no_false_fraud(tmp_path: Path) -> None:
    out = tmp_path / "verification.json"
    completed = subprocess.run(
        [sys.executable, "-m", "apps", "bench", "verification", "--json", str(out), "--quick"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    result = json.loads(out.read_text())
    assert set(result) >= {
        "strategies",
        "honest",
        "verifier_steps_per_checked_unit",
        "expected_verifier_overhead",
    }
    assert set(result["honest"]) == {"comparisons", "false_fraud", "false_fault"}
    assert result["honest"]["comparisons"] >= 24 and result["honest"]["false_fraud"] == 0
    assert len(result["strategies"]) >= 11
    for name, entry in result["strategies"].items():
        assert set(entry) == {"trials", "detected"}, name
        assert isinstance(entry["trials"], int) and entry["trials"] >= 6, name
        assert entry["detected"] == entry["trials"], name
    assert 0 < result["expected_verifier_overhead"] <= 0.05
    assert isinstance(result["verifier_steps_per_checked_unit"], float)
