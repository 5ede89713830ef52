"""`veritrain bench protocol --quick --in-process`: the JSON schema, and the targets checked on what the
bench measured.

Attacks the protocol defends must show a loss for the cheater, no honest loss, and detection in every
trial; a colluding verifier majority (finding 4) is one of them since verdicts can be appealed to a
referee panel. A sybil ring of fresh keys on one unit (finding 3) is one too: a unit with a provider on
probation is drawn at assignment (a ring of keys past probation is drawn at the spot-check rate only:
`bench economics` prices that career). The framing of an honest replica by a colluding verifier majority
is defended: a verdict's fraud is held until the unit's truth is fixed, so the appeal's overturn pays the
framed replica, and the colluders lose their verifier slash with no bounty to show for it; when every
verifier is in the ring, the framed provider's own watch appeals. A provider past its probation that
reveals a wrong canary result straight on chain is checked against the known answer by the market's sync
all the same (the fast path is the operator's until the verdict deadline).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from apps.cli import main

pytestmark = pytest.mark.chain

DEFENDED = [
    "reveal_withholding",
    "lazy_verifier",
    "verdict_replay",
    "colluding_verifier_majority",
    "verifier_majority_framing",
    "unanimous_verifier_framing",
    "sybil_ring",
    "spot_check_timing",
    "canary_around_the_market",
]
GRIEFING = ["buyer_expire_griefing", "event_sync_staller"]  # no token upside: gain 0, the cost is gas
FLOOD = ["blob_flood"]  # throwaway keys: nothing at stake, nothing gained
KEYS = {"trials", "cheater_net_gain", "honest_loss", "detected", "worst_trial_gain", "profitable_trials"}


@pytest.fixture(scope="module")
def figures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench") / "protocol.json"
    # the in-process EVM (same bytecode) keeps this test free of Node; the bench's default is a hardhat node
    assert main(["bench", "protocol", "--quick", "--in-process", "--json", str(out)]) == 0
    return dict(json.loads(Path(out).read_text()))


def test_schema(figures: dict[str, Any]) -> None:
    attacks = figures["attacks"]
    assert set(attacks) == {*DEFENDED, *GRIEFING, *FLOOD}
    for name, row in attacks.items():
        assert set(row) >= KEYS, name
        assert all(isinstance(row[key], int) for key in KEYS), name
        assert row["trials"] == 2, name
    missed = {n for n, r in attacks.items() if r["worst_trial_gain"] >= 0 or r["honest_loss"] != 0}
    assert set(figures["targets_missed"]) == missed


@pytest.mark.parametrize("name", DEFENDED)
def test_defended_attacks_cost_the_cheater(figures: dict[str, Any], name: str) -> None:
    row = figures["attacks"][name]
    assert row["worst_trial_gain"] < 0 and row["cheater_net_gain"] < 0
    assert row["honest_loss"] == 0
    assert row["detected"] == row["trials"]


@pytest.mark.parametrize("name", GRIEFING)
def test_griefing_is_refused_and_costs_honest_parties_nothing(figures: dict[str, Any], name: str) -> None:
    row = figures["attacks"][name]
    assert row["worst_trial_gain"] <= 0 and row["honest_loss"] == 0
    assert row["detected"] == row["trials"]
    assert row["cheater_gas_wei"] > 0


def test_a_blob_flood_is_refused_and_verifiers_are_served(figures: dict[str, Any]) -> None:
    row = figures["attacks"]["blob_flood"]
    assert row["cheater_net_gain"] == 0 and row["honest_loss"] == 0
    assert row["detected"] == row["trials"]


def test_a_reveal_in_the_seed_block_is_always_refused(figures: dict[str, Any]) -> None:
    row = figures["attacks"]["spot_check_timing"]
    assert row["refused_transactions"] == row["trials"]  # RevealTooEarly: the draw cannot be timed
