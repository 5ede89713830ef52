"""Unit execution on a provider: H steps with safetensors checkpoints every c steps, resumable after a crash.

Why files: a crash or a network drop must cost at most the steps since the last checkpoint, and verifiers
fetch checkpoints to re-execute segments. Each checkpoint is written to a temporary file, fsynced and
renamed, so a crash leaves either the old set of files or the new one, never half a file. The checkpoint's
safetensors metadata carries the unit spec, the start-state digest and the transcript so far (losses and
checkpoint digests), so a resumed run rebuilds the same transcript and the same result digest.

Devices: ``run_unit`` and ``reexecutor`` (a verifier's segment replay) take an ``Execution`` (cpu with a
pinned thread count, cuda[:i], mps). The device is probed and the recipe's memory estimate checked before
the first step (DeviceUnavailable / DeviceUnsuitable, nothing written); training runs under
``device.deterministic``; states are moved back to the CPU for every digest and checkpoint.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from veritrain.device import Execution, deterministic, prepare
from veritrain.errors import CheckpointError, InvalidState, UnitStopped
from veritrain.pol import (
    State,
    Transcript,
    UnitSpec,
    check_state,
    data_order_commitment,
    result_digest,
    state_digest,
    train_steps,
)

if TYPE_CHECKING:
    import torch

    from veritrain.datasets import Dataset

CHECKPOINT_FORMAT = "veritrain-checkpoint/1"
METADATA_KEY = "veritrain"
CHECKPOINT_PATTERN = re.compile(r"^ckpt-(\d{8})\.safetensors$")
TRANSCRIPT_FILE = "transcript.json"
ProgressCallback = Callable[[int, int, float], None]


@dataclass(frozen=True)
class UnitResult:
    """What a replica reveals (result digest) and serves (transcript, checkpoints)."""

    final_state: State
    transcript: Transcript
    result_digest: bytes
    checkpoint_paths: tuple[Path, ...]


def checkpoint_path(workdir: Path, step: int) -> Path:
    return workdir / f"ckpt-{step:08d}.safetensors"


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """Write via `write(tmp)`, fsync, rename over `path`: readers see the old file or the whole new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_directory(path.parent)


def save_checkpoint(
    state: Mapping[str, torch.Tensor], path: Path, metadata: Mapping[str, str] | None = None
) -> None:
    """Atomically write a state as safetensors; equal states and metadata give byte-identical files."""
    from safetensors.torch import save_file

    tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in sorted(state.items())}
    # One metadata key holding sorted JSON: safetensors writes several keys in hash-map (random) order.
    header = {METADATA_KEY: json.dumps({"format": CHECKPOINT_FORMAT, **(metadata or {})}, sort_keys=True)}
    _atomic_write(Path(path), lambda tmp: save_file(tensors, str(tmp), metadata=header))


def read_checkpoint(path: Path) -> tuple[State, dict[str, str]]:
    """State and metadata of a checkpoint; any unreadable or foreign file raises CheckpointError."""
    from safetensors import SafetensorError
    from safetensors.torch import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            header = (handle.metadata() or {}).get(METADATA_KEY, "{}")
            state: State = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
        metadata = json.loads(header)
    except (OSError, SafetensorError, ValueError) as error:
        raise CheckpointError(f"cannot read checkpoint {path}: {error}") from error
    if not isinstance(metadata, dict) or metadata.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path} is not a {CHECKPOINT_FORMAT} file")
    return state, {str(key): str(value) for key, value in metadata.items()}


def load_checkpoint(path: Path) -> State:
    """The state stored in a checkpoint (weights + optimizer state + step)."""
    return read_checkpoint(path)[0]


def _unit_metadata(
    spec: UnitSpec, start_digest: bytes, step: int, losses: list[float], digests: list[bytes]
) -> dict[str, str]:
    return {
        "spec": spec.canonical_bytes().decode(),
        "start_digest": start_digest.hex(),
        "step": str(step),
        "losses": json.dumps(losses),
        "checkpoint_digests": json.dumps([digest.hex() for digest in digests]),
    }


@dataclass(frozen=True)
class _Resume:
    step: int
    state: State
    losses: list[float]
    digests: list[bytes]


def _find_resume_point(spec: UnitSpec, start_digest: bytes, workdir: Path) -> _Resume | None:
    """The latest intact checkpoint of this very unit in `workdir`; files of another unit are refused."""
    candidates = sorted(
        (int(match.group(1)), entry)
        for entry in workdir.iterdir()
        if (match := CHECKPOINT_PATTERN.match(entry.name)) and int(match.group(1)) in spec.checkpoint_steps()
    )
    for step, path in reversed(candidates):
        try:
            state, metadata = read_checkpoint(path)
        except CheckpointError:
            continue  # damaged on disk (a crash cannot cause this: writes are atomic): use an earlier one
        same_unit = metadata.get("spec") == spec.canonical_bytes().decode()
        if not same_unit or metadata.get("start_digest") != start_digest.hex():
            raise CheckpointError(f"{path} belongs to another unit or start state; use a fresh workdir")
        try:
            losses = [float(loss) for loss in json.loads(metadata["losses"])]
            digests = [bytes.fromhex(digest) for digest in json.loads(metadata["checkpoint_digests"])]
        except (KeyError, ValueError, TypeError) as error:
            raise CheckpointError(f"{path}: malformed transcript metadata: {error}") from error
        expected_count = spec.checkpoint_steps().index(step) + 1
        if len(losses) != step or len(digests) != expected_count or state_digest(state) != digests[-1]:
            continue  # damaged (e.g. bit rot): fall back to the previous checkpoint
        return _Resume(step=step, state=state, losses=losses, digests=digests)
    return None


def run_unit(
    spec: UnitSpec,
    start_state: Mapping[str, torch.Tensor],
    workdir: Path,
    *,
    on_progress: ProgressCallback | None = None,
    stop_after_step: int | None = None,
    dataset: Dataset | None = None,
    execution: Execution | None = None,
) -> UnitResult:
    """Run (or resume) a unit in `workdir`; bit-identical result whether or not it was interrupted.

    ``on_progress(completed_steps, total_steps, loss)`` runs after every step. ``stop_after_step=s`` stops
    like a crash after s completed steps (checkpoints so far stay) and raises UnitStopped. `execution`
    (default: this process's CPU thread count) is probed and checked before anything is written.
    """
    from veritrain.datasets import load_dataset

    recipe = spec.recipe_config()
    execution = execution or Execution()
    prepare(recipe, execution)
    data = dataset if dataset is not None else load_dataset(recipe.dataset)
    check_state(recipe, start_state)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    for leftover in workdir.glob(".*.tmp"):  # from a run killed mid-write; never read
        leftover.unlink(missing_ok=True)
    start_digest = state_digest(start_state)
    steps = spec.checkpoint_steps()
    resume = _find_resume_point(spec, start_digest, workdir)
    if resume is None:
        resume = _Resume(step=0, state=dict(start_state), losses=[], digests=[start_digest])
        metadata = _unit_metadata(spec, start_digest, 0, [], [start_digest])
        save_checkpoint(start_state, checkpoint_path(workdir, 0), metadata)
    state, losses, digests = resume.state, list(resume.losses), list(resume.digests)
    try:
        check_state(recipe, state)
    except InvalidState as error:
        raise CheckpointError(f"checkpoint at step {resume.step} does not fit the recipe: {error}") from error

    def report(step: int, loss: float) -> None:
        if on_progress is not None:
            on_progress(step + 1, spec.steps, loss)

    with deterministic(execution):
        for begin, end in itertools.pairwise(steps):
            if end <= resume.step:
                continue
            segment_end = end if stop_after_step is None else max(begin, min(end, stop_after_step))
            state, segment_losses = train_steps(
                recipe, data, state, spec, begin, segment_end, report, execution.device
            )
            if segment_end < end:
                raise UnitStopped(segment_end)
            losses.extend(segment_losses)
            digests.append(state_digest(state))
            metadata = _unit_metadata(spec, start_digest, end, losses, digests)
            save_checkpoint(state, checkpoint_path(workdir, end), metadata)
    transcript = Transcript(
        spec=spec,
        checkpoint_steps=steps,
        checkpoint_digests=tuple(digests),
        losses=tuple(losses),
        data_order_commitment=data_order_commitment(recipe, data, spec),
    )
    transcript_bytes = json.dumps(transcript.to_json(), sort_keys=True, indent=1).encode()
    _atomic_write(workdir / TRANSCRIPT_FILE, lambda tmp: tmp.write_bytes(transcript_bytes))
    return UnitResult(
        final_state=state,
        transcript=transcript,
        result_digest=result_digest(transcript.final_digest, transcript.merkle_root()),
        checkpoint_paths=tuple(checkpoint_path(workdir, step) for step in steps),
    )


def reexecutor(
    spec: UnitSpec, dataset: Dataset, execution: Execution | None = None
) -> Callable[[Mapping[str, torch.Tensor], int, int], tuple[State, list[float]]]:
    """A verifier's segment replay for `spec` on `execution` (``verifier.core.Reexecutor``): the device
    is probed and checked once, here, and each segment runs under the same deterministic settings as a
    provider's unit."""
    recipe = spec.recipe_config()
    execution = execution or Execution()
    prepare(recipe, execution)

    def replay(state: Mapping[str, torch.Tensor], start: int, end: int) -> tuple[State, list[float]]:
        with deterministic(execution):
            return train_steps(recipe, dataset, dict(state), spec, start, end, None, execution.device)

    return replay
