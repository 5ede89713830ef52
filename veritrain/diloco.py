"""DiLoCo rounds over verified units: the round state, unit start states, the outer step and its digests.

Pure functions over ``pol.State`` dicts on the CPU, no IO (DESIGN.md §3; docs/ARCHITECTURE.md "Rounds in
the market"). An order with M > 1 shards runs in rounds; round r's M units each train H inner AdamW steps
on their own shard, then an **aggregate unit** turns the accepted results into round r+1's state. It is a
unit like any other (assigned, committed, revealed, verified by recomputation) because the outer step must
need no trust in the operator: every honest aggregator computes the same bytes, so any difference is fraud.

The kernel API the market calls (everything else here is internal):

- ``OuterConfig(aggregation, trim, lr, momentum)`` — the order's outer optimizer; ``.digest()`` is the
  ``outerConfigDigest`` stored with the order; ``.min_shards`` is the smallest quorum it can aggregate.
- ``order_genesis(recipe, seed, shards)`` — round 0's state, created once by the buyer; the order anchors
  ``pol.state_digest`` of it (``genesisStateDigest``) and ``pol.canonical_state_bytes`` is its blob. The
  same bytes on every machine (portable init), so a provider may also regenerate it and check the digest.
- ``unit_start_state(round_state, previous)`` — the start state of unit (r, m): θ_r plus the inner AdamW
  moments and step of shard m's last accepted result (``previous``; None before its first). The inner
  state never leaves its shard's chain of results and is never averaged (OpenDiLoCo).
- ``aggregate(AggregateInputs(...))`` — what an aggregator replica runs: the outer step plus every digest
  the unit needs (``output_digest`` = the next round's start, ``inputs_commitment``, ``result_digest``).
- ``verify_aggregate(inputs, claimed_result_digests)`` — the verifier side: recompute, compare bitwise.
- ``inputs_commitment`` / ``aggregate_result_digest`` — the digest formulas alone (tests/fixtures/
  aggregate_vector.json pins them; a contract that computes the commitment from chain data is future
  work: the JobMarket v1 records the result digest, the verifier recomputes the commitment).

- ``fold(inputs, previous)`` — a folded order's shard unit of round r >= 1 (``outer_step="folded"``): it runs
  round r-1's outer step itself (``aggregate`` over the same inputs, so the same bytes) and starts from
  ``unit_start_state`` of its output; ``folded_result_digest`` binds its training result to that ``Fold``.
  No aggregate unit sits between a folded order's rounds, so every unit of a round depends only on the
  previous round's accepted results (a round's units can be committed in one batch).

M = 1 is not DiLoCo: there is no aggregate unit and round r+1 starts from round r's accepted final state
(its digest anchored as the round's start), bit for bit today's sequential training.

Round state (a ``pol.State``, so its canonical bytes and digest come from ``pol``): ``model.<p>`` = θ_r and
``outer.momentum.<p>`` = v_r, float32. The outer step, per parameter in sorted name order:
Δ_m = θ_r − θ_{r,m} for the accepted shards m in shard order; Δ = mean | trimmed mean | median of the Δ_m
per coordinate; v ← μ·v + Δ; θ_{r+1} = θ_r − lr·(Δ + μ·v) (Nesterov). **Bitwise reproducible on every CPU
configuration** (thread count, ``ATEN_CPU_CAPABILITY``, ``MKL_CBWR``, Intel/AMD) by construction: every
operation is elementwise IEEE-754 float32 with exactly one rounding (sub, add, mul, div — no ``alpha=``,
``addcmul`` or ``lerp`` forms that a vector path may contract to a fused multiply-add), scalars are
float32 constants, sums run over shards in a fixed order, and the robust rules sort each coordinate's M
values (a stable sort is a permutation: no arithmetic at all). No BLAS, no reduction split by threads.

Why results are fetched whole (weights + moments, 3× the weights alone): a result's committed digest is
sha256 of its whole canonical blob, which is also the blob's address on the data plane; letting an
aggregator check weights alone would need a two-level state digest (digest of the weights' blob ‖ digest
of the moments' blob) that every agent's fetch path follows. Worth doing when aggregation bandwidth
matters more than this simplicity (docs/ARCHITECTURE.md); the formulas here would not change.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from veritrain.errors import AggregateMismatch, InvalidInput
from veritrain.pol import (
    EXP_AVG_PREFIX,
    EXP_AVG_SQ_PREFIX,
    MODEL_PREFIX,
    STEP_KEY,
    State,
    initial_state,
    state_digest,
)

if TYPE_CHECKING:
    import torch

    from veritrain.recipes import Recipe

MOMENTUM_PREFIX = "outer.momentum."
AGGREGATIONS = ("mean", "trimmed_mean", "median")
OUTER_CONFIG_DOMAIN = b"veritrain/outer-config/v1"
AGGREGATE_INPUTS_DOMAIN = b"veritrain/aggregate-inputs/v1"
AGGREGATE_RESULT_DOMAIN = b"veritrain/aggregate-result/v1"
FOLDED_RESULT_DOMAIN = b"veritrain/folded-result/v1"
NO_RESULT = bytes(32)
MAX_SHARDS = 2**16 - 1


@dataclass(frozen=True)
class OuterConfig:
    """The outer optimizer of an order: Nesterov SGD (lr, momentum) over an aggregation rule.

    ``trim`` is the number of values dropped at each end per coordinate (``trimmed_mean`` only).
    Defaults are DiLoCo's published ones (lr 0.7, momentum 0.9, mean).
    """

    aggregation: str = "mean"
    trim: int = 0
    lr: float = 0.7
    momentum: float = 0.9

    def __post_init__(self) -> None:
        if self.aggregation not in AGGREGATIONS:
            raise InvalidInput(f"aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")
        if self.aggregation == "trimmed_mean" and not 1 <= self.trim <= MAX_SHARDS // 2:
            raise InvalidInput(f"trimmed_mean needs 1 <= trim <= {MAX_SHARDS // 2}, got {self.trim}")
        if self.aggregation != "trimmed_mean" and self.trim != 0:
            raise InvalidInput(
                f"trim applies to trimmed_mean only, got trim={self.trim} for {self.aggregation}"
            )
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise InvalidInput(f"outer lr must be finite and positive, got {self.lr!r}")
        if not (math.isfinite(self.momentum) and 0 <= self.momentum < 1):
            raise InvalidInput(f"outer momentum must be in [0, 1), got {self.momentum!r}")

    @property
    def min_shards(self) -> int:
        """Fewest accepted shards the rule can aggregate (an order's shard quorum must be at least this)."""
        return 2 * self.trim + 1

    def canonical_bytes(self) -> bytes:
        """Domain ‖ optimizer and rule names (length-prefixed) ‖ uint16 trim ‖ float64 lr ‖ float64 momentum
        (big endian): fixed-width numbers, so no float formatting can make two encodings of one config."""
        parts = [OUTER_CONFIG_DOMAIN]
        for text in ("nesterov", self.aggregation):
            parts.append(struct.pack(">B", len(text)) + text.encode())
        parts.append(struct.pack(">Hdd", self.trim, self.lr, self.momentum))
        return b"".join(parts)

    def digest(self) -> bytes:
        """``outerConfigDigest``: sha256 of ``canonical_bytes``."""
        return hashlib.sha256(self.canonical_bytes()).digest()


# ---------------------------------------------------------------- round state and unit starts


def order_genesis(recipe: Recipe, seed: int, shards: int) -> State:
    """What an order anchors as round 0's start: the genesis training state for M = 1 (sequential
    training), its round state (θ_0, zero momentum) for M > 1 (the aggregate unit's start digest)."""
    if not 1 <= shards <= MAX_SHARDS:
        raise InvalidInput(f"shards must be in 1..{MAX_SHARDS}, got {shards}")
    initial = initial_state(recipe, seed)
    return initial if shards == 1 else genesis_round_state(initial)


def genesis_round_state(initial: Mapping[str, torch.Tensor]) -> State:
    """Round 0's state for M > 1: the initial weights θ_0 and a zero outer momentum."""
    import torch

    state: State = {}
    for name, tensor in initial.items():
        if name.startswith(MODEL_PREFIX):
            state[name] = tensor
            state[MOMENTUM_PREFIX + name.removeprefix(MODEL_PREFIX)] = torch.zeros_like(tensor)
    if not state:
        raise AggregateMismatch("initial state has no model weights")
    return state


def _model_names(round_state: Mapping[str, torch.Tensor]) -> list[str]:
    """The parameter names of a valid round state (θ and v pair up: same names, shapes, float32)."""
    import torch

    params = sorted(name.removeprefix(MODEL_PREFIX) for name in round_state if name.startswith(MODEL_PREFIX))
    expected = {MODEL_PREFIX + p for p in params} | {MOMENTUM_PREFIX + p for p in params}
    if not params or set(round_state) != expected:
        raise AggregateMismatch("a round state holds exactly model.<p> and outer.momentum.<p> for each p")
    for param in params:
        weights, momentum = round_state[MODEL_PREFIX + param], round_state[MOMENTUM_PREFIX + param]
        if (
            weights.dtype != torch.float32
            or momentum.dtype != torch.float32
            or weights.shape != momentum.shape
        ):
            raise AggregateMismatch(
                f"round state tensor {param!r}: weights and momentum must be float32 alike"
            )
    return params


def _check_model_of(
    state: Mapping[str, torch.Tensor], round_state: Mapping[str, torch.Tensor], what: str
) -> None:
    for name, reference in round_state.items():
        if name.startswith(MODEL_PREFIX):
            tensor = state.get(name)
            if tensor is None or tensor.shape != reference.shape or tensor.dtype != reference.dtype:
                raise AggregateMismatch(f"{what}: {name} is missing or differs in shape or dtype")


def unit_start_state(
    round_state: Mapping[str, torch.Tensor], previous: Mapping[str, torch.Tensor] | None
) -> State:
    """Start state of unit (r, m): θ_r from the round state, AdamW moments and step from `previous` (shard
    m's last accepted final state), or zero moments and step 0 when the shard has none yet."""
    import torch

    params = _model_names(round_state)
    start: State = {}
    for param in params:
        weights = round_state[MODEL_PREFIX + param]
        start[MODEL_PREFIX + param] = weights
        for prefix in (EXP_AVG_PREFIX, EXP_AVG_SQ_PREFIX):
            if previous is None:
                start[prefix + param] = torch.zeros_like(weights)
                continue
            moment = previous.get(prefix + param)
            if moment is None or moment.shape != weights.shape or moment.dtype != weights.dtype:
                raise AggregateMismatch(f"previous result: {prefix}{param} is missing or misshaped")
            start[prefix + param] = moment
    if previous is None:
        start[STEP_KEY] = torch.tensor(0, dtype=torch.int64)
    else:
        step = previous.get(STEP_KEY)
        if step is None or step.dtype != torch.int64 or step.ndim != 0:
            raise AggregateMismatch(f"previous result: {STEP_KEY} must be an int64 scalar")
        start[STEP_KEY] = step
    return start


# ---------------------------------------------------------------- the outer step


def _aggregate_deltas(deltas: list[torch.Tensor], config: OuterConfig) -> torch.Tensor:
    """One parameter's aggregated Δ from the accepted shards' Δ_m (shard order), elementwise only."""
    import torch

    count = len(deltas)
    if config.aggregation == "mean":
        total = deltas[0].clone()
        for delta in deltas[1:]:
            total = total + delta
        return total / torch.tensor(float(count), dtype=torch.float32)
    ordered = torch.sort(torch.stack(deltas), dim=0, stable=True).values
    if config.aggregation == "median":
        if count % 2:
            return ordered[count // 2].clone()
        return (ordered[count // 2 - 1] + ordered[count // 2]) / torch.tensor(2.0, dtype=torch.float32)
    kept = ordered[config.trim : count - config.trim]
    total = kept[0].clone()
    for row in kept[1:]:
        total = total + row
    return total / torch.tensor(float(count - 2 * config.trim), dtype=torch.float32)


def outer_step(
    round_state: Mapping[str, torch.Tensor],
    results: Sequence[Mapping[str, torch.Tensor] | None],
    config: OuterConfig,
) -> State:
    """Round r+1's state from round r's and the accepted results in shard order (None = no accepted
    result for that shard this round; it is left out of the aggregate). Bitwise reproducible (see above)."""
    import torch

    params = _model_names(round_state)
    accepted = [result for result in results if result is not None]
    if len(accepted) < config.min_shards:
        raise AggregateMismatch(
            f"{len(accepted)} accepted shard(s); {config.aggregation} with trim {config.trim} needs "
            f"{config.min_shards}"
        )
    for index, result in enumerate(accepted):
        _check_model_of(result, round_state, f"accepted result {index}")
    lr = torch.tensor(config.lr, dtype=torch.float32)
    momentum = torch.tensor(config.momentum, dtype=torch.float32)
    new_state: State = {}
    for param in params:
        weights = round_state[MODEL_PREFIX + param]
        deltas = [weights - result[MODEL_PREFIX + param] for result in accepted]
        delta = _aggregate_deltas(deltas, config)
        velocity = round_state[MOMENTUM_PREFIX + param] * momentum + delta
        nesterov = delta + velocity * momentum
        new_state[MODEL_PREFIX + param] = weights - nesterov * lr
        new_state[MOMENTUM_PREFIX + param] = velocity
    return new_state


# ---------------------------------------------------------------- digests and the aggregate unit


def inputs_commitment(
    start_digest: bytes, round_index: int, accepted_digests: Sequence[bytes | None], config_digest: bytes
) -> bytes:
    """``inputsCommitment``: sha256(domain ‖ start state digest ‖ uint32 round ‖ uint16 M ‖
    per shard its accepted final state digest or 32 zero bytes ‖ outer config digest), big endian."""
    if not 0 <= round_index < 2**32:
        raise InvalidInput(f"round must fit in uint32, got {round_index}")
    if not 1 <= len(accepted_digests) <= MAX_SHARDS:
        raise InvalidInput(f"M must be in 1..{MAX_SHARDS}, got {len(accepted_digests)}")
    shards = [NO_RESULT if digest is None else digest for digest in accepted_digests]
    if any(len(digest) != 32 for digest in (start_digest, config_digest, *shards)):
        raise InvalidInput("digests must be 32 bytes")
    header = AGGREGATE_INPUTS_DOMAIN + start_digest + struct.pack(">IH", round_index, len(shards))
    return hashlib.sha256(header + b"".join(shards) + config_digest).digest()


def aggregate_result_digest(output_digest: bytes, commitment: bytes) -> bytes:
    """``resultDigest`` of an aggregate unit: sha256(domain ‖ output digest ‖ inputs commitment)."""
    if len(output_digest) != 32 or len(commitment) != 32:
        raise InvalidInput("output state digest and inputs commitment must be 32 bytes each")
    return hashlib.sha256(AGGREGATE_RESULT_DOMAIN + output_digest + commitment).digest()


@dataclass(frozen=True)
class AggregateInputs:
    """Everything an aggregate unit of round `round_index` reads: the round's state, the accepted result of
    each of the M shards (None where a shard has none) and the order's outer config."""

    round_index: int
    round_state: Mapping[str, torch.Tensor]
    results: tuple[Mapping[str, torch.Tensor] | None, ...]
    config: OuterConfig

    def commitment(self) -> bytes:
        return inputs_commitment(
            state_digest(self.round_state),
            self.round_index,
            [None if result is None else state_digest(result) for result in self.results],
            self.config.digest(),
        )


@dataclass(frozen=True)
class AggregateResult:
    """An aggregator's output: round r+1's state, its digest (the next start, anchored on chain), the
    inputs commitment and the result digest a replica commits to and reveals."""

    output_state: State
    output_digest: bytes
    inputs_commitment: bytes
    result_digest: bytes


def aggregate(inputs: AggregateInputs) -> AggregateResult:
    """Run an aggregate unit: the outer step and its digests."""
    output = outer_step(inputs.round_state, inputs.results, inputs.config)
    output_digest = state_digest(output)
    commitment = inputs.commitment()
    return AggregateResult(
        output_state=output,
        output_digest=output_digest,
        inputs_commitment=commitment,
        result_digest=aggregate_result_digest(output_digest, commitment),
    )


@dataclass(frozen=True)
class AggregateCheck:
    """A verifier's recomputation and, per claimed result digest, whether it is the honest one."""

    expected: AggregateResult
    honest: tuple[bool, ...]


def verify_aggregate(inputs: AggregateInputs, claimed_result_digests: Sequence[bytes]) -> AggregateCheck:
    """Recompute the aggregate unit and compare each replica's revealed result digest bitwise: the outer
    step is deterministic on every configuration, so any other digest is fraud (no tolerance applies)."""
    expected = aggregate(inputs)
    return AggregateCheck(
        expected=expected,
        honest=tuple(claimed == expected.result_digest for claimed in claimed_result_digests),
    )


# ---------------------------------------------------------------- the outer step folded into shard units


@dataclass(frozen=True)
class Fold:
    """The outer step a folded shard unit ran before training: its output's digest (the round's state) and
    its inputs commitment. ``digest()`` is the result digest the aggregate unit it replaces would reveal."""

    round_state_digest: bytes
    inputs_commitment: bytes

    def digest(self) -> bytes:
        return aggregate_result_digest(self.round_state_digest, self.inputs_commitment)


@dataclass(frozen=True)
class FoldedStart:
    """A folded shard unit's outer step: the round state it computed (served to the next round), the
    ``Fold`` its result binds and the state it trains from."""

    round_state: State
    fold: Fold
    start_state: State


def fold(inputs: AggregateInputs, previous: Mapping[str, torch.Tensor] | None) -> FoldedStart:
    """Round r's outer step as a shard unit of round r + 1 runs it (``inputs.round_index`` = r), and that
    unit's start: ``unit_start_state`` of the output with the shard's own last accepted result."""
    result = aggregate(inputs)
    return FoldedStart(
        round_state=result.output_state,
        fold=Fold(result.output_digest, result.inputs_commitment),
        start_state=unit_start_state(result.output_state, previous),
    )


def folded_result_digest(training_result: bytes, outer: Fold) -> bytes:
    """``resultDigest`` of a folded shard unit: sha256(domain ‖ training result digest ‖ fold digest), so
    a replica cannot reveal a training result without the outer step it started from."""
    if len(training_result) != 32:
        raise InvalidInput("training result digest must be 32 bytes")
    return hashlib.sha256(FOLDED_RESULT_DOMAIN + training_result + outer.digest()).digest()
