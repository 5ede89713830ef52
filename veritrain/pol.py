"""Proof-of-learning core: deterministic training steps, canonical state digests and PoL transcripts.

Pure functions, no files (node/unit.py does the files). Why each choice:

- A ``State`` is one flat ``dict[str, Tensor]``: model weights under ``model.``, the AdamW moments under
  ``optim.exp_avg.`` / ``optim.exp_avg_sq.`` and the step counter ``optim.step`` (int64), so one canonical
  digest covers everything a resumed or re-executed run depends on.
- AdamW is written out on tensors (no ``torch.optim``): its whole state is the tensors above, it restores
  bit-identically, and nothing hides in Python objects.
- Data order: the batch of step ``s`` is drawn by a ``torch.Generator`` seeded from
  sha256(order seed, round, shard, step) — a counter-based stream, so any step replays in O(1) and the
  global RNG is never touched.
- The transcript's leaves are: one leaf per checkpoint (step, state digest, losses of the steps that led
  to it), then the data-order commitment, then the unit spec. A checkpoint's leaf + Merkle proof is
  everything a verifier needs to pin one segment.

Additions to the agreed interface (/tmp/training_spec.md), all backwards compatible: ``UnitSpec`` has
``num_shards`` (default 1) and ``hyper_overrides``; ``batch_for_step`` takes ``num_shards=1``;
``canonical_state_bytes`` (the bytes ``state_digest`` hashes, usable as the state blob);
``Transcript.checkpoint_proof`` / ``verify_checkpoint``; ``execute_unit`` (a whole unit in memory);
``train_on_batches`` (the one training loop, also the benchmark's data-parallel baseline); ``device=`` on
the training functions (the model, batches and moments live there; every returned state is on the CPU,
so digests always hash CPU bytes — callers set the deterministic settings, ``veritrain.device``).
``UnitSpec`` field order is part of the interface (callers construct it positionally).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from veritrain.errors import InvalidInput, InvalidState
from veritrain.merkle import merkle_proof, merkle_root, verify_proof
from veritrain.recipes import Recipe, get_recipe

if TYPE_CHECKING:
    import torch

    from veritrain.datasets import Dataset

State = dict[str, "torch.Tensor"]
Batch = tuple["torch.Tensor", "torch.Tensor"]

STATE_DOMAIN = b"veritrain/state/v1"
BATCH_DOMAIN = b"veritrain/batch/v1"
ORDER_DOMAIN = b"veritrain/data-order/v1"
CHECKPOINT_LEAF_DOMAIN = b"veritrain/pol/checkpoint/v1"
ORDER_LEAF_DOMAIN = b"veritrain/pol/data-order/v1"
SPEC_LEAF_DOMAIN = b"veritrain/pol/unit-spec/v1"
RESULT_DOMAIN = b"veritrain/result/v1"
MODEL_PREFIX = "model."
EXP_AVG_PREFIX = "optim.exp_avg."
EXP_AVG_SQ_PREFIX = "optim.exp_avg_sq."
STEP_KEY = "optim.step"
MAX_UNIT_STEPS = 1_000_000


@dataclass(frozen=True)
class UnitSpec:
    """What one unit trains: H steps of a recipe on (order seed, round, shard), checkpoint every c steps.

    ``num_shards`` splits the dataset into that many contiguous slices; shard ``shard`` draws only from its
    own slice (DiLoCo rounds with M > 1 units use M shards). ``hyper_overrides`` are (name, value) pairs of
    OptimizerConfig fields, sorted by name.
    """

    recipe: str
    order_seed: int
    round_index: int
    shard: int
    steps: int
    checkpoint_every: int
    num_shards: int = 1
    hyper_overrides: tuple[tuple[str, float], ...] = field(default=())

    def __post_init__(self) -> None:
        get_recipe(self.recipe)
        if not 0 < self.steps <= MAX_UNIT_STEPS:
            raise InvalidInput(f"steps must be in 1..{MAX_UNIT_STEPS}, got {self.steps}")
        if not 0 < self.checkpoint_every <= self.steps:
            raise InvalidInput(f"checkpoint_every must be in 1..steps, got {self.checkpoint_every}")
        if not (0 <= self.order_seed < 2**64 and 0 <= self.round_index < 2**32):
            raise InvalidInput("order_seed must fit in 64 bits and round_index in 32 bits, both non-negative")
        if not 0 <= self.shard < self.num_shards <= 2**16:
            raise InvalidInput(f"need 0 <= shard < num_shards <= 65536, got {self.shard}/{self.num_shards}")
        if list(self.hyper_overrides) != sorted(self.hyper_overrides):
            raise InvalidInput("hyper_overrides must be sorted by name")
        self.recipe_config()

    def recipe_config(self) -> Recipe:
        """The registry recipe with this unit's hyper-parameter overrides applied."""
        return get_recipe(self.recipe).with_overrides(self.hyper_overrides)

    def canonical_bytes(self) -> bytes:
        """Sorted-key compact JSON: the spec as it enters the transcript."""
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()

    def checkpoint_steps(self) -> tuple[int, ...]:
        """0, c, 2c, ... and always the last step H."""
        steps = list(range(0, self.steps, self.checkpoint_every))
        return (*steps, self.steps)


# ---------------------------------------------------------------- state


def initial_state(recipe: Recipe, seed: int) -> State:
    """Round 0's start state (the genesis): portable seeded weights, zero AdamW moments, step 0.

    Bitwise identical on every machine (recipes.portable_normal), so the buyer creates it once, the order
    anchors ``state_digest`` of it, and any provider may either regenerate it and check that digest or
    fetch the blob ``canonical_state_bytes`` by digest — both give the same bytes.
    """
    import torch

    model = recipe.build_model(seed)
    state: State = {}
    for name, parameter in model.named_parameters():
        weights = parameter.detach().clone()
        state[MODEL_PREFIX + name] = weights
        state[EXP_AVG_PREFIX + name] = torch.zeros_like(weights)
        state[EXP_AVG_SQ_PREFIX + name] = torch.zeros_like(weights)
    state[STEP_KEY] = torch.tensor(0, dtype=torch.int64)
    return state


def _canonical_parts(state: Mapping[str, torch.Tensor]) -> Iterator[bytes | memoryview]:
    """The pieces of ``canonical_state_bytes`` in order; tensor bytes as views, never copied."""
    import torch

    yield STATE_DOMAIN + len(state).to_bytes(8, "big")
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        name_bytes = name.encode()
        dtype_bytes = str(tensor.dtype).removeprefix("torch.").encode()
        raw = tensor.reshape(-1).view(torch.uint8).numpy().data if tensor.numel() else memoryview(b"")
        yield b"".join(
            (
                len(name_bytes).to_bytes(4, "big") + name_bytes,
                len(dtype_bytes).to_bytes(4, "big") + dtype_bytes,
                tensor.ndim.to_bytes(4, "big") + b"".join(d.to_bytes(8, "big") for d in tensor.shape),
                raw.nbytes.to_bytes(8, "big"),
            )
        )
        yield raw


def canonical_state_bytes(state: Mapping[str, torch.Tensor]) -> bytes:
    """The byte stream a state digest covers: domain tag, tensor count, then per tensor sorted by name its
    length-prefixed name, dtype and shape and its raw little-endian bytes. Usable as the state's blob."""
    return b"".join(_canonical_parts(state))


STATE_DTYPE_NAMES = (
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
)
MAX_STATE_TENSORS = 100_000
MAX_STATE_TENSOR_DIMS = 16


def state_from_canonical_bytes(blob: bytes) -> State:
    """The inverse of ``canonical_state_bytes``, so a state fetched by its digest needs no second format;
    InvalidInput for anything truncated, oversized, unsorted or inconsistent (blobs come from peers)."""
    import torch

    view = memoryview(blob)
    offset = 0

    def take(count: int) -> memoryview:
        nonlocal offset
        if count < 0 or offset + count > len(view):
            raise InvalidInput(f"state blob truncated at byte {offset} (needs {count} more)")
        chunk = view[offset : offset + count]
        offset += count
        return chunk

    def number(width: int) -> int:
        return int.from_bytes(take(width), "big")

    if bytes(take(len(STATE_DOMAIN))) != STATE_DOMAIN:
        raise InvalidInput("not a canonical state blob (wrong domain tag)")
    count = number(8)
    if count > MAX_STATE_TENSORS:
        raise InvalidInput(f"state blob claims {count} tensors")
    state: State = {}
    previous = ""
    for _ in range(count):
        name = bytes(take(number(4))).decode("utf-8", errors="strict")
        if state and name <= previous:
            raise InvalidInput("state blob tensors are not in strictly sorted order")
        previous = name
        dtype_name = bytes(take(number(4))).decode("ascii", errors="strict")
        if dtype_name not in STATE_DTYPE_NAMES:
            raise InvalidInput(f"state blob tensor {name!r} has unsupported dtype {dtype_name!r}")
        dtype = getattr(torch, dtype_name)
        ndim = number(4)
        if ndim > MAX_STATE_TENSOR_DIMS:
            raise InvalidInput(f"state blob tensor {name!r} has {ndim} dimensions")
        shape = tuple(number(8) for _ in range(ndim))
        size = number(8)
        expected = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if size != expected:
            raise InvalidInput(f"state blob tensor {name!r}: {size} bytes for shape {shape} of {dtype_name}")
        raw = bytearray(take(size))
        flat = torch.frombuffer(raw, dtype=torch.uint8) if size else torch.empty(0, dtype=torch.uint8)
        state[name] = flat.view(dtype).reshape(shape).clone()
    if offset != len(view):
        raise InvalidInput(f"state blob has {len(view) - offset} trailing bytes")
    return state


def state_digest(state: Mapping[str, torch.Tensor]) -> bytes:
    """sha256 of ``canonical_state_bytes``: sorted names, dtype, shape and raw bytes; never file bytes.
    Hashed piece by piece, so a 300 MB state costs no second copy in memory."""
    hasher = hashlib.sha256()
    for part in _canonical_parts(state):
        hasher.update(part)
    return hasher.digest()


def state_step(state: Mapping[str, torch.Tensor]) -> int:
    """The optimizer step counter stored in a state."""
    return int(state[STEP_KEY].item())


def check_state(recipe: Recipe, state: Mapping[str, torch.Tensor]) -> None:
    """Refuse a state whose names, shapes or dtypes do not match the recipe (e.g. a peer's forged file)."""
    import torch

    expected = initial_state_shapes(recipe)
    if set(state) != set(expected):
        missing, extra = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
        raise InvalidState(f"{recipe.name}: state tensors differ: missing {missing[:5]}, extra {extra[:5]}")
    for name, (shape, dtype) in expected.items():
        tensor = state[name]
        if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != shape or tensor.dtype != dtype:
            raise InvalidState(f"{recipe.name}: {name} must be {dtype} {shape}")


@functools.cache
def initial_state_shapes(recipe: Recipe) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Name -> (shape, dtype) of every tensor a valid state of this recipe holds."""
    import torch

    shapes: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
    for name, parameter in recipe.build_model().named_parameters():
        for prefix in (MODEL_PREFIX, EXP_AVG_PREFIX, EXP_AVG_SQ_PREFIX):
            shapes[prefix + name] = (tuple(parameter.shape), torch.float32)
    shapes[STEP_KEY] = ((), torch.int64)
    return shapes


# ---------------------------------------------------------------- data order


def batch_seed(order_seed: int, round_index: int, shard: int, step: int) -> int:
    """63-bit generator seed for one step's batch: sha256 of the domain and the four counters."""
    material = BATCH_DOMAIN + struct.pack(">QIIQ", order_seed, round_index, shard, step)
    return int.from_bytes(hashlib.sha256(material).digest()[:8], "big") >> 1


def batch_indices(
    recipe: Recipe,
    dataset: Dataset,
    order_seed: int,
    round_index: int,
    shard: int,
    step: int,
    num_shards: int = 1,
) -> torch.Tensor:
    """Example indices (classifier) or window starts (LM) of one step, inside this shard's slice."""
    import torch

    if recipe.dataset != dataset.name:
        raise InvalidInput(f"recipe {recipe.name} trains on {recipe.dataset}, not {dataset.name}")
    window = recipe.seq_len + 1 if "tokens" in dataset.tensors else 1
    total = len(dataset) - window + 1
    low, high = total * shard // num_shards, total * (shard + 1) // num_shards
    if high <= low:
        raise InvalidInput(f"shard {shard}/{num_shards} of {dataset.name} is empty")
    generator = torch.Generator().manual_seed(batch_seed(order_seed, round_index, shard, step))
    return torch.randint(low, high, (recipe.batch_size,), generator=generator, dtype=torch.int64)


def batch_for_step(
    recipe: Recipe,
    dataset: Dataset,
    order_seed: int,
    round_index: int,
    shard: int,
    step: int,
    num_shards: int = 1,
) -> Batch:
    """(inputs, targets) of one step; any party can rebuild any step from these numbers alone."""
    import torch

    indices = batch_indices(recipe, dataset, order_seed, round_index, shard, step, num_shards)
    if "tokens" in dataset.tensors:
        offsets = torch.arange(recipe.seq_len + 1, dtype=torch.int64)
        windows = dataset.tensors["tokens"][indices[:, None] + offsets].to(torch.int64)
        return windows[:, :-1], windows[:, 1:]
    return dataset.tensors["images"][indices], dataset.tensors["labels"][indices]


def data_order_commitment(recipe: Recipe, dataset: Dataset, spec: UnitSpec) -> bytes:
    """sha256 over the dataset digest and, per step, the sha256 of that step's batch indices."""
    hasher = hashlib.sha256(ORDER_DOMAIN + dataset.digest)
    for step in range(spec.steps):
        indices = batch_indices(
            recipe, dataset, spec.order_seed, spec.round_index, spec.shard, step, spec.num_shards
        )
        hasher.update(hashlib.sha256(indices.numpy().astype(">i8").tobytes()).digest())
    return hasher.digest()


# ---------------------------------------------------------------- training


def train_steps(
    recipe: Recipe,
    dataset: Dataset,
    state: Mapping[str, torch.Tensor],
    spec: UnitSpec,
    start_step: int,
    end_step: int,
    on_step: Callable[[int, float], None] | None = None,
    device: str = "cpu",
) -> tuple[State, list[float]]:
    """Run unit steps [start_step, end_step) from `state`; returns the new state and the loss of each step.

    `state` is not modified. `recipe` should be ``spec.recipe_config()`` (passed in so callers may train a
    deliberately different recipe, e.g. an attacker in the benchmark). ``on_step(step, loss)`` runs after
    each step. Deterministic: the same inputs on the same hardware class give bit-identical outputs.
    """
    if not 0 <= start_step <= end_step <= spec.steps:
        raise InvalidInput(f"segment [{start_step}, {end_step}) is outside the unit's 0..{spec.steps}")
    batches = (
        batch_for_step(recipe, dataset, spec.order_seed, spec.round_index, spec.shard, step, spec.num_shards)
        for step in range(start_step, end_step)
    )

    def report(index: int, loss: float) -> None:
        if on_step is not None:
            on_step(start_step + index, loss)

    return train_on_batches(recipe, state, batches, report, device)


def train_on_batches(
    recipe: Recipe,
    state: Mapping[str, torch.Tensor],
    batches: Iterable[Batch],
    on_step: Callable[[int, float], None] | None = None,
    device: str = "cpu",
) -> tuple[State, list[float]]:
    """One AdamW step per batch from `state` (not modified), computed on `device`; returns the new state
    (CPU tensors, ready to digest) and each step's loss; ``on_step(batch index, loss)`` after each step.

    The one training loop: units (``train_steps``) and the benchmark's data-parallel baseline share it.
    """
    import torch

    check_state(recipe, state)
    target = torch.device(device)
    model = recipe.build_model(seed=None).to(target)
    parameters = dict(model.named_parameters())
    with torch.no_grad():
        for name, parameter in parameters.items():
            parameter.copy_(state[MODEL_PREFIX + name])
    exp_avg = {name: state[EXP_AVG_PREFIX + name].to(target, copy=True) for name in parameters}
    exp_avg_sq = {name: state[EXP_AVG_SQ_PREFIX + name].to(target, copy=True) for name in parameters}
    optimizer_step = state_step(state)
    config = recipe.optimizer
    losses: list[float] = []
    for index, (inputs, targets) in enumerate(batches):
        for parameter in parameters.values():
            parameter.grad = None
        loss = model.loss(inputs.to(target), targets.to(target))  # type: ignore[operator]
        loss.backward()
        optimizer_step += 1
        bias_correction1 = 1.0 - config.beta1**optimizer_step
        bias_correction2_sqrt = math.sqrt(1.0 - config.beta2**optimizer_step)
        step_size = config.lr / bias_correction1
        with torch.no_grad():
            for name, parameter in parameters.items():
                gradient = parameter.grad
                if gradient is None:
                    raise InvalidState(f"{recipe.name}: parameter {name} received no gradient")
                if config.weight_decay:
                    parameter.mul_(1.0 - config.lr * config.weight_decay)
                exp_avg[name].mul_(config.beta1).add_(gradient, alpha=1.0 - config.beta1)
                exp_avg_sq[name].mul_(config.beta2).addcmul_(gradient, gradient, value=1.0 - config.beta2)
                denominator = (exp_avg_sq[name].sqrt() / bias_correction2_sqrt).add_(config.eps)
                parameter.addcdiv_(exp_avg[name], denominator, value=-step_size)
        loss_value = float(loss.detach())
        losses.append(loss_value)
        if on_step is not None:
            on_step(index, loss_value)
    new_state: State = {}
    for name, parameter in parameters.items():
        new_state[MODEL_PREFIX + name] = parameter.detach().to("cpu", copy=True)
        new_state[EXP_AVG_PREFIX + name] = exp_avg[name].cpu()
        new_state[EXP_AVG_SQ_PREFIX + name] = exp_avg_sq[name].cpu()
    new_state[STEP_KEY] = torch.tensor(optimizer_step, dtype=torch.int64)
    return new_state, losses


# ---------------------------------------------------------------- transcript


def checkpoint_leaf(step: int, digest: bytes, segment_losses: Sequence[float]) -> bytes:
    """Leaf data of one checkpoint: its step, state digest and the float64 losses of the steps before it."""
    packed = b"".join(struct.pack(">d", loss) for loss in segment_losses)
    return CHECKPOINT_LEAF_DOMAIN + struct.pack(">QI", step, len(segment_losses)) + digest + packed


@dataclass(frozen=True)
class Transcript:
    """A unit's PoL transcript. ``losses[i]`` is the loss of step i; checkpoint j's leaf carries the losses
    of steps [checkpoint_steps[j-1], checkpoint_steps[j])."""

    spec: UnitSpec
    checkpoint_steps: tuple[int, ...]
    checkpoint_digests: tuple[bytes, ...]
    losses: tuple[float, ...]
    data_order_commitment: bytes

    def __post_init__(self) -> None:
        if self.checkpoint_steps != self.spec.checkpoint_steps():
            raise InvalidInput(f"checkpoint steps {self.checkpoint_steps} != {self.spec.checkpoint_steps()}")
        if len(self.checkpoint_digests) != len(self.checkpoint_steps):
            raise InvalidInput("one digest per checkpoint step is required")
        if any(len(digest) != 32 for digest in (*self.checkpoint_digests, self.data_order_commitment)):
            raise InvalidInput("digests must be 32 bytes")
        if len(self.losses) != self.spec.steps:
            raise InvalidInput(f"{len(self.losses)} losses for a {self.spec.steps}-step unit")

    def segment_losses(self, index: int) -> tuple[float, ...]:
        """Losses of the steps that end at checkpoint `index` (empty for the start checkpoint)."""
        if index == 0:
            return ()
        return self.losses[self.checkpoint_steps[index - 1] : self.checkpoint_steps[index]]

    def leaves(self) -> list[bytes]:
        checkpoint_leaves = [
            checkpoint_leaf(step, digest, self.segment_losses(index))
            for index, (step, digest) in enumerate(
                zip(self.checkpoint_steps, self.checkpoint_digests, strict=True)
            )
        ]
        return [
            *checkpoint_leaves,
            ORDER_LEAF_DOMAIN + self.data_order_commitment,
            SPEC_LEAF_DOMAIN + self.spec.canonical_bytes(),
        ]

    def merkle_root(self) -> bytes:
        return merkle_root(self.leaves())

    def checkpoint_proof(self, index: int) -> tuple[bytes, ...]:
        """Merkle audit path for checkpoint `index` (its leaf is ``self.leaves()[index]``)."""
        return merkle_proof(self.leaves(), index)

    @property
    def leaf_count(self) -> int:
        return len(self.checkpoint_steps) + 2

    @property
    def final_digest(self) -> bytes:
        return self.checkpoint_digests[-1]

    def to_json(self) -> dict[str, object]:
        """Plain JSON-able form (hex digests, losses as float64); inverse of ``Transcript.from_json``."""
        return {
            "spec": asdict(self.spec),
            "checkpoint_steps": list(self.checkpoint_steps),
            "checkpoint_digests": [digest.hex() for digest in self.checkpoint_digests],
            "losses": list(self.losses),
            "data_order_commitment": self.data_order_commitment.hex(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Transcript:
        try:
            spec_fields = dict(data["spec"])  # type: ignore[call-overload]
            overrides = spec_fields.get("hyper_overrides", ())
            spec_fields["hyper_overrides"] = tuple((str(key), float(value)) for key, value in overrides)
            return cls(
                spec=UnitSpec(**spec_fields),
                checkpoint_steps=tuple(int(step) for step in data["checkpoint_steps"]),  # type: ignore[attr-defined]
                checkpoint_digests=tuple(bytes.fromhex(d) for d in data["checkpoint_digests"]),  # type: ignore[attr-defined]
                losses=tuple(float(loss) for loss in data["losses"]),  # type: ignore[attr-defined]
                data_order_commitment=bytes.fromhex(str(data["data_order_commitment"])),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise InvalidInput(f"malformed transcript: {error}") from error


def verify_checkpoint(
    root: bytes,
    leaf_count: int,
    index: int,
    step: int,
    digest: bytes,
    segment_losses: Sequence[float],
    proof: Sequence[bytes],
) -> bool:
    """True iff a transcript with this root commits to (step, digest, losses) as checkpoint `index`."""
    return verify_proof(root, checkpoint_leaf(step, digest, segment_losses), index, leaf_count, proof)


def result_digest(final_state_digest: bytes, transcript_root: bytes) -> bytes:
    """DESIGN.md §4: the 32-byte value replicas commit to: sha256(domain, final state digest, PoL root)."""
    if len(final_state_digest) != 32 or len(transcript_root) != 32:
        raise InvalidInput("final state digest and transcript root must be 32 bytes each")
    return hashlib.sha256(RESULT_DOMAIN + final_state_digest + transcript_root).digest()


@dataclass(frozen=True)
class UnitExecution:
    """An in-memory unit run: final state, transcript and the state at every checkpoint step."""

    final_state: State
    transcript: Transcript
    checkpoints: dict[int, State]

    @property
    def result_digest(self) -> bytes:
        return result_digest(self.transcript.final_digest, self.transcript.merkle_root())


def execute_unit(
    dataset: Dataset,
    spec: UnitSpec,
    start_state: Mapping[str, torch.Tensor],
    on_step: Callable[[int, float], None] | None = None,
    device: str = "cpu",
) -> UnitExecution:
    """Run a whole unit in memory (no files): what an honest replica computes, for verifiers and benches."""
    recipe = spec.recipe_config()
    steps = spec.checkpoint_steps()
    state: State = dict(start_state)
    checkpoints: dict[int, State] = {0: state}
    losses: list[float] = []
    for begin, end in itertools.pairwise(steps):
        state, segment = train_steps(recipe, dataset, state, spec, begin, end, on_step, device)
        losses.extend(segment)
        checkpoints[end] = state
    transcript = Transcript(
        spec=spec,
        checkpoint_steps=steps,
        checkpoint_digests=tuple(state_digest(checkpoints[step]) for step in steps),
        losses=tuple(losses),
        data_order_commitment=data_order_commitment(recipe, dataset, spec),
    )
    return UnitExecution(final_state=state, transcript=transcript, checkpoints=checkpoints)
