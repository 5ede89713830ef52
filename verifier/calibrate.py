"""`veritrain bench calibrate`: honest-vs-honest distances across simulated hardware, and the tolerances.

Why: honest replicas on different hardware do not agree bit for bit (TOOLCHAIN.md: the CPU vector path
and MKL's reproducibility mode drift by ~1e-5 after 50 steps), and the verifier must never slash for that.
So we measure the drift where we can create it on one machine — 1 vs 2 threads, ``ATEN_CPU_CAPABILITY=
default`` vs the native vector path, ``MKL_CBWR=COMPATIBLE`` — from a fresh init and from a trained state,
for every segment length up to ``--max-steps``, and set tolerance(L) = margin × (largest honest distance
observed at any length ≤ L). The report also gives the smallest *lazy* distance (one step skipped), which
the tolerance must stay below, so both sides of the trade-off are visible.

The tolerances are committed as data (veritrain/data/tolerances.json) with the command that regenerates them.
They are keyed by recipe and pair of hardware classes (``veritrain.device``): the table calibrated across
the CPU configurations above is the **CPU fallback** for any pair of CPU classes; ``--device cuda`` adds a
worker on that GPU and a table for the pair (that GPU's class, any CPU class). A pair with an uncalibrated
GPU class has no tolerance: ``load_tolerances`` refuses (ToleranceUnavailable) rather than guess, so such
a unit must be judged by a verifier of the replica's own class, where honest results are bitwise equal.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import platform
import time
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from verifier.core import METRICS, Distance, SegmentTolerance, ToleranceTable, state_distance
from veritrain.errors import ToleranceUnavailable

if TYPE_CHECKING:
    from verifier.bench_workers import WorkerPool
    from veritrain.pol import State

DEFAULT_MARGIN = 30.0
# Below these an honest distance of exactly zero would make the tolerance zero; they are ~float32 rounding.
FLOORS = Distance(rel_l2=1e-7, linf=1e-7, angle=1e-6)
LOSS_FLOOR = 1e-6
TOLERANCE_FILE = "tolerances.json"
REGENERATE = "veritrain bench calibrate --json docs/calibration.json"
GROUPS = ("model", "exp_avg", "exp_avg_sq")
ANY_CPU = "cpu/*"


def class_pair_key(first: str, second: str) -> str:
    """The key of a pair of hardware classes in the tolerance file (order-free)."""
    return "|".join(sorted((first, second)))


def load_tolerances(
    recipe: str, path: Path | None = None, classes: tuple[str, str] | None = None
) -> ToleranceTable:
    """The committed tolerance table of `recipe` for the pair of hardware `classes` (replica, verifier),
    from veritrain/data/tolerances.json unless `path`. Two CPU classes (or no classes given) get the CPU
    fallback table; a pair with a GPU class gets its calibrated table or ToleranceUnavailable."""
    try:
        if path is None:
            text = resources.files("veritrain").joinpath("data", TOLERANCE_FILE).read_text()
        else:
            text = path.read_text()
        data = json.loads(text)
    except (OSError, ValueError) as error:
        raise ToleranceUnavailable(f"cannot read tolerances ({REGENERATE} writes them): {error}") from error
    if classes is not None and not all(key.startswith("cpu/") for key in classes):
        pairs = data.get("pairs", {}).get(recipe, {})
        gpus = [key for key in classes if not key.startswith("cpu/")]
        candidates = [class_pair_key(*classes)]
        if len(gpus) == 1 or gpus[0] == gpus[1]:  # GPU vs CPU, or one GPU class twice
            candidates.append(class_pair_key(gpus[0], ANY_CPU))
        for key in candidates:
            if key in pairs:
                return ToleranceTable.from_json(pairs[key])
        raise ToleranceUnavailable(
            f"no calibrated tolerance for {recipe!r} between {classes[0]!r} and {classes[1]!r}; run "
            f"`{REGENERATE} --device <gpu>` there, or have a verifier of the replica's class judge it"
        )
    table = data.get("recipes", {}).get(recipe)
    if table is None:
        raise ToleranceUnavailable(f"no calibrated tolerance for recipe {recipe!r}; run `{REGENERATE}`")
    return ToleranceTable.from_json(table)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, required=True, help="write the calibration report here")
    parser.add_argument("--recipes", nargs="+", default=["charlm-tiny", "digits-mlp"])
    parser.add_argument(
        "--seeds", type=int, default=4, help="model seeds (each from init and from a trained state)"
    )
    parser.add_argument("--max-steps", type=int, default=32, help="longest segment length calibrated")
    parser.add_argument(
        "--warm-steps", type=int, default=32, help="training before the 'trained state' start"
    )
    parser.add_argument(
        "--margin", type=float, default=DEFAULT_MARGIN, help="tolerance = margin × max honest"
    )
    parser.add_argument(
        "--tolerances-out",
        type=Path,
        default=Path(__file__).resolve().parent.parent / "veritrain" / "data" / TOLERANCE_FILE,
        help="where to write the tolerance table (default: the committed package data file)",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="also calibrate this GPU (cuda, cuda:<i>, mps) against every CPU configuration",
    )


def run(args: argparse.Namespace) -> int:
    import torch

    from verifier.bench_workers import CONFIGS, HardwareConfig, WorkerPool
    from veritrain.device import Execution

    torch.set_num_threads(1)
    started = time.monotonic()
    device = Execution(args.device).device
    gpu = None if device == "cpu" else HardwareConfig(device, 1, device=device)
    configs = (*CONFIGS, *([gpu] if gpu else []))
    report: dict[str, Any] = {"command": REGENERATE, "margin": args.margin, "recipes": {}}
    tables: dict[str, ToleranceTable] = {}
    pair_tables: dict[str, dict[str, ToleranceTable]] = {}
    with WorkerPool(configs) as pool:
        report["configs"] = {config.name: config.describe() for config in configs}
        report["worker_identities"] = pool.identities
        for recipe_name in args.recipes:
            measured = calibrate_recipe(
                pool, recipe_name, args.seeds, args.max_steps, args.warm_steps, gpu.name if gpu else None
            )
            table = tolerance_table(
                recipe_name, measured["max_honest"], measured["max_loss_gap"], args.margin
            )
            tables[recipe_name] = table
            report["recipes"][recipe_name] = summarize(measured, table)
            if gpu is not None:
                gpu_class = str(pool.identities[gpu.name]["hardware_class"])
                gpu_table = tolerance_table(
                    recipe_name, measured["gpu_max_honest"], measured["gpu_max_loss_gap"], args.margin
                )
                pair_tables[recipe_name] = {class_pair_key(gpu_class, ANY_CPU): gpu_table}
                report["recipes"][recipe_name]["gpu_vs_cpu"] = summarize(
                    {
                        **measured,
                        "max_honest": measured["gpu_max_honest"],
                        "max_loss_gap": measured["gpu_max_loss_gap"],
                    },
                    gpu_table,
                )
            print(f"{recipe_name}: {report['recipes'][recipe_name]['headline']}")
    report["wall_seconds"] = round(time.monotonic() - started, 1)
    report["machine"] = machine_description()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    write_tolerances(args.tolerances_out, tables, args.margin, report["machine"], pair_tables)
    print(f"wrote {args.json} and {args.tolerances_out} in {report['wall_seconds']} s")
    return 0


def machine_description() -> str:
    import torch

    return (
        f"{platform.machine()} cpu_capability={torch.backends.cpu.get_cpu_capability()}, "
        f"torch {torch.__version__}, python {platform.python_version()}"
    )


def calibrate_recipe(
    pool: WorkerPool,
    recipe_name: str,
    seeds: int,
    max_steps: int,
    warm_steps: int,
    gpu_worker: str | None = None,
) -> dict[str, Any]:
    """Max honest distance per length, per group and metric, over seeds × starts × config pairs; pairs
    with `gpu_worker` are kept apart (``gpu_max_honest``, ``gpu_max_loss_gap``)."""
    from veritrain import pol
    from veritrain.datasets import load_dataset
    from veritrain.recipes import get_recipe

    recipe = get_recipe(recipe_name)
    dataset = load_dataset(recipe.dataset)
    buckets: dict[str, tuple[dict[int, dict[str, Distance]], dict[int, float]]] = {
        "cpu": ({}, {}),
        "gpu": ({}, {}),
    }
    one_skip: dict[int, dict[str, Distance]] = {}
    comparisons = 0
    identical_same_config = True
    for seed in range(seeds):
        init = pol.initial_state(recipe, seed)
        warm_spec = pol.UnitSpec(recipe_name, 10_000 + seed, 0, 0, warm_steps, warm_steps)
        warm, _ = pol.train_steps(recipe, dataset, init, warm_spec, 0, warm_steps)
        for round_index, start in enumerate((init, warm)):
            spec = pol.UnitSpec(recipe_name, seed, round_index, 0, max_steps, 1)
            futures = {
                name: worker.submit("execute_unit", spec=spec, start_state=start)
                for name, worker in pool.workers.items()
            }
            runs: dict[str, pol.UnitExecution] = {name: future.result() for name, future in futures.items()}
            if seed == 0:
                local = pol.execute_unit(dataset, spec, start)
                identical_same_config &= local.transcript == runs["native-1t"].transcript
            for a, b in itertools.combinations(sorted(runs), 2):
                comparisons += 1
                max_honest, max_loss_gap = buckets["gpu" if gpu_worker in (a, b) else "cpu"]
                for length in range(1, max_steps + 1):
                    distance = state_distance(runs[a].checkpoints[length], runs[b].checkpoints[length], start)
                    _merge(max_honest.setdefault(length, {}), distance.groups)
                    gap = max(
                        abs(x - y)
                        for x, y in zip(
                            runs[a].transcript.losses[:length],
                            runs[b].transcript.losses[:length],
                            strict=True,
                        )
                    )
                    max_loss_gap[length] = max(max_loss_gap.get(length, 0.0), gap)
            honest = runs["native-1t"].checkpoints
            for length in range(1, max_steps + 1):
                lazy = _claiming(honest[length - 1], length)
                distance = state_distance(lazy, honest[length], honest[length - 1])
                _merge_min(one_skip.setdefault(length, {}), distance.groups)
    return {
        "max_honest": buckets["cpu"][0],
        "max_loss_gap": buckets["cpu"][1],
        "gpu_max_honest": buckets["gpu"][0],
        "gpu_max_loss_gap": buckets["gpu"][1],
        "one_skip": one_skip,
        "config_pairs_x_starts": comparisons,
        "same_config_bitwise_identical": identical_same_config,
        "seeds": seeds,
        "max_steps": max_steps,
    }


def _claiming(state: Mapping[str, Any], step: int) -> State:
    import torch

    return {**state, "optim.step": torch.tensor(step, dtype=torch.int64)}


def _merge(target: dict[str, Distance], groups: Mapping[str, Distance]) -> None:
    for group, distance in groups.items():
        target[group] = target[group].worst(distance) if group in target else distance


def _merge_min(target: dict[str, Distance], groups: Mapping[str, Distance]) -> None:
    for group, distance in groups.items():
        if group in target:
            previous = target[group]
            distance = Distance(*(min(getattr(previous, m), getattr(distance, m)) for m in METRICS))
        target[group] = distance


def tolerance_table(
    recipe: str,
    max_honest: Mapping[int, Mapping[str, Distance]],
    max_loss_gap: Mapping[int, float],
    margin: float,
) -> ToleranceTable:
    """tolerance(L) = margin × max honest distance at any length ≤ L (never below the float32 floors)."""
    by_steps: dict[int, SegmentTolerance] = {}
    envelope: dict[str, Distance] = {}
    loss_envelope = 0.0
    for length in sorted(max_honest):
        _merge(envelope, max_honest[length])
        loss_envelope = max(loss_envelope, max_loss_gap[length])
        by_steps[length] = SegmentTolerance(
            groups={group: distance.scaled(margin).worst(FLOORS) for group, distance in envelope.items()},
            loss_abs=max(loss_envelope * margin, LOSS_FLOOR),
        )
    return ToleranceTable(recipe=recipe, margin=margin, by_steps=by_steps)


def summarize(measured: Mapping[str, Any], table: ToleranceTable) -> dict[str, Any]:
    """Per length: max honest, tolerance, smallest one-skipped-step distance, and their ratios."""
    lengths: dict[str, Any] = {}
    worst: dict[str, float] = {}
    for length, honest in sorted(measured["max_honest"].items()):
        tolerance = table.by_steps[length]
        skip = measured["one_skip"][length]
        row: dict[str, Any] = {
            "loss_gap": measured["max_loss_gap"][length],
            "loss_tolerance": tolerance.loss_abs,
        }
        for group in GROUPS:
            row[group] = {
                "max_honest": honest[group].to_json(),
                "tolerance": tolerance.groups[group].to_json(),
                "min_one_skipped_step": skip[group].to_json(),
            }
        # how close the tolerance comes to the smallest cheat (one skipped step), per model-weight metric
        ratios = {
            m: getattr(tolerance.groups["model"], m) / max(getattr(skip["model"], m), 1e-300) for m in METRICS
        }
        row["model_tolerance_over_one_skip"] = ratios
        for metric, ratio in ratios.items():
            worst[metric] = max(worst.get(metric, 0.0), ratio)
        lengths[str(length)] = row
    return {
        "headline": (
            f"{measured['config_pairs_x_starts']} config-pair runs; model tolerance / one-skipped-step "
            f"distance ≤ {worst['rel_l2']:.3g} (rel_l2), {worst['linf']:.3g} (linf) at every length; same "
            "config bitwise identical: "
            f"{measured['same_config_bitwise_identical']}"
        ),
        "same_config_bitwise_identical": measured["same_config_bitwise_identical"],
        "config_pair_runs": measured["config_pairs_x_starts"],
        "seeds": measured["seeds"],
        "max_steps": measured["max_steps"],
        "worst_model_tolerance_over_one_skip": worst,
        "lengths": lengths,
    }


def write_tolerances(
    path: Path,
    tables: Mapping[str, ToleranceTable],
    margin: float,
    machine: str,
    pair_tables: Mapping[str, Mapping[str, ToleranceTable]] | None = None,
) -> None:
    """Merge into the committed file (recipes and class pairs not recalibrated now are kept)."""
    previous: dict[str, Any] = {}
    if path.exists():
        try:
            previous = json.loads(path.read_text())
        except ValueError:
            previous = {}
    existing: dict[str, Any] = previous.get("recipes", {})
    existing.update({name: table.to_json() for name, table in tables.items()})
    pairs: dict[str, dict[str, Any]] = previous.get("pairs", {})
    for recipe, by_pair in (pair_tables or {}).items():
        pairs.setdefault(recipe, {}).update({key: table.to_json() for key, table in by_pair.items()})
    payload = {
        "regenerate": REGENERATE,
        "generated": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine,
        "margin": margin,
        "rule": "tolerance(L) = margin x max honest-vs-honest distance at any length <= L, over 4 simulated "
        "hardware configs (1/2 threads, ATEN_CPU_CAPABILITY=default, MKL_CBWR=COMPATIBLE), from init and "
        "from a trained state; floors rel_l2 1e-7, linf 1e-7, angle 1e-6 rad, loss 1e-6; verdicts use "
        "the model group's rel_l2 and angle and the loss gap. 'recipes' is the CPU fallback for any pair "
        "of CPU hardware classes; 'pairs' holds tables per pair of hardware classes (a GPU class vs "
        "'cpu/*' from --device)",
        "recipes": dict(sorted(existing.items())),
        "pairs": {recipe: dict(sorted(by_pair.items())) for recipe, by_pair in sorted(pairs.items())},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")
