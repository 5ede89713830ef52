"""The fixed test vector of the aggregate unit's digests: tests/fixtures/aggregate_vector.json.

tests/training/test_diloco.py tests against the file (in this process, and the same computation in
subprocesses on every calibration configuration, bitwise); a contract that recomputes ``inputsCommitment``
and ``resultDigest`` on chain should test against the same file. Regenerate (only when a formula changes on
purpose): ``.venv/bin/python -m tests.training.aggregate_vector --write``. ``--threads N`` prints the
vector computed with N intra-op threads instead (the cross-configuration test runs that).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

VECTOR_PATH = Path(__file__).resolve().parents[1] / "fixtures" / "aggregate_vector.json"
FORMULAS = {
    "outerConfigDigest": "sha256('veritrain/outer-config/v1' || uint8 len || 'nesterov' || uint8 len || "
    "aggregation || uint16 trim || float64 lr || float64 momentum), big endian",
    "inputsCommitment": "sha256('veritrain/aggregate-inputs/v1' || startStateDigest || uint32 round || "
    "uint16 M || acceptedStateDigest_0..M-1 (32 zero bytes where a shard has no accepted result) || "
    "outerConfigDigest), big endian",
    "resultDigest": "sha256('veritrain/aggregate-result/v1' || outputStateDigest || inputsCommitment)",
}


def _case(name: str, recipe: str, round_index: int, present: list[bool], config: Any) -> dict[str, Any]:
    from apps.bench_training import synthetic_result
    from veritrain import diloco, pol
    from veritrain.recipes import get_recipe

    genesis = pol.initial_state(get_recipe(recipe), 0)
    round_state = diloco.genesis_round_state(genesis)
    if round_index:  # a later round: momentum already non-zero
        round_state = diloco.outer_step(round_state, [synthetic_result(genesis, 99)], diloco.OuterConfig())
    results = tuple(
        synthetic_result(genesis, m, 1e-3 * (m + 1), 7) if ok else None for m, ok in enumerate(present)
    )
    inputs = diloco.AggregateInputs(round_index, round_state, results, config)
    output = diloco.aggregate(inputs)
    return {
        "name": name,
        "recipe": recipe,
        "startStateDigest": "0x" + pol.state_digest(round_state).hex(),
        "round": round_index,
        "M": len(results),
        "acceptedStateDigests": [
            "0x" + (diloco.NO_RESULT if r is None else pol.state_digest(r)).hex() for r in results
        ],
        "outerConfig": {
            "aggregation": config.aggregation,
            "trim": config.trim,
            "lr": config.lr,
            "momentum": config.momentum,
        },
        "outerConfigDigest": "0x" + config.digest().hex(),
        "outputStateDigest": "0x" + output.output_digest.hex(),
        "inputsCommitment": "0x" + output.inputs_commitment.hex(),
        "resultDigest": "0x" + output.result_digest.hex(),
    }


def build_vector() -> dict[str, Any]:
    """Every case computed by the code now (real outer steps on portable states, and formula edges)."""
    from veritrain import diloco

    cases = [
        _case("mean of 3 shards, round 0", "digits-mlp", 0, [True, True, True], diloco.OuterConfig()),
        _case(
            "trimmed mean (trim 1), shard 2 of 5 missing, round 1",
            "charlm-tiny",
            1,
            [True, True, False, True, True],
            diloco.OuterConfig("trimmed_mean", trim=1),
        ),
        _case("median of 5, round 1", "digits-mlp", 1, [True] * 5, diloco.OuterConfig("median")),
        _case(
            "median of 4 (even), lr 1.0, momentum 0",
            "digits-mlp",
            1,
            [True] * 4,
            diloco.OuterConfig("median", lr=1.0, momentum=0.0),
        ),
    ]
    start, output = (hashlib.sha256(label).digest() for label in (b"start", b"output"))
    accepted = [None, hashlib.sha256(b"shard 1").digest()]
    config = diloco.OuterConfig(lr=0.5, momentum=0.25)
    commitment = diloco.inputs_commitment(start, 2**32 - 1, accepted, config.digest())
    cases.append(
        {
            "name": "formula edge: largest round, shard 0 missing (digests are arbitrary labels)",
            "startStateDigest": "0x" + start.hex(),
            "round": 2**32 - 1,
            "M": 2,
            "acceptedStateDigests": ["0x" + (d or diloco.NO_RESULT).hex() for d in accepted],
            "outerConfig": {"aggregation": "mean", "trim": 0, "lr": 0.5, "momentum": 0.25},
            "outerConfigDigest": "0x" + config.digest().hex(),
            "outputStateDigest": "0x" + output.hex(),
            "inputsCommitment": "0x" + commitment.hex(),
            "resultDigest": "0x" + diloco.aggregate_result_digest(output, commitment).hex(),
        }
    )
    return {
        "about": "DiLoCo aggregate unit digests (PROTOCOL-V2 R9); the contract and veritrain/diloco.py "
        "must both reproduce every case",
        "regenerate": ".venv/bin/python -m tests.training.aggregate_vector --write",
        "formulas": FORMULAS,
        "cases": cases,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--write", action="store_true", help=f"rewrite {VECTOR_PATH.name}")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    text = json.dumps(build_vector(), indent=1) + "\n"
    if args.write:
        VECTOR_PATH.parent.mkdir(parents=True, exist_ok=True)
        VECTOR_PATH.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
