"""Which contracts scripts/compile-mutant.js compiles again for a patch (`--plan`: the contract names, no
compile), on made-up patches of the real contracts: an importing contract (VerdictAppeals imports
JobMarket.sol and StakeManager.sol) is compiled again only when the patch reaches what it can see or
contains, never for a patch inside the body of a function of a contract it neither inherits nor creates."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.chain.invariants_harness import CONTRACT_NAMES

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(REPO_ROOT / "scripts" / "compile-mutant.js")
JOB_MARKET = ("JobMarket", "JobMarketExtension", "JobMarketRoundsExtension")
APPEALS = "VerdictAppeals"


def _patch(file: str, find: str, replace: str) -> dict[str, str]:
    return {"file": file, "find": find, "replace": replace}


# mutant id -> (patches, the contracts compiled again)
CASES: dict[str, tuple[list[dict[str, str]], set[str]]] = {
    # inside a function body of JobMarketBase: its inheritors only, not the importer
    "body": ([_patch("JobMarket.sol", "acc.credit += price;", "acc.credit += price * 2;")], set(JOB_MARKET)),
    # braces in a comment and a string inside a body are not structure
    "body-comment-and-string": (
        [_patch("JobMarket.sol", "acc.credit += price;", 'acc.credit += price; // }\n        bytes("}{");')],
        set(JOB_MARKET),
    ),
    # StakeManager's own body: JobMarket.sol imports it but only calls it, as VerdictAppeals does
    "stake-body": (
        [_patch("StakeManager.sol", "uint256 rest = amount - fromBonded;", "uint256 rest = 0;")],
        {"StakeManager"},
    ),
    # a body of a base (TypedSignatures): every contract inheriting it, not the importer
    "base-body": (
        [_patch("TypedSignatures.sol", "timestamp > deadline)", "timestamp >= deadline)")],
        {"StakeManager", *JOB_MARKET},
    ),
    # a struct field an importer reads (VerdictAppeals reads UnitView through getUnit)
    "struct": (
        [_patch("JobMarket.sol", "bool drawn;\n        uint64 commitDeadline;", "uint64 commitDeadline;")],
        {*JOB_MARKET, APPEALS},
    ),
    # a constant (outside every body)
    "constant": (
        [_patch("JobMarket.sol", "MAX_REPLICAS = 5;", "MAX_REPLICAS = 6;")],
        {*JOB_MARKET, APPEALS},
    ),
    # a function's signature an importer calls
    "signature": (
        [_patch("JobMarket.sol", "function getUnit(uint256 unitId)", "function getUnit(uint128 unitId)")],
        {"JobMarket", APPEALS},
    ),
    # an event of StakeManager: its importers see it
    "event": (
        [_patch("StakeManager.sol", "Staked(address indexed account,", "Staked(address account,")],
        {"StakeManager", *JOB_MARKET, APPEALS},
    ),
    # a replacement that closes the body and declares a function: outside the bodies after all
    "breaks-out-of-body": (
        [
            _patch(
                "JobMarket.sol",
                "acc.credit += price;",
                "acc.credit += price; }\n    function injected() external pure returns (uint256) { return 1;",
            )
        ],
        set(JOB_MARKET) | {APPEALS},
    ),
    # braces left unbalanced: not understood, so compiled again
    "unbalanced": (
        [_patch("JobMarket.sol", "acc.credit += price;", "acc.credit += price; {")],
        {*JOB_MARKET, APPEALS},
    ),
    # the importer's own file: itself only, as before
    "own-file": (
        [_patch("VerdictAppeals.sol", "if (count == seats / 2 + 1) {", "if (count == seats / 2) {")],
        {APPEALS},
    ),
}


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    mutants = tmp_path_factory.mktemp("plan") / "mutants.json"
    mutants.write_text(json.dumps({"mutants": [{"id": i, "patches": p} for i, (p, _) in CASES.items()]}))
    completed = subprocess.run(
        ["node", SCRIPT, "--plan", "--mutants", str(mutants), *CASES],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    result: dict[str, list[str]] = json.loads(completed.stdout)
    return result


@pytest.mark.parametrize("mutant", list(CASES))
def test_a_patch_compiles_again_what_it_can_change(plan: dict[str, list[str]], mutant: str) -> None:
    assert set(plan[mutant]) == CASES[mutant][1]
    assert set(plan[mutant]) <= set(CONTRACT_NAMES)


def test_no_seeded_mutant_of_an_imported_file_compiles_the_importer_again() -> None:
    """Every seeded mutant of JobMarket.sol and StakeManager.sol patches a function body, so the
    committed cache holds VerdictAppeals' bytecode for the VerdictAppeals.sol mutants alone."""
    mutants = json.loads((REPO_ROOT / "tests" / "chain" / "mutants" / "mutants.json").read_text())["mutants"]
    ids = [m["id"] for m in mutants]
    completed = subprocess.run(
        ["node", SCRIPT, "--plan", *ids],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    plan = json.loads(completed.stdout)
    for mutant in mutants:
        own = {patch["file"] for patch in mutant["patches"]} == {"VerdictAppeals.sol"}
        assert (APPEALS in plan[mutant["id"]]) == own, mutant["id"]
