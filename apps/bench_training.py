"""`veritrain bench training --json FILE`: DiLoCo rounds against data-parallel training, robust aggregation,
the outer step at real size, and a provider's peak memory (issue 7 item 9). Figures (JSON keys):

- ``loss_gap_vs_ddp``: (L_DiLoCo − L_DDP) / L_DDP, evaluation loss after the same samples. DiLoCo: M = 4
  shards, H inner AdamW steps per round, R rounds, the outer step of ``veritrain.diloco`` (mean; outer lr
  and momentum from ``BenchSize``). DDP: R·H synchronous steps whose batch is the M shards' batches of that
  step together (the gradient of the averaged loss = the average of the M workers' gradients): exactly the
  same samples, the same AdamW; its lr is tuned (``ddp_lr_scales`` × the recipe's lr, the best loss counts)
  since a 4× batch may want a larger step, while DiLoCo's inner lr stays the recipe's.
  As in Douillard et al. (2023), who start DiLoCo from a pretrained model, both start from one state
  trained ``warmup_steps`` steps (fresh AdamW moments for both); ``--warmup-steps 0`` starts from scratch.
- ``bytes_ratio_vs_ddp``: bytes a ring all-reduce of fp32 gradients moves in H steps (each step, each of M
  workers sends 2(M−1)/M of the gradient) over the bytes one DiLoCo round moves through the real libp2p
  data plane (``veritrain.p2p``, a blob server in another process): the aggregator fetches the M accepted
  results (whole states: weights + AdamW moments), then M providers fetch the new round state (weights +
  outer momentum). ``bytes_ratio_vs_ddp_kagg2`` counts the default two aggregator replicas.
- ``robust_loss_gap``: M = 8, shard 0's result replaced each round by a poisoned one (its pseudo-gradient
  scaled by ``POISON_SCALE`` and sign-flipped): (L_trimmed mean, trim 1 − L_clean) / L_clean, with the
  clean run on the plain mean; ``robust_loss_gap_mean`` shows the plain mean under the same poison.
- ``outer_step_seconds``, ``aggregate_bytes_per_s``: the real-size recipe, M = 4: the outer step alone,
  and a whole aggregate unit from canonical blobs (decode, digest every input, outer step, digest and
  encode the output) per input byte.
- ``peak_rss_mb``: peak resident memory of a fresh provider process that runs ``node.unit.run_unit`` on
  the real-size recipe (checkpoints every step), against ``peak_rss_target_mb`` = 4 × state + 600 MB.
- ``speedup_m2``: needs the market (an order through it with M = 1 vs M = 2): null unless ``--speedup``
  passes :func:`apps.bench_speedup.speedup_m2` in ``extra_figures`` (breakdown: `veritrain bench speedup`).

The loss runs use charlm-tiny's model on the python-stdlib-tree corpus (11.6 MiB: shards of a large corpus,
not of charlm-tiny's 320 KiB), evaluated on fixed windows of the whole corpus drawn with a separate seed.
Progress goes through ``Progress`` only (one place to restyle it).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from veritrain import diloco, pol

if TYPE_CHECKING:
    from veritrain.datasets import Dataset
    from veritrain.recipes import Recipe

LOSS_RECIPE = "charlm-tiny"
REAL_RECIPE = "charlm-25m"
POISON_SCALE = 10.0
EVAL_SEED = 2**40 + 17
WARMUP_SEED = 2**40 + 23
SEED = 11
AGGREGATOR_REPLICAS = 2
MIB = 2**20


@dataclass(frozen=True)
class BenchSize:
    """How much the bench trains: DiLoCo M = 4 shards × H steps × R rounds; robust M = 8."""

    shards: int = 4
    inner_steps: int = 400
    rounds: int = 4
    robust_shards: int = 8
    robust_inner_steps: int = 40
    robust_rounds: int = 6
    warmup_steps: int = 2000
    outer_lr: float = 0.7  # DiLoCo's published outer step; 0.7 without momentum measured in BENCHMARKS.md
    outer_momentum: float = 0.9
    ddp_lr_scales: tuple[float, ...] = (1.0, 2.0)
    eval_batches: int = 16
    real_recipe: str = REAL_RECIPE
    real_shards: int = 4
    provider_steps: int = 2


QUICK = BenchSize(
    inner_steps=4,
    rounds=2,
    robust_inner_steps=2,
    robust_rounds=2,
    warmup_steps=2,
    eval_batches=2,
    real_recipe=LOSS_RECIPE,
    provider_steps=1,
)


class Progress:
    """The bench's only output while it runs: one line per event on stderr, with the elapsed time."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def __call__(self, message: str) -> None:
        print(f"[{time.monotonic() - self.started:7.1f} s] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- training runs


def loss_recipe() -> Recipe:
    """charlm-tiny's model and optimizer on the large corpus (UnitSpecs still name charlm-tiny)."""
    from veritrain.datasets import STDLIB_TREE_DATASET
    from veritrain.recipes import get_recipe

    return replace(get_recipe(LOSS_RECIPE), dataset=STDLIB_TREE_DATASET)


def evaluate(recipe: Recipe, dataset: Dataset, weights: Mapping[str, Any], batches: int) -> float:
    """Mean loss of the model weights in `weights` on fixed windows of the whole corpus."""
    import torch

    model = recipe.build_model(seed=None)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.copy_(weights[pol.MODEL_PREFIX + name])
        losses = [
            float(model.loss(*pol.batch_for_step(recipe, dataset, EVAL_SEED, 0, 0, step)))  # type: ignore[operator]
            for step in range(batches)
        ]
    return sum(losses) / len(losses)


Poison = Callable[[pol.State, pol.State], pol.State]


def poison_scaled_sign_flip(round_state: pol.State, result: pol.State) -> pol.State:
    """A result whose pseudo-gradient Δ = θ_r − θ_result is replaced by −POISON_SCALE·Δ."""
    poisoned = dict(result)
    for name, tensor in result.items():
        if name.startswith(pol.MODEL_PREFIX):
            weights = round_state[name]
            poisoned[name] = weights + (weights - tensor) * POISON_SCALE
    return poisoned


@dataclass
class DilocoRun:
    round_state: pol.State
    results: list[pol.State]


def warm_start(recipe: Recipe, dataset: Dataset, steps: int) -> pol.State:
    """The common start of every run: genesis trained `steps` steps on the whole corpus (its own data
    order), as a round state, so DiLoCo shards and the DDP baseline both begin with fresh AdamW moments."""
    state = pol.initial_state(recipe, SEED)
    if steps:
        spec = pol.UnitSpec(LOSS_RECIPE, WARMUP_SEED, 0, 0, steps, steps)
        state, _ = pol.train_steps(recipe, dataset, state, spec, 0, steps)
    return diloco.genesis_round_state(state)


def run_diloco(
    recipe: Recipe,
    dataset: Dataset,
    start: pol.State,
    shards: int,
    inner_steps: int,
    rounds: int,
    config: diloco.OuterConfig,
    progress: Progress,
    poison: Poison | None = None,
) -> DilocoRun:
    """R DiLoCo rounds from round state `start`; shard 0's result is passed through `poison` when given."""
    state = start
    inner: list[pol.State | None] = [None] * shards
    results: list[pol.State] = []
    for round_index in range(rounds):
        results = []
        for shard in range(shards):
            spec = pol.UnitSpec(LOSS_RECIPE, SEED, round_index, shard, inner_steps, inner_steps, shards)
            unit_start = diloco.unit_start_state(state, inner[shard])
            final, _ = pol.train_steps(recipe, dataset, unit_start, spec, 0, inner_steps)
            inner[shard] = final
            results.append(final)
        if poison is not None:
            results[0] = poison(state, results[0])
        state = diloco.outer_step(state, results, config)
        progress(f"  round {round_index + 1}/{rounds} ({config.aggregation}, M = {shards}) done")
    return DilocoRun(state, results)


def run_ddp(
    recipe: Recipe,
    dataset: Dataset,
    start: pol.State,
    shards: int,
    inner_steps: int,
    rounds: int,
    progress: Progress,
) -> pol.State:
    """Synchronous data-parallel baseline: step s of round r trains on all M shards' batches of (r, s)."""
    import torch

    def batches() -> Iterator[pol.Batch]:
        for round_index in range(rounds):
            for step in range(inner_steps):
                parts = [
                    pol.batch_for_step(recipe, dataset, SEED, round_index, shard, step, shards)
                    for shard in range(shards)
                ]
                yield torch.cat([inputs for inputs, _ in parts]), torch.cat([targets for _, targets in parts])
            progress(f"  DDP: {round_index + 1}/{rounds} rounds' worth of steps done")

    final, _ = pol.train_on_batches(recipe, diloco.unit_start_state(start, None), batches())
    return final


# ---------------------------------------------------------------- bytes through the data plane


def data_plane_round_bytes(results: list[pol.State], round_state: pol.State) -> int:
    """Payload bytes of one DiLoCo round fetched over libp2p from a blob server in another process: the
    M results (by the aggregator), then the new round state once per shard (by the M providers)."""
    from eth_account import Account

    from veritrain.blobstore import BlobStore
    from veritrain.p2p.node import P2PNode
    from veritrain.p2p.process import start_server_process, stop_server_process

    with tempfile.TemporaryDirectory(prefix="veritrain-bench-training-") as tmp:
        store = BlobStore(Path(tmp) / "store")
        result_digests = [store.put(pol.canonical_state_bytes(result)) for result in results]
        round_digest = store.put(pol.canonical_state_bytes(round_state))
        process, address = start_server_process(Path(tmp) / "store")
        try:
            with P2PNode(Account.create()) as client:
                moved = sum(len(client.fetch(address, digest)) for digest in result_digests)
                moved += sum(len(client.fetch(address, round_digest)) for _ in results)
        finally:
            stop_server_process(process)
    return moved


def ring_allreduce_bytes(parameters: int, shards: int, steps: int) -> int:
    """Bytes all M workers send in `steps` ring all-reduces of fp32 gradients: 2(M−1)/M·4P each, per step."""
    return steps * shards * 2 * (shards - 1) * 4 * parameters // shards


# ---------------------------------------------------------------- real-size aggregate and provider memory


def synthetic_result(genesis: pol.State, shard: int, scale: float = 1e-3, step: int = 100) -> pol.State:
    """A stand-in for shard m's trained state, the same bytes on every machine: genesis weights plus
    portable noise of std `scale`, moments = |noise|, step `step` (timings and test vectors)."""
    import torch

    from veritrain.recipes import portable_normal

    result: pol.State = {}
    for name, tensor in genesis.items():
        if name == pol.STEP_KEY:
            result[name] = torch.tensor(step, dtype=torch.int64)
            continue
        noise = portable_normal("bench", shard, name, tensor.numel(), scale).reshape(tensor.shape)
        result[name] = tensor + noise if name.startswith(pol.MODEL_PREFIX) else noise.abs()
    return result


def real_size_aggregate(recipe_name: str, shards: int, progress: Progress) -> dict[str, float]:
    """Outer step time and aggregate-unit throughput of the real-size recipe."""
    from veritrain.recipes import get_recipe

    genesis = pol.initial_state(get_recipe(recipe_name), 0)
    round_state = diloco.genesis_round_state(genesis)
    results = [synthetic_result(genesis, shard) for shard in range(shards)]
    config = diloco.OuterConfig()
    started = time.perf_counter()
    diloco.outer_step(round_state, results, config)
    outer_seconds = time.perf_counter() - started
    progress(f"  outer step of {recipe_name}, M = {shards}: {outer_seconds:.2f} s")
    blobs = [pol.canonical_state_bytes(result) for result in results]
    round_blob = pol.canonical_state_bytes(round_state)
    del results
    started = time.perf_counter()
    inputs = diloco.AggregateInputs(
        0,
        pol.state_from_canonical_bytes(round_blob),
        tuple(pol.state_from_canonical_bytes(blob) for blob in blobs),
        config,
    )
    output = diloco.aggregate(inputs)
    pol.canonical_state_bytes(output.output_state)
    aggregate_seconds = time.perf_counter() - started
    input_bytes = sum(len(blob) for blob in blobs) + len(round_blob)
    progress(f"  aggregate unit from blobs: {input_bytes / MIB:.0f} MiB in {aggregate_seconds:.2f} s")
    return {
        "outer_step_seconds": outer_seconds,
        "aggregate_seconds": aggregate_seconds,
        "aggregate_input_bytes": float(input_bytes),
        "aggregate_bytes_per_s": input_bytes / aggregate_seconds,
    }


def provider_peak_rss_mb(recipe_name: str, steps: int) -> float:
    """Peak RSS of a fresh process that trains `steps` steps of the recipe with node.unit.run_unit."""
    with tempfile.TemporaryDirectory(prefix="veritrain-bench-provider-") as tmp:
        command = [sys.executable, "-m", "apps.bench_training", recipe_name, str(steps), tmp]
        output = subprocess.run(command, capture_output=True, text=True, check=True, timeout=3600).stdout
    return float(json.loads(output.strip().splitlines()[-1])["peak_rss_mb"])


def _provider_main(recipe_name: str, steps: int, workdir: str) -> int:
    """The provider process of ``provider_peak_rss_mb``: genesis, then run_unit; prints its peak RSS."""
    from node.unit import run_unit
    from veritrain.recipes import get_recipe

    spec = pol.UnitSpec(recipe_name, SEED, 0, 0, steps, 1)
    run_unit(spec, pol.initial_state(get_recipe(recipe_name), 0), Path(workdir))
    print(json.dumps({"peak_rss_mb": peak_rss_kib() / 1024}))
    return 0


def peak_rss_kib() -> int:
    """This process's peak resident set (VmHWM). Not getrusage's ru_maxrss: Linux keeps that across
    fork + exec, so a child started by a big parent would report the parent's size."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # no /proc (not Linux): KiB or bytes


# ---------------------------------------------------------------- the bench


def measure(
    size: BenchSize,
    progress: Progress,
    extra_figures: Mapping[str, Callable[[], float]] | None = None,
    loss_only: bool = False,
) -> dict[str, Any]:
    """Every figure of the bench (``loss_only``: the DiLoCo-vs-DDP loss and bytes figures alone, for
    tuning them). `extra_figures` (name → measurement) lets a caller that can reach the market add figures
    the kernel cannot measure, e.g. ``speedup_m2``."""
    from veritrain.datasets import load_dataset
    from veritrain.recipes import get_recipe

    recipe = loss_recipe()
    dataset = load_dataset(recipe.dataset)
    figures: dict[str, Any] = {"sizes": asdict(size)}
    figures["loss_model"] = {
        "recipe": LOSS_RECIPE,
        "dataset": recipe.dataset,
        "parameters": recipe.param_count(),
    }

    progress(f"common start: {size.warmup_steps} steps from genesis")
    start = warm_start(recipe, dataset, size.warmup_steps)
    progress(f"DiLoCo M = {size.shards}, H = {size.inner_steps}, {size.rounds} rounds vs DDP")
    loss_run = (size.shards, size.inner_steps, size.rounds)
    outer = diloco.OuterConfig(lr=size.outer_lr, momentum=size.outer_momentum)
    run = run_diloco(recipe, dataset, start, *loss_run, outer, progress)
    figures["loss_diloco"] = evaluate(recipe, dataset, run.round_state, size.eval_batches)
    ddp_losses = {}
    for scale in size.ddp_lr_scales:
        tuned = replace(recipe, optimizer=replace(recipe.optimizer, lr=recipe.optimizer.lr * scale))
        progress(f"DDP with {scale:g} × the recipe's lr")
        ddp = run_ddp(tuned, dataset, start, *loss_run, progress)
        ddp_losses[str(scale)] = evaluate(recipe, dataset, ddp, size.eval_batches)
    figures["loss_ddp_by_lr_scale"] = ddp_losses
    figures["loss_ddp"] = min(ddp_losses.values())
    figures["loss_start"] = evaluate(recipe, dataset, start, size.eval_batches)
    figures["loss_gap_vs_ddp"] = (figures["loss_diloco"] - figures["loss_ddp"]) / figures["loss_ddp"]

    progress("bytes of one DiLoCo round through the libp2p data plane")
    round_bytes = data_plane_round_bytes(run.results, run.round_state)
    parameters = recipe.param_count()
    allreduce = ring_allreduce_bytes(parameters, size.shards, size.inner_steps)
    aggregator_fetch = sum(len(pol.canonical_state_bytes(result)) for result in run.results)
    figures.update(
        diloco_round_bytes=round_bytes,
        ddp_allreduce_bytes_per_round=allreduce,
        bytes_ratio_vs_ddp=allreduce / round_bytes,
        bytes_ratio_vs_ddp_kagg2=allreduce / (round_bytes + (AGGREGATOR_REPLICAS - 1) * aggregator_fetch),
    )

    if loss_only:
        return figures
    progress(
        f"robust aggregation: M = {size.robust_shards}, shard 0 poisoned (x{POISON_SCALE:g}, sign-flipped)"
    )
    robust = (size.robust_shards, size.robust_inner_steps, size.robust_rounds)
    trimmed = diloco.OuterConfig("trimmed_mean", trim=1)
    runs = {
        "clean": run_diloco(recipe, dataset, start, *robust, diloco.OuterConfig(), progress),
        "trimmed": run_diloco(recipe, dataset, start, *robust, trimmed, progress, poison_scaled_sign_flip),
        "mean": run_diloco(
            recipe, dataset, start, *robust, diloco.OuterConfig(), progress, poison_scaled_sign_flip
        ),
    }
    losses = {name: evaluate(recipe, dataset, r.round_state, size.eval_batches) for name, r in runs.items()}
    figures["robust_losses"] = losses
    figures["robust_loss_gap"] = (losses["trimmed"] - losses["clean"]) / losses["clean"]
    figures["robust_loss_gap_mean"] = (losses["mean"] - losses["clean"]) / losses["clean"]

    progress(f"real-size recipe {size.real_recipe}: outer step and aggregate unit")
    figures.update(real_size_aggregate(size.real_recipe, size.real_shards, progress))
    progress(f"peak RSS of a provider process training {size.real_recipe} for {size.provider_steps} step(s)")
    real = get_recipe(size.real_recipe)
    figures["peak_rss_mb"] = provider_peak_rss_mb(size.real_recipe, size.provider_steps)
    figures["peak_rss_target_mb"] = 4 * real.memory_estimate().state / MIB + 600
    figures["real_recipe"] = {
        "name": real.name,
        "parameters": real.param_count(),
        "flops_per_step": real.flops_per_step(),
        "memory_estimate_bytes": {**asdict(real.memory_estimate()), "state": real.memory_estimate().state},
    }
    figures["speedup_m2"] = None
    for name, figure in (extra_figures or {}).items():
        progress(f"{name} (supplied by the caller)")
        figures[name] = figure()
    return figures


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, required=True, help="write the figures here")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the code paths (CI)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    default = BenchSize()
    parser.add_argument("--inner-steps", type=int, default=default.inner_steps, help="H of the M = 4 run")
    parser.add_argument("--rounds", type=int, default=default.rounds, help="rounds of the M = 4 run")
    parser.add_argument("--warmup-steps", type=int, default=default.warmup_steps, help="common start")
    parser.add_argument("--outer-lr", type=float, default=default.outer_lr, help="DiLoCo outer lr")
    parser.add_argument("--outer-momentum", type=float, default=default.outer_momentum, help="outer μ")
    parser.add_argument("--loss-only", action="store_true", help="only the loss and bytes figures vs DDP")
    parser.add_argument(
        "--speedup",
        action="store_true",
        help="also speedup_m2: two orders through the market (bench_speedup)",
    )


def run(args: argparse.Namespace) -> int:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    progress = Progress()
    sizes = {
        "inner_steps": args.inner_steps,
        "rounds": args.rounds,
        "warmup_steps": args.warmup_steps,
        "outer_lr": args.outer_lr,
        "outer_momentum": args.outer_momentum,
    }
    from apps.bench_speedup import speedup_m2

    extra = {"speedup_m2": speedup_m2} if args.speedup else None
    figures = measure(QUICK if args.quick else BenchSize(**sizes), progress, extra, loss_only=args.loss_only)
    figures["machine"] = (
        f"{platform.machine()} {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} "
        f"torch thread(s), torch {torch.__version__}, python {platform.python_version()}"
    )
    figures["wall_seconds"] = round(time.monotonic() - progress.started, 1)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    keys = ("loss_gap_vs_ddp", "bytes_ratio_vs_ddp", "robust_loss_gap", "peak_rss_mb", "speedup_m2")
    headline = {key: figures[key] for key in keys if key in figures}
    print(json.dumps(headline, sort_keys=True))
    return 0 if all(value is None or math.isfinite(value) for value in headline.values()) else 1


if __name__ == "__main__":  # the provider process of provider_peak_rss_mb
    sys.exit(_provider_main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
