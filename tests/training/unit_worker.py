"""Subprocess worker for the training tests: runs one unit and prints its digests as JSON.

Run as a script (``python unit_worker.py --recipe ... [--workdir DIR]``). With ``--workdir`` it runs
node.unit.run_unit and prints ``step <n>`` after every step (flushed), so a parent can SIGKILL it mid-run;
``--pin N`` makes run_unit pin N intra-op threads whatever the process setting (``--threads``) is.
With ``--genesis`` it prints, per registry recipe, the digests of round 0's state, of the DiLoCo round
state built from it and of a DiLoCo unit's start state (the configuration under test, such as
ATEN_CPU_CAPABILITY, comes from the environment).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--recipe", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--every", type=int, required=True)
    parser.add_argument("--init-seed", type=int, default=1)
    parser.add_argument("--order-seed", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--pin", type=int, help="intra-op threads run_unit pins (with --workdir)")
    parser.add_argument("--genesis", action="store_true")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from node.unit import run_unit
    from veritrain import pol
    from veritrain.datasets import load_dataset
    from veritrain.device import Execution

    if args.genesis:
        print(json.dumps(genesis_digests(args.init_seed)), flush=True)
        return 0

    spec = pol.UnitSpec(
        recipe=args.recipe,
        order_seed=args.order_seed,
        round_index=0,
        shard=0,
        steps=args.steps,
        checkpoint_every=args.every,
    )
    start = pol.initial_state(spec.recipe_config(), args.init_seed)
    if args.workdir is None:
        execution = pol.execute_unit(load_dataset(spec.recipe_config().dataset), spec, start)
        result_digest, final = execution.result_digest, execution.transcript.final_digest
    else:

        def progress(completed: int, total: int, loss: float) -> None:
            print(f"step {completed}", flush=True)

        result = run_unit(
            spec, start, args.workdir, on_progress=progress, execution=Execution(threads=args.pin)
        )
        result_digest, final = result.result_digest, result.transcript.final_digest
    print(json.dumps({"result_digest": result_digest.hex(), "final_digest": final.hex()}), flush=True)
    return 0


def genesis_digests(seed: int) -> dict[str, list[str]]:
    from veritrain import diloco, pol
    from veritrain.recipes import RECIPES

    digests = {}
    for name, recipe in sorted(RECIPES.items()):
        genesis = pol.initial_state(recipe, seed)
        round_state = diloco.genesis_round_state(genesis)
        start = diloco.unit_start_state(round_state, None)
        digests[name] = [pol.state_digest(state).hex() for state in (genesis, round_state, start)]
    return digests


if __name__ == "__main__":
    sys.exit(main())
