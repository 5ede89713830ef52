"""DISHONEST PROVIDER BEHAVIOURS — for the attack benchmark and the agent's dishonest mode only.

Each strategy is what a cheating provider would return instead of honest work: a final state, checkpoints
and a PoL transcript that is *internally consistent* (its Merkle root, checkpoint digests, step counters
and data-order commitment all look right), because a transcript that is not would be rejected as a fault
without any work. What betrays them is re-execution. ``verifier/attacks.py`` measures how often each one is
caught; ``node/agent.py`` may run one of them in dishonest mode to exercise the market end to end.

Never use these in an honest provider.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from veritrain import pol
from veritrain.errors import InvalidInput

if TYPE_CHECKING:
    import torch

    from veritrain.datasets import Dataset

NOISE_DEFAULT = 1e-3  # relative L2 of the noise added by the "noise" strategy in the main table
FORGERY_DOMAIN = b"veritrain/dishonest/v1"


@dataclass(frozen=True)
class CheatContext:
    """What a cheater knows: the unit, its start state and data, and a seed for its own choices."""

    spec: pol.UnitSpec
    start_state: Mapping[str, torch.Tensor]
    dataset: Dataset
    seed: int


def _generator(seed: int, label: str) -> torch.Generator:
    import torch

    material = FORGERY_DOMAIN + label.encode() + seed.to_bytes(16, "big", signed=True)
    return torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(material).digest()[:8], "big") >> 1)


def _with_step(state: Mapping[str, torch.Tensor], step: int) -> pol.State:
    """Claim `step` optimizer steps, whatever was really done (a lazy provider forges its counter)."""
    import torch

    return {**state, pol.STEP_KEY: torch.tensor(step, dtype=torch.int64)}


def forge_execution(
    context: CheatContext, checkpoints: Mapping[int, Mapping[str, torch.Tensor]], losses: list[float]
) -> pol.UnitExecution:
    """Wrap forged checkpoints in a self-consistent transcript claiming the honest data order."""
    spec = context.spec
    steps = spec.checkpoint_steps()
    first_step = pol.state_step(context.start_state)  # later rounds continue the optimizer's counter
    claimed = {step: _with_step(checkpoints[step], first_step + step) for step in steps}
    claimed[0] = dict(context.start_state)
    recipe = spec.recipe_config()
    transcript = pol.Transcript(
        spec=spec,
        checkpoint_steps=steps,
        checkpoint_digests=tuple(pol.state_digest(claimed[step]) for step in steps),
        losses=tuple(losses),
        data_order_commitment=pol.data_order_commitment(recipe, context.dataset, spec),
    )
    return pol.UnitExecution(final_state=claimed[steps[-1]], transcript=transcript, checkpoints=claimed)


def _run(
    context: CheatContext, skipped: set[int], *, spec: pol.UnitSpec | None = None, bf16: bool = False
) -> pol.UnitExecution:
    """Train the unit except the `skipped` steps (optionally on another spec's data or in bfloat16)."""
    import contextlib

    import torch

    data_spec = spec or context.spec
    recipe = context.spec.recipe_config()
    state: pol.State = dict(context.start_state)
    checkpoints: dict[int, pol.State] = {0: state}
    losses: list[float] = []
    marks = set(context.spec.checkpoint_steps())
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    with autocast:
        for step in range(context.spec.steps):
            if step in skipped:
                losses.append(losses[-1] if losses else math.log(2.0))
            else:
                state, step_losses = pol.train_steps(
                    recipe, context.dataset, state, data_spec, step, step + 1
                )
                losses.extend(step_losses)
            if step + 1 in marks:
                checkpoints[step + 1] = state
    return forge_execution(context, checkpoints, losses)


def skip_fraction(fraction: float) -> Callable[[CheatContext], pol.UnitExecution]:
    """Skip `fraction` of the steps (at least one), chosen at random, and claim all of them."""

    def strategy(context: CheatContext) -> pol.UnitExecution:
        import torch

        count = max(1, round(fraction * context.spec.steps))
        order = torch.randperm(context.spec.steps, generator=_generator(context.seed, f"skip{fraction}"))
        return _run(context, {int(step) for step in order[:count]})

    return strategy


def return_start_state(context: CheatContext) -> pol.UnitExecution:
    """Do nothing: every checkpoint is the start state."""
    steps = context.spec.checkpoint_steps()
    return forge_execution(
        context, dict.fromkeys(steps, context.start_state), [math.log(2.0)] * context.spec.steps
    )


def _interpolated(
    context: CheatContext, final: Mapping[str, torch.Tensor], losses: list[float]
) -> pol.UnitExecution:
    steps = context.spec.checkpoint_steps()
    start = context.start_state
    checkpoints: dict[int, pol.State] = {}
    for step in steps:
        weight = step / steps[-1]
        checkpoints[step] = {
            name: (start[name] + weight * (final[name] - start[name]))
            if start[name].is_floating_point()
            else start[name]
            for name in start
        }
    return forge_execution(context, checkpoints, losses)


def random_weights(context: CheatContext) -> pol.UnitExecution:
    """A freshly initialised model from another seed, with checkpoints interpolated towards it."""
    recipe = context.spec.recipe_config()
    final = pol.initial_state(recipe, seed=context.seed + 1_000_003)
    return _interpolated(context, final, [math.log(2.0)] * context.spec.steps)


def interpolated_forgery(context: CheatContext) -> pol.UnitExecution:
    """Train only the first 10 % of the steps (a cheap final), then interpolate checkpoints start → final."""
    cheap_steps = max(1, context.spec.steps // 10)
    cheap = _run(context, set(range(cheap_steps, context.spec.steps)))
    first = cheap.transcript.losses[0]
    last = cheap.transcript.losses[cheap_steps - 1]
    losses = [
        first + (last - first) * index / max(1, context.spec.steps - 1) for index in range(context.spec.steps)
    ]
    return _interpolated(context, cheap.final_state, losses)


def other_data(context: CheatContext) -> pol.UnitExecution:
    """Real training, but on another data order (e.g. a cheaper, easier or poisoned shard)."""
    spec = context.spec
    wrong = pol.UnitSpec(
        recipe=spec.recipe,
        order_seed=(spec.order_seed + 1) % 2**64,
        round_index=spec.round_index,
        shard=spec.shard,
        steps=spec.steps,
        checkpoint_every=spec.checkpoint_every,
        num_shards=spec.num_shards,
        hyper_overrides=spec.hyper_overrides,
    )
    return _run(context, set(), spec=wrong)


def bf16_compute(context: CheatContext) -> pol.UnitExecution:
    """Real training in bfloat16 autocast instead of float32 (cheaper on hardware with bf16 units)."""
    return _run(context, set(), bf16=True)


def add_noise(magnitude: float) -> Callable[[CheatContext], pol.UnitExecution]:
    """Honest training, then Gaussian noise of relative L2 `magnitude` on the final weights (poisoning)."""
    if not magnitude >= 0:
        raise InvalidInput(f"noise magnitude must be non-negative, got {magnitude}")

    def strategy(context: CheatContext) -> pol.UnitExecution:
        honest = pol.execute_unit(context.dataset, context.spec, context.start_state)
        return noisy_copy(context, honest, magnitude)

    return strategy


def noisy_copy(context: CheatContext, honest: pol.UnitExecution, magnitude: float) -> pol.UnitExecution:
    """`honest` with noise of relative L2 `magnitude` added to the model weights of its final checkpoint."""
    import torch

    final = dict(honest.final_state)
    names = sorted(name for name in final if name.startswith(pol.MODEL_PREFIX))
    generator = _generator(context.seed, f"noise{magnitude}")
    noise = {name: torch.randn(final[name].shape, generator=generator) for name in names}
    noise_norm = math.sqrt(sum(float(n.pow(2).sum()) for n in noise.values()))
    weight_norm = math.sqrt(sum(float(final[name].pow(2).sum()) for name in names))
    scale = magnitude * weight_norm / noise_norm
    for name in names:
        final[name] = final[name] + scale * noise[name]
    checkpoints = dict(honest.checkpoints)
    checkpoints[context.spec.steps] = final
    return forge_execution(context, checkpoints, list(honest.transcript.losses))


def collusion_forgery(context: CheatContext) -> pol.UnitExecution:
    """The colluders' shared result: skip half the steps, chosen from the unit alone (one digest for all)."""
    spec = context.spec
    unit_seed = int.from_bytes(hashlib.sha256(spec.canonical_bytes()).digest()[:8], "big") >> 1
    return skip_fraction(0.5)(CheatContext(spec, context.start_state, context.dataset, unit_seed))


STRATEGIES: dict[str, Callable[[CheatContext], pol.UnitExecution]] = {
    "start-state": return_start_state,
    "random-weights": random_weights,
    "skip-10pct": skip_fraction(0.1),
    "skip-50pct": skip_fraction(0.5),
    "skip-90pct": skip_fraction(0.9),
    "other-data": other_data,
    "bf16": bf16_compute,
    "noise": add_noise(NOISE_DEFAULT),
    "interpolated-checkpoints": interpolated_forgery,
    "collusion-2of3": collusion_forgery,
}
# "copy-commitment" is a protocol-level attack (copying another replica's on-chain commitment), modelled in
# verifier/attacks.py: the commitment binds provider and unit, so the copier can never open it.


def forge_unit(
    name: str,
    spec: pol.UnitSpec,
    start_state: Mapping[str, torch.Tensor],
    dataset: Dataset,
    seed: int = 0,
) -> pol.UnitExecution:
    """The named dishonest result for this unit (what node/agent.py runs in dishonest mode)."""
    try:
        strategy = STRATEGIES[name]
    except KeyError:
        raise InvalidInput(f"unknown dishonest strategy {name!r}; known: {sorted(STRATEGIES)}") from None
    return strategy(CheatContext(spec=spec, start_state=start_state, dataset=dataset, seed=seed))
