"""The recipe registry: the only models a provider will ever train.

Why a registry: providers never run buyer code. An order names a recipe (a name + a frozen config);
every party builds the same model from that config, so parameter count and FLOPs per step are computed
from the built model, never taken from the buyer's word.

Every op is chosen to give bitwise-identical results for any CPU thread count (TOOLCHAIN.md: only
``nn.LayerNorm``'s backward differs), so RMSNorm and attention are written out by hand, and parameters are
initialised from an explicit ``torch.Generator`` — no global RNG is read or advanced.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from veritrain.errors import InvalidInput, UnknownRecipe

if TYPE_CHECKING:
    import torch

INIT_DOMAIN = b"veritrain/init/v1"
GRAD_CHUNK_ROWS = 64


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

    def build_model(self, seed: int = 0) -> torch.nn.Module:
        """The model with parameters drawn from a generator seeded by (recipe name, seed)."""
        import torch

        model = _build_uninitialised(self.model)
        generator = torch.Generator().manual_seed(init_seed(self.name, seed))
        _initialise(model, generator)
        return model

    def param_count(self) -> int:
        """Number of trainable scalars, counted on the built model."""
        return _param_count(self.model)

    def flops_per_step(self) -> int:
        """Training FLOPs of one optimizer step: 6 · parameters · tokens (Kaplan et al. 2020)."""
        return 6 * self.param_count() * self.tokens_per_step

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


def init_seed(recipe_name: str, seed: int) -> int:
    """A 63-bit generator seed from sha256(domain, recipe name, seed): unrelated recipes never share init."""
    material = INIT_DOMAIN + b"\x00" + recipe_name.encode() + b"\x00" + seed.to_bytes(16, "big", signed=True)
    return int.from_bytes(hashlib.sha256(material).digest()[:8], "big") >> 1


def _make_modules() -> tuple[type, type]:
    """Define the nn.Module classes lazily so importing the registry does not import torch."""
    import torch
    from torch import nn
    from torch.nn import functional

    class ChunkedLinear(torch.autograd.Function):
        """y = x·Wᵀ + b whose weight/bias gradients sum fixed row chunks in a fixed order.

        Why: for a large reduction dimension (rows = batch·tokens ≥ ~1024) the BLAS splits the sum over
        threads, so ``gᵀ·x`` differs with the thread count (measured: 1 vs 2 threads). Products over
        at most ``GRAD_CHUNK_ROWS`` rows are computed whole by one thread (measured up to 8 threads).
        """

        @staticmethod
        def forward(
            ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
        ) -> torch.Tensor:
            ctx.save_for_backward(x, weight)
            ctx.has_bias = bias is not None
            return functional.linear(x, weight, bias)

        @staticmethod
        def backward(
            ctx: Any, grad_output: torch.Tensor
        ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
            x, weight = ctx.saved_tensors
            rows_out = grad_output.reshape(-1, grad_output.shape[-1])
            rows_in = x.reshape(-1, x.shape[-1])
            whole = rows_out.shape[0] // GRAD_CHUNK_ROWS * GRAD_CHUNK_ROWS
            chunks_out = rows_out[:whole].reshape(-1, GRAD_CHUNK_ROWS, rows_out.shape[1])
            chunks_in = rows_in[:whole].reshape(-1, GRAD_CHUNK_ROWS, rows_in.shape[1])
            partial_weights = list(torch.bmm(chunks_out.transpose(1, 2), chunks_in).unbind(0))
            partial_biases = list(chunks_out.sum(dim=1).unbind(0))
            if whole < rows_out.shape[0]:
                partial_weights.append(rows_out[whole:].t() @ rows_in[whole:])
                partial_biases.append(rows_out[whole:].sum(dim=0))
            grad_weight = torch.zeros_like(weight)
            for partial in partial_weights:  # fixed left-to-right order
                grad_weight += partial
            grad_bias = None
            if ctx.has_bias:
                grad_bias = torch.zeros(weight.shape[0], dtype=weight.dtype)
                for partial in partial_biases:
                    grad_bias += partial
            grad_input = grad_output @ weight if ctx.needs_input_grad[0] else None
            return grad_input, grad_weight, grad_bias

    def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        output: torch.Tensor = ChunkedLinear.apply(x, weight, bias)
        return output

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
            qkv = linear(self.attn_norm(x), self.qkv)
            q, k, v = (
                part.reshape(batch, length, self.n_heads, head_dim).transpose(1, 2)
                for part in qkv.split(d, dim=-1)
            )
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(head_dim))
            scores = scores.masked_fill(causal_mask[:length, :length], float("-inf"))
            attended = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(batch, length, d)
            x = x + linear(attended, self.attn_out)
            hidden = functional.gelu(linear(self.mlp_norm(x), self.mlp_in, self.mlp_in_bias))
            return x + linear(hidden, self.mlp_out, self.mlp_out_bias)

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
            # repeated tokens in a thread-count-dependent order (measured).
            one_hot = functional.one_hot(tokens, self.token_embedding.shape[0]).to(self.token_embedding.dtype)
            x = linear(one_hot, self.token_embedding.t()) + self.position_embedding[:length]
            for block in self.blocks:
                x = block(x, self.causal_mask)
            return linear(self.final_norm(x), self.head)

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
                x = linear(x, weight, bias)
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


def _initialise(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Fill in sorted-name order: gains 1, biases 0, embeddings N(0, 0.02), matrices N(0, 1/fan_in)."""
    import torch

    with torch.no_grad():
        for name, parameter in sorted(model.named_parameters()):
            if name.endswith("gain"):
                parameter.fill_(1.0)
            elif parameter.ndim == 1:
                parameter.zero_()
            elif "embedding" in name:
                parameter.normal_(0.0, 0.02, generator=generator)
            else:
                parameter.normal_(0.0, 1.0 / math.sqrt(parameter.shape[1]), generator=generator)


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
