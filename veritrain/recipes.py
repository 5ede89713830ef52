"""The recipe registry: the only models a provider will ever train.

Why a registry: providers never run buyer code. An order names a recipe (a name + a frozen config);
every party builds the same model from that config, so parameter count and FLOPs per step are computed
from the built model, never taken from the buyer's word.

Determinism, and what is *not* promised: the same recipe on the same hardware class (docs/VERIFICATION.md:
device, CPU vendor and vector path, MKL mode, intra-op thread count, torch build) gives bitwise-identical
results. Across thread counts results may differ (measured: digits-mlp's last-layer weight gradient on an
AMD EPYC, 1 vs 2 threads), so the thread count is part of the hardware class and the unit runner pins it.
RMSNorm and the embedding lookup are still written out (``nn.LayerNorm``'s backward and the index
backward had the largest thread-count effects measured), which keeps cross-class drift small.

Initial weights are **bitwise portable**: drawn from SHAKE-256 (keyed by recipe, seed and tensor name) with
integer arithmetic and two IEEE roundings, never from ``torch.Generator`` whose normal sampler differs with
the CPU vector path (measured: ``ATEN_CPU_CAPABILITY=default`` gave other weights). So every machine
creates the same round-0 state, and the digest the order anchors is reproducible by anybody.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from veritrain.errors import InvalidInput, UnknownRecipe

if TYPE_CHECKING:
    import torch

INIT_DOMAIN = b"veritrain/init/v2"
# Irwin–Hall: a standardized sum of INIT_TERMS (even: the centre is an integer) uniform 16-bit integers
# approximates N(0, 1) (bounded at ±3.46σ); its variance INIT_TERMS·(65536² − 1)/12 is exact.
INIT_TERMS = 4
INIT_SUM_STD = math.sqrt(INIT_TERMS * (65536**2 - 1) / 12)
FLOAT32_BYTES = 4


@dataclass(frozen=True)
class TransformerConfig:
    """A byte-level decoder-only transformer (pre-norm, RMSNorm, GELU MLP, learned positions)."""

    vocab_size: int
    seq_len: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int


@dataclass(frozen=True)
class MLPConfig:
    """A classifier: input -> hidden layers (GELU) -> class logits."""

    in_features: int
    hidden: tuple[int, ...]
    n_classes: int


@dataclass(frozen=True)
class OptimizerConfig:
    """AdamW hyper-parameters; the optimizer is written out in pol.py so its state digests exactly."""

    name: str = "adamw"
    lr: float = 3e-3
    beta1: float = 0.9
    beta2: float = 0.99
    eps: float = 1e-8
    weight_decay: float = 0.0


@dataclass(frozen=True)
class MemoryEstimate:
    """Training memory of one recipe in bytes. ``state`` (weights + moments) is what a checkpoint holds."""

    weights: int
    gradients: int
    optimizer: int
    activations: int

    @property
    def state(self) -> int:
        return self.weights + self.optimizer

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations


@dataclass(frozen=True)
class Recipe:
    """A model + dataset + optimizer + batch shape; one name in the registry."""

    name: str
    dataset: str
    model: TransformerConfig | MLPConfig
    optimizer: OptimizerConfig
    batch_size: int
    description: str = field(default="", compare=False)

    @property
    def seq_len(self) -> int:
        """Tokens per example (1 for a classifier: one example is one 'token' of compute)."""
        return self.model.seq_len if isinstance(self.model, TransformerConfig) else 1

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len

    def build_model(self, seed: int | None = 0) -> torch.nn.Module:
        """The model with portable seeded parameters; ``seed=None`` leaves them uninitialised (for callers
        that overwrite every parameter from a state, where a 25M-parameter init would be wasted seconds)."""
        model = _build_uninitialised(self.model)
        if seed is not None:
            _initialise(model, self.name, seed)
        return model

    def param_count(self) -> int:
        """Number of trainable scalars, counted on the built model."""
        return _param_count(self.model)

    def flops_per_step(self) -> int:
        """Training FLOPs of one optimizer step: 6 · parameters · tokens (Kaplan et al. 2020)."""
        return 6 * self.param_count() * self.tokens_per_step

    def memory_estimate(self) -> MemoryEstimate:
        """Bytes a training step needs (fp32): weights, gradients, AdamW moments and saved activations."""
        params = self.param_count() * FLOAT32_BYTES
        return MemoryEstimate(
            weights=params,
            gradients=params,
            optimizer=2 * params,
            activations=_activation_floats(self.model, self.batch_size) * FLOAT32_BYTES,
        )

    def with_overrides(self, overrides: tuple[tuple[str, float], ...]) -> Recipe:
        """A copy with optimizer hyper-parameters overridden (names must be OptimizerConfig fields)."""
        if not overrides:
            return self
        allowed = {"lr", "beta1", "beta2", "eps", "weight_decay"}
        for key, value in overrides:
            if key not in allowed:
                raise InvalidInput(f"unknown hyper-parameter override {key!r}; allowed: {sorted(allowed)}")
            if not math.isfinite(value) or value < 0:
                raise InvalidInput(f"hyper-parameter {key} must be finite and non-negative, got {value!r}")
        values: dict[str, float] = dict(overrides)
        return replace(self, optimizer=replace(self.optimizer, **values))  # type: ignore[arg-type]


def portable_normal(recipe_name: str, seed: int, tensor_name: str, count: int, std: float) -> torch.Tensor:
    """`count` float32 draws ≈ N(0, std²), bitwise identical on every IEEE-754 machine.

    SHAKE-256(domain, recipe, seed, tensor name) gives INIT_TERMS little-endian uint16 per value; their
    exact integer sum, centred, is scaled in float64 (one rounding) and cast to float32 (one rounding).
    Keyed by tensor name, so a tensor's values do not depend on which other tensors exist.
    """
    import numpy as np
    import torch

    material = b"\x00".join(
        (INIT_DOMAIN, recipe_name.encode(), seed.to_bytes(16, "big", signed=True), tensor_name.encode())
    )
    raw = np.frombuffer(hashlib.shake_256(material).digest(2 * INIT_TERMS * count), dtype="<u2")
    terms = raw.reshape(count, INIT_TERMS)
    total = terms[:, 0].astype(np.int64)
    for column in range(1, INIT_TERMS):
        total += terms[:, column]
    values = (total - INIT_TERMS * 65535 // 2).astype(np.float64) * (std / INIT_SUM_STD)
    return torch.from_numpy(values.astype(np.float32))


def _make_modules() -> tuple[type, type]:
    """Define the nn.Module classes lazily so importing the registry does not import torch."""
    import torch
    from torch import nn
    from torch.nn import functional

    class RMSNorm(nn.Module):
        """x / sqrt(mean(x²) + eps) · gain, written out: per-row reductions only, thread-count invariant."""

        def __init__(self, dim: int, eps: float = 1e-6) -> None:
            super().__init__()
            self.eps = eps
            self.gain = nn.Parameter(torch.empty(dim))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.gain

    class Block(nn.Module):
        def __init__(self, config: TransformerConfig) -> None:
            super().__init__()
            d = config.d_model
            self.n_heads = config.n_heads
            self.attn_norm = RMSNorm(d)
            self.qkv = nn.Parameter(torch.empty(3 * d, d))
            self.attn_out = nn.Parameter(torch.empty(d, d))
            self.mlp_norm = RMSNorm(d)
            self.mlp_in = nn.Parameter(torch.empty(config.d_ff, d))
            self.mlp_in_bias = nn.Parameter(torch.empty(config.d_ff))
            self.mlp_out = nn.Parameter(torch.empty(d, config.d_ff))
            self.mlp_out_bias = nn.Parameter(torch.empty(d))

        def forward(self, x: torch.Tensor, causal_mask: torch.Tensor) -> torch.Tensor:
            batch, length, d = x.shape
            head_dim = d // self.n_heads
            qkv = functional.linear(self.attn_norm(x), self.qkv)
            q, k, v = (
                part.reshape(batch, length, self.n_heads, head_dim).transpose(1, 2)
                for part in qkv.split(d, dim=-1)
            )
            # Scale q, not the T×T scores (exact for head_dim 16 or 64: a power of two), and mask the
            # scores in place: backward then keeps one T×T tensor per layer (softmax's output), not four.
            scores = (q * (1.0 / math.sqrt(head_dim))) @ k.transpose(-2, -1)
            scores.masked_fill_(causal_mask[:length, :length], float("-inf"))
            attended = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(batch, length, d)
            x = x + functional.linear(attended, self.attn_out)
            hidden = functional.gelu(functional.linear(self.mlp_norm(x), self.mlp_in, self.mlp_in_bias))
            return x + functional.linear(hidden, self.mlp_out, self.mlp_out_bias)

    class CharTransformer(nn.Module):
        """Byte-level LM: logits for the next byte at every position."""

        def __init__(self, config: TransformerConfig) -> None:
            super().__init__()
            self.token_embedding = nn.Parameter(torch.empty(config.vocab_size, config.d_model))
            self.position_embedding = nn.Parameter(torch.empty(config.seq_len, config.d_model))
            self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
            self.final_norm = RMSNorm(config.d_model)
            self.head = nn.Parameter(torch.empty(config.vocab_size, config.d_model))
            mask = torch.triu(torch.ones(config.seq_len, config.seq_len, dtype=torch.bool), diagonal=1)
            self.register_buffer("causal_mask", mask, persistent=False)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            length = tokens.shape[1]
            # One-hot product, not indexing: the backward of indexing (index_put with accumulate) sums
            # repeated tokens in a thread-count-dependent order (measured); a product drifts less.
            one_hot = functional.one_hot(tokens, self.token_embedding.shape[0]).to(self.token_embedding.dtype)
            x = functional.linear(one_hot, self.token_embedding.t()) + self.position_embedding[:length]
            for block in self.blocks:
                x = block(x, self.causal_mask)
            return functional.linear(self.final_norm(x), self.head)

        def loss(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            logits = self(inputs)
            return functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    class MLPClassifier(nn.Module):
        def __init__(self, config: MLPConfig) -> None:
            super().__init__()
            widths = (config.in_features, *config.hidden, config.n_classes)
            self.weights = nn.ParameterList(
                nn.Parameter(torch.empty(out, inp)) for inp, out in itertools.pairwise(widths)
            )
            self.biases = nn.ParameterList(nn.Parameter(torch.empty(out)) for out in widths[1:])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            last = len(self.weights) - 1
            for index, (weight, bias) in enumerate(zip(self.weights, self.biases, strict=True)):
                x = functional.linear(x, weight, bias)
                if index < last:
                    x = functional.gelu(x)
            return x

        def loss(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return functional.cross_entropy(self(inputs), targets)

    return CharTransformer, MLPClassifier


@functools.cache
def _module_classes() -> tuple[type, type]:
    return _make_modules()


def _build_uninitialised(config: TransformerConfig | MLPConfig) -> torch.nn.Module:
    transformer_class, mlp_class = _module_classes()
    if isinstance(config, TransformerConfig):
        if config.d_model % config.n_heads:
            raise InvalidInput(f"d_model {config.d_model} is not divisible by n_heads {config.n_heads}")
        return transformer_class(config)
    return mlp_class(config)


def _initialise(model: torch.nn.Module, recipe_name: str, seed: int) -> None:
    """Gains 1, biases 0, embeddings ≈ N(0, 0.02²), matrices ≈ N(0, 1/fan_in), all portable draws."""
    import torch

    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("gain"):
                parameter.fill_(1.0)
            elif parameter.ndim == 1:
                parameter.zero_()
            else:
                std = 0.02 if "embedding" in name else 1.0 / math.sqrt(parameter.shape[1])
                values = portable_normal(recipe_name, seed, name, parameter.numel(), std)
                parameter.copy_(values.reshape(parameter.shape))


def _activation_floats(config: TransformerConfig | MLPConfig, batch: int) -> int:
    """Floats autograd keeps for the backward pass, counted from the forward code above, plus one block's
    worth of transient gradients: per block ≈ 14·B·T·d (norms, q/k/v, attention output, residuals) +
    3·B·T·d_ff (MLP input, GELU in/out) + B·h·T² (the softmax output); the one-hot input,
    logits and log-softmax add 3·B·T·V. An estimate to refuse hopeless devices, not a bound."""
    if isinstance(config, MLPConfig):
        return 3 * batch * (config.in_features + sum(config.hidden) + config.n_classes)
    tokens = batch * config.seq_len
    block = 14 * tokens * config.d_model + 3 * tokens * config.d_ff
    block += batch * config.n_heads * config.seq_len**2
    return (config.n_layers + 1) * block + 3 * tokens * config.vocab_size + 2 * tokens * config.d_model


@functools.cache
def _param_count(config: TransformerConfig | MLPConfig) -> int:
    return sum(parameter.numel() for parameter in _build_uninitialised(config).parameters())


RECIPES: dict[str, Recipe] = {
    recipe.name: recipe
    for recipe in (
        Recipe(
            name="charlm-tiny",
            dataset="python-stdlib-3.11",
            model=TransformerConfig(vocab_size=256, seq_len=64, d_model=64, n_layers=2, n_heads=4, d_ff=256),
            optimizer=OptimizerConfig(lr=3e-3, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.0),
            batch_size=16,
            description="byte-level transformer LM on a fixed set of Python standard-library sources",
        ),
        Recipe(
            name="charlm-25m",
            dataset="python-stdlib-tree",
            model=TransformerConfig(
                vocab_size=256, seq_len=256, d_model=512, n_layers=8, n_heads=8, d_ff=2048
            ),
            optimizer=OptimizerConfig(lr=6e-4, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1),
            batch_size=4,
            description="byte-level transformer LM (25.6M parameters, 256-byte context) on the whole "
            "standard-library source tree; the real-size recipe, a unit of minutes on one GPU",
        ),
        Recipe(
            name="digits-mlp",
            dataset="sklearn-digits",
            model=MLPConfig(in_features=64, hidden=(128, 128), n_classes=10),
            optimizer=OptimizerConfig(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0),
            batch_size=64,
            description="MLP classifier on scikit-learn's bundled 8x8 handwritten digits (1797 images)",
        ),
    )
}


def get_recipe(name: str) -> Recipe:
    """The registered recipe called `name`; anything else is refused (no buyer code, no ad-hoc configs)."""
    try:
        return RECIPES[name]
    except (KeyError, TypeError):
        raise UnknownRecipe(f"unknown recipe {name!r}; known: {sorted(RECIPES)}") from None
