"""Recipes, datasets, data order, canonical digests, transcripts and checkpoint files."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.torch


# ---------------------------------------------------------------- recipes


def test_unknown_recipe_is_refused() -> None:
    from veritrain import pol
    from veritrain.errors import InvalidInput, UnknownRecipe
    from veritrain.recipes import get_recipe

    with pytest.raises(UnknownRecipe):
        get_recipe("gpt-from-the-buyer")
    with pytest.raises(UnknownRecipe):
        pol.UnitSpec(
            recipe="gpt-from-the-buyer", order_seed=0, round_index=0, shard=0, steps=4, checkpoint_every=2
        )
    assert issubclass(UnknownRecipe, InvalidInput)


def test_charlm_parameter_count_and_flops_match_the_architecture() -> None:
    from veritrain.recipes import TransformerConfig, get_recipe

    recipe = get_recipe("charlm-tiny")
    config = recipe.model
    assert isinstance(config, TransformerConfig)
    d, ff, vocab = config.d_model, config.d_ff, config.vocab_size
    per_block = d + 3 * d * d + d * d + d + ff * d + ff + d * ff + d
    expected = vocab * d + config.seq_len * d + config.n_layers * per_block + d + vocab * d
    assert recipe.param_count() == expected == 136_128
    assert recipe.tokens_per_step == recipe.batch_size * config.seq_len
    assert recipe.flops_per_step() == 6 * expected * recipe.batch_size * config.seq_len


def test_digits_parameter_count_and_flops() -> None:
    from veritrain.recipes import get_recipe

    recipe = get_recipe("digits-mlp")
    expected = (64 * 128 + 128) + (128 * 128 + 128) + (128 * 10 + 10)
    assert recipe.param_count() == expected
    assert recipe.flops_per_step() == 6 * expected * recipe.batch_size
    model = recipe.build_model()
    assert sum(parameter.numel() for parameter in model.parameters()) == expected


def test_models_use_no_thread_sensitive_layer_norm() -> None:
    import torch

    from veritrain.recipes import RECIPES

    for recipe in RECIPES.values():
        modules = list(recipe.build_model().modules())
        assert not any(isinstance(module, torch.nn.LayerNorm | torch.nn.Embedding) for module in modules)


def test_initialisation_is_seeded_and_leaves_the_global_rng_alone() -> None:
    import torch

    from veritrain import pol
    from veritrain.recipes import get_recipe

    recipe = get_recipe("charlm-tiny")
    before = torch.random.get_rng_state()
    first, again, other = (pol.initial_state(recipe, seed) for seed in (1, 1, 2))
    assert torch.equal(torch.random.get_rng_state(), before)
    assert pol.state_digest(first) == pol.state_digest(again) != pol.state_digest(other)


def test_hyper_parameter_overrides_are_validated() -> None:
    from veritrain import pol
    from veritrain.errors import InvalidInput
    from veritrain.recipes import get_recipe

    assert get_recipe("digits-mlp").with_overrides((("lr", 0.01),)).optimizer.lr == 0.01
    with pytest.raises(InvalidInput):
        get_recipe("digits-mlp").with_overrides((("momentum", 0.5),))
    with pytest.raises(InvalidInput):
        get_recipe("digits-mlp").with_overrides((("lr", float("nan")),))
    with pytest.raises(InvalidInput):
        pol.UnitSpec(recipe="digits-mlp", order_seed=0, round_index=0, shard=0, steps=4, checkpoint_every=5)


# ---------------------------------------------------------------- datasets


def test_datasets_are_content_addressed_blobs(stdlib_dataset: Any, digits_dataset: Any) -> None:
    from veritrain.datasets import dataset_blob, dataset_from_blob, load_dataset
    from veritrain.errors import DatasetMismatch

    for dataset in (stdlib_dataset, digits_dataset):
        blob = dataset_blob(dataset.name)
        assert dataset.digest == hashlib.sha256(blob).digest()
        assert dataset_from_blob(dataset.name, blob).digest == dataset.digest
        assert load_dataset(dataset.name, expected_digest=dataset.digest) is dataset
        with pytest.raises(DatasetMismatch):
            load_dataset(dataset.name, expected_digest=bytes(32))
    assert len(digits_dataset) == 1797
    assert digits_dataset.tensors["labels"].bincount().min() >= 170
    assert 100_000 < len(stdlib_dataset) <= 320 * 1024
    assert b"def dedent(" in dataset_blob(stdlib_dataset.name)


def test_malformed_dataset_blobs_and_missing_files_are_refused(tmp_path: Path) -> None:
    from veritrain.datasets import dataset_from_blob, stdlib_corpus_bytes
    from veritrain.errors import DatasetUnavailable, InvalidInput

    with pytest.raises(InvalidInput):
        dataset_from_blob("sklearn-digits", bytes(64))
    with pytest.raises(InvalidInput):
        dataset_from_blob("sklearn-digits", bytes([17] * 65))
    with pytest.raises(InvalidInput):
        dataset_from_blob("imagenet", b"x" * 100)
    with pytest.raises(DatasetUnavailable):
        stdlib_corpus_bytes(tmp_path)


# ---------------------------------------------------------------- data order


def test_any_step_replays_alone_and_shards_are_disjoint(stdlib_dataset: Any, digits_dataset: Any) -> None:
    import torch

    from veritrain import pol
    from veritrain.recipes import get_recipe

    recipe = get_recipe("charlm-tiny")
    late_first = pol.batch_for_step(recipe, stdlib_dataset, 9, 3, 0, 500)
    pol.batch_for_step(recipe, stdlib_dataset, 9, 3, 0, 0)
    late_again = pol.batch_for_step(recipe, stdlib_dataset, 9, 3, 0, 500)
    assert all(torch.equal(a, b) for a, b in zip(late_first, late_again, strict=True))
    inputs, targets = late_first
    assert inputs.shape == targets.shape == (recipe.batch_size, recipe.seq_len)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])  # next-byte targets
    keys = {(9, 3, 0, 500), (9, 3, 0, 501), (9, 4, 0, 500), (10, 3, 0, 500), (9, 3, 1, 500)}
    index_sets = {
        tuple(pol.batch_indices(recipe, stdlib_dataset, *key, num_shards=2).tolist()) for key in keys
    }
    assert len(index_sets) == len(keys)

    digits = get_recipe("digits-mlp")
    shard_of = {
        shard: set(pol.batch_indices(digits, digits_dataset, 1, 0, shard, step, num_shards=3).tolist())
        for shard in range(3)
        for step in range(1)
    }
    assert not shard_of[0] & shard_of[1] and not shard_of[1] & shard_of[2]
    assert max(shard_of[0]) < min(shard_of[1]) and max(shard_of[1]) < min(shard_of[2])


def test_wrong_dataset_for_a_recipe_is_refused(digits_dataset: Any) -> None:
    from veritrain import pol
    from veritrain.errors import InvalidInput
    from veritrain.recipes import get_recipe

    with pytest.raises(InvalidInput):
        pol.batch_for_step(get_recipe("charlm-tiny"), digits_dataset, 0, 0, 0, 0)


# ---------------------------------------------------------------- canonical digest


def small_state() -> dict[str, Any]:
    import torch

    return {
        "model.w": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "model.b": torch.zeros(3),
        "optim.step": torch.tensor(4, dtype=torch.int64),
    }


def test_digest_ignores_insertion_order_and_memory_layout() -> None:
    from veritrain import pol

    state = small_state()
    reordered = dict(reversed(list(state.items())))
    transposed_twice = {**state, "model.w": state["model.w"].t().contiguous().t()}
    assert not transposed_twice["model.w"].is_contiguous()
    assert pol.state_digest(state) == pol.state_digest(reordered) == pol.state_digest(transposed_twice)
    assert hashlib.sha256(pol.canonical_state_bytes(state)).digest() == pol.state_digest(state)


def test_canonical_bytes_round_trip_to_the_same_state_and_bad_bytes_are_refused() -> None:
    import torch

    from veritrain import pol
    from veritrain.errors import InvalidInput

    state = {
        **small_state(),
        "model.half": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
        "model.empty": torch.zeros(0, 4),
        "model.mask": torch.tensor([True, False]),
    }
    blob = pol.canonical_state_bytes(state)
    decoded = pol.state_from_canonical_bytes(blob)
    assert sorted(decoded) == sorted(state)
    for name, tensor in state.items():
        assert decoded[name].dtype == tensor.dtype and decoded[name].shape == tensor.shape
        assert torch.equal(decoded[name], tensor)
    assert pol.canonical_state_bytes(decoded) == blob
    with pytest.raises(InvalidInput, match="truncated"):
        pol.state_from_canonical_bytes(blob[:-1])
    with pytest.raises(InvalidInput, match="trailing"):
        pol.state_from_canonical_bytes(blob + b"\x00")
    with pytest.raises(InvalidInput, match="domain"):
        pol.state_from_canonical_bytes(b"x" * len(blob))


def test_digest_changes_with_any_single_element_name_dtype_or_shape() -> None:
    import torch

    from veritrain import pol

    base = pol.state_digest(small_state())
    variants: list[dict[str, Any]] = []
    for name in ("model.w", "model.b"):
        for position in range(small_state()[name].numel()):
            state = small_state()
            flat = state[name].view(-1).view(torch.int32)
            flat[position] ^= 1  # one bit of one float
            variants.append(state)
    step_changed = small_state()
    step_changed["optim.step"] += 1
    renamed = small_state()
    renamed["model.c"] = renamed.pop("model.b")
    reshaped = {**small_state(), "model.w": small_state()["model.w"].reshape(3, 2)}
    retyped = {**small_state(), "model.b": torch.zeros(3, dtype=torch.int32)}
    extra = {**small_state(), "model.extra": torch.zeros(0)}
    negative_zero = {**small_state(), "model.b": -torch.zeros(3)}
    variants += [step_changed, renamed, reshaped, retyped, extra, negative_zero]
    digests = [pol.state_digest(variant) for variant in variants]
    assert base not in digests
    assert len(set(digests)) == len(digests)


def test_foreign_states_are_refused(stdlib_dataset: Any) -> None:
    import torch

    from veritrain import pol
    from veritrain.errors import InvalidState
    from veritrain.recipes import get_recipe

    recipe = get_recipe("charlm-tiny")
    spec = pol.UnitSpec(recipe=recipe.name, order_seed=0, round_index=0, shard=0, steps=2, checkpoint_every=1)
    state = pol.initial_state(recipe, 0)
    missing = {name: tensor for name, tensor in state.items() if name != "optim.step"}
    half = {**state, "model.head": state["model.head"].to(torch.float16)}
    for bad in (missing, half, pol.initial_state(get_recipe("digits-mlp"), 0)):
        with pytest.raises(InvalidState):
            pol.train_steps(recipe, stdlib_dataset, bad, spec, 0, 1)


# ---------------------------------------------------------------- training and transcript


def test_loss_decreases_over_a_few_dozen_steps(stdlib_dataset: Any, digits_dataset: Any) -> None:
    from veritrain import pol

    for recipe_name, dataset, steps in (
        ("charlm-tiny", stdlib_dataset, 40),
        ("digits-mlp", digits_dataset, 60),
    ):
        spec = pol.UnitSpec(
            recipe=recipe_name, order_seed=5, round_index=0, shard=0, steps=steps, checkpoint_every=20
        )
        recipe = spec.recipe_config()
        start = pol.initial_state(recipe, 3)
        state, losses = pol.train_steps(recipe, dataset, start, spec, 0, steps)
        first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
        n_classes = 256 if recipe_name == "charlm-tiny" else 10
        assert last < 0.75 * first, (recipe_name, first, last)
        assert last < 0.6 * math.log(n_classes), (recipe_name, last)  # far better than guessing uniformly
        assert pol.state_step(state) == steps
        assert pol.state_step(start) == 0  # the input state is not modified


def test_transcript_commits_to_checkpoints_losses_and_data_order(stdlib_dataset: Any) -> None:
    from dataclasses import replace

    from veritrain import pol
    from veritrain.errors import InvalidInput

    spec = pol.UnitSpec(
        recipe="charlm-tiny", order_seed=4, round_index=0, shard=0, steps=5, checkpoint_every=2
    )
    execution = pol.execute_unit(stdlib_dataset, spec, pol.initial_state(spec.recipe_config(), 0))
    transcript = execution.transcript
    assert transcript.checkpoint_steps == (0, 2, 4, 5)
    assert len(transcript.leaves()) == transcript.leaf_count == 6
    root = transcript.merkle_root()
    for index, step in enumerate(transcript.checkpoint_steps):
        proof = transcript.checkpoint_proof(index)
        digest, losses = transcript.checkpoint_digests[index], transcript.segment_losses(index)
        assert pol.verify_checkpoint(root, transcript.leaf_count, index, step, digest, losses, proof)
        assert not pol.verify_checkpoint(root, transcript.leaf_count, index, step, bytes(32), losses, proof)
        if losses:
            nudged = (losses[0] + 1e-6, *losses[1:])
            assert not pol.verify_checkpoint(root, transcript.leaf_count, index, step, digest, nudged, proof)
    assert pol.Transcript.from_json(transcript.to_json()) == transcript
    changed_losses = replace(transcript, losses=(*transcript.losses[:-1], transcript.losses[-1] + 1.0))
    changed_order = replace(transcript, data_order_commitment=bytes(32))
    roots = {root, changed_losses.merkle_root(), changed_order.merkle_root()}
    assert len(roots) == 3
    assert execution.result_digest == pol.result_digest(transcript.final_digest, root)
    assert pol.result_digest(transcript.final_digest, changed_order.merkle_root()) != execution.result_digest
    with pytest.raises(InvalidInput):
        replace(transcript, losses=transcript.losses[:-1])
    with pytest.raises(InvalidInput):
        pol.result_digest(b"short", root)


# ---------------------------------------------------------------- checkpoint files


def test_checkpoints_are_byte_stable_and_round_trip(tmp_path: Path) -> None:
    from node.unit import load_checkpoint, save_checkpoint
    from veritrain import pol
    from veritrain.recipes import get_recipe

    state = pol.initial_state(get_recipe("digits-mlp"), 8)
    save_checkpoint(state, tmp_path / "a.safetensors", {"note": "x", "other": "y"})
    save_checkpoint(
        dict(reversed(list(state.items()))), tmp_path / "b.safetensors", {"other": "y", "note": "x"}
    )
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()
    assert pol.state_digest(load_checkpoint(tmp_path / "a.safetensors")) == pol.state_digest(state)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a.safetensors", "b.safetensors"]


def test_garbage_and_foreign_checkpoints_are_refused(tmp_path: Path, digits_dataset: Any) -> None:
    from node.unit import checkpoint_path, load_checkpoint, run_unit
    from veritrain import pol
    from veritrain.errors import CheckpointError

    (tmp_path / "junk.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path / "junk.safetensors")
    spec = pol.UnitSpec(
        recipe="digits-mlp", order_seed=1, round_index=0, shard=0, steps=4, checkpoint_every=2
    )
    other = pol.UnitSpec(
        recipe="digits-mlp", order_seed=2, round_index=0, shard=0, steps=4, checkpoint_every=2
    )
    start = pol.initial_state(spec.recipe_config(), 0)
    workdir = tmp_path / "unit"
    run_unit(spec, start, workdir, dataset=digits_dataset)
    with pytest.raises(CheckpointError):
        run_unit(other, start, workdir, dataset=digits_dataset)
    # A damaged latest checkpoint is skipped: the run resumes from the previous one, same result.
    honest = run_unit(spec, start, tmp_path / "honest", dataset=digits_dataset)
    latest = checkpoint_path(workdir, 4)
    data = bytearray(latest.read_bytes())
    data[-1] ^= 0xFF
    latest.write_bytes(bytes(data))
    assert run_unit(spec, start, workdir, dataset=digits_dataset).result_digest == honest.result_digest
    checkpoint_path(workdir, 4).write_bytes(b"truncated")
    (workdir / ".ckpt-00000004.safetensors.999.tmp").write_bytes(b"half a file")
    assert run_unit(spec, start, workdir, dataset=digits_dataset).result_digest == honest.result_digest
    assert checkpoint_path(workdir, 4).read_bytes() == checkpoint_path(tmp_path / "honest", 4).read_bytes()
    assert not list(workdir.glob(".*.tmp"))


def test_stdlib_corpus_is_identical_in_another_python_311_patch_release() -> None:
    """The corpus files were chosen byte-identical across 3.11 patch releases (here 3.11.2 vs 3.11.7)."""
    import sysconfig

    from veritrain.datasets import stdlib_corpus_bytes

    system_stdlib = Path("/usr/lib/python3.11")
    if not (system_stdlib / "textwrap.py").exists() or system_stdlib == Path(sysconfig.get_paths()["stdlib"]):
        pytest.skip("no second Python 3.11 standard library on this machine")
    assert stdlib_corpus_bytes(system_stdlib) == stdlib_corpus_bytes()
