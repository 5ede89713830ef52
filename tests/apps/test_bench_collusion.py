"""`veritrain bench collusion`: its JSON schema, and measured collusion rates within sampling error of the
exact model (a fixed seed, so every run counts the same units)."""

from __future__ import annotations

import json
from pathlib import Path

from apps.bench_collusion import binomial_majority, exact_all_adversarial, exact_majority
from apps.cli import main

UNITS = 3000


def test_collusion_rates_match_the_sampling_model(tmp_path: Path) -> None:
    out = tmp_path / "collusion.json"
    assert main(["bench", "collusion", "--units", str(UNITS), "--sybils", "20", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["units"] == UNITS and report["method"] and report["machine"]
    assert set(report["scenarios"]) == {"10%", "30%"}
    for scenario in report["scenarios"].values():
        share = scenario["adversary_stake_share"]
        replicas, majority = scenario["all_replicas_adversarial"], scenario["verifier_majority_adversarial"]
        assert set(replicas) == {"1", "2", "3", "4", "5"} and set(majority) == {"3", "5"}
        for k, figure in replicas.items():
            assert figure["binomial"] == share ** int(k)
        for v, figure in majority.items():
            assert figure["binomial"] == binomial_majority(int(v), share)
        for figure in [*replicas.values(), *majority.values()]:
            assert figure["measured"] == figure["count"] / UNITS
            # five standard errors, plus a few units for rates too small to have a normal error
            assert abs(figure["measured"] - figure["exact"]) < 5 * figure["std_error"] + 3 / UNITS


def test_exact_models_agree_with_the_binomial_for_many_small_keys() -> None:
    """With the adversary's stake over many keys, sampling without replacement is nearly binomial (here
    100 tokens on 10,000 keys against 100 honest keys of 10 tokens: a share of 1/11); with one key, two
    adversarial picks are impossible."""
    assert abs(exact_all_adversarial(3, 10_000, 10**16, 100) - (1 / 11) ** 3) < 1e-5
    assert abs(exact_majority(3, 10_000, 10**16, 100) - binomial_majority(3, 1 / 11)) < 5e-4
    assert exact_all_adversarial(2, 1, 10**18, 9) == 0.0
