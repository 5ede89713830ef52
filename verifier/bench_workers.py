"""Long-lived training workers, one per simulated hardware configuration, for calibration and benches.

Why subprocesses: ``ATEN_CPU_CAPABILITY`` and ``MKL_CBWR`` are read when torch is imported, so a different
CPU vector path or BLAS reproducibility mode needs a fresh interpreter with the variable set before
import. Why long-lived: importing torch and building the dataset costs seconds; a benchmark with hundreds of
trials sends each worker many jobs instead of starting a process per trial.

The pipe protocol is private to this module and both ends are this program: 8-byte length + pickle.
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO, Any

from veritrain.errors import BenchWorkerFailed

FRAME_HEADER = struct.Struct(">Q")
CONTROLLED_ENV = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "OMP_WAIT_POLICY")


@dataclass(frozen=True)
class HardwareConfig:
    """A hardware class to run: torch device and thread count plus environment variables read at torch
    import (CPU configs simulate other machines; a GPU config runs on the real device)."""

    name: str
    threads: int
    env: Mapping[str, str] = field(default_factory=dict)
    device: str = "cpu"

    def describe(self) -> str:
        extra = " ".join(f"{key}={value}" for key, value in sorted(self.env.items()))
        where = "" if self.device == "cpu" else f"{self.device}, "
        return where + f"{self.threads} thread(s)" + (f", {extra}" if extra else ", native vector path")


# The heterogeneity one CPU machine offers (TOOLCHAIN.md): thread count, the generic vs. native
# vector path, and MKL's conditional-numerical-reproducibility mode.
CONFIGS: tuple[HardwareConfig, ...] = (
    HardwareConfig("native-1t", 1),
    HardwareConfig("native-2t", 2, {"OMP_WAIT_POLICY": "PASSIVE"}),  # no spinning on a shared machine
    HardwareConfig("isa-default-1t", 1, {"ATEN_CPU_CAPABILITY": "default"}),
    HardwareConfig("mkl-compatible-1t", 1, {"MKL_CBWR": "COMPATIBLE"}),
)
# The verifier (the bench's main process) runs here; it sets its thread count itself.
VERIFIER_CONFIG = CONFIGS[0]


def _write_frame(stream: IO[bytes], payload: object) -> None:
    data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(FRAME_HEADER.pack(len(data)) + data)
    stream.flush()


def _read_frame(stream: IO[bytes]) -> Any:
    header = stream.read(FRAME_HEADER.size)
    if len(header) < FRAME_HEADER.size:
        raise EOFError("pipe closed")
    (length,) = FRAME_HEADER.unpack(header)
    data = stream.read(length)
    if len(data) < length:
        raise EOFError("pipe closed mid-frame")
    return pickle.loads(data)  # both ends are this module, started by this process


class Worker:
    """One subprocess with one hardware config; calls are serialised by a dedicated thread."""

    def __init__(self, config: HardwareConfig, python: str = sys.executable) -> None:
        self.config = config
        env = {
            key: value for key, value in os.environ.items() if key not in ("ATEN_CPU_CAPABILITY", "MKL_CBWR")
        }
        env.update(config.env)
        env["VERITRAIN_BENCH_THREADS"] = str(config.threads)
        env["VERITRAIN_BENCH_DEVICE"] = config.device
        self._process = subprocess.Popen(
            [python, "-m", "verifier.bench_workers"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"worker-{config.name}")
        self._lock = threading.Lock()

    def submit(self, method: str, **kwargs: Any) -> Future[Any]:
        return self._executor.submit(self._call, method, kwargs)

    def _call(self, method: str, kwargs: dict[str, Any]) -> Any:
        assert self._process.stdin is not None and self._process.stdout is not None
        with self._lock:
            try:
                _write_frame(self._process.stdin, (method, kwargs))
                ok, value = _read_frame(self._process.stdout)
            except (EOFError, BrokenPipeError, OSError) as error:
                raise BenchWorkerFailed(f"worker {self.config.name} died: {error}") from error
        if not ok:
            raise BenchWorkerFailed(f"worker {self.config.name} failed: {value}")
        return value

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


class WorkerPool:
    """One worker per config; use as a context manager so the subprocesses always end."""

    def __init__(self, configs: Sequence[HardwareConfig] = CONFIGS) -> None:
        self.workers = {config.name: Worker(config) for config in configs}
        self.identities = {name: worker.submit("identity").result() for name, worker in self.workers.items()}

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for worker in self.workers.values():
            worker.close()


# ---------------------------------------------------------------- the worker side


def _device() -> str:
    return os.environ.get("VERITRAIN_BENCH_DEVICE", "cpu")


def _identity() -> dict[str, object]:
    import torch

    from veritrain.device import hardware_class

    return {
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "env": {key: os.environ.get(key, "") for key in CONTROLLED_ENV},
        "torch": torch.__version__,
        "hardware_class": hardware_class(_device()),
    }


def _execute_unit(spec: Any, start_state: Any) -> Any:
    from veritrain import pol
    from veritrain.datasets import load_dataset

    recipe = spec.recipe_config()
    return pol.execute_unit(load_dataset(recipe.dataset), spec, start_state, device=_device())


def _train(spec: Any, state: Any, start_step: int, end_step: int) -> Any:
    from veritrain import pol
    from veritrain.datasets import load_dataset

    recipe = spec.recipe_config()
    dataset = load_dataset(recipe.dataset)
    return pol.train_steps(recipe, dataset, state, spec, start_step, end_step, device=_device())


METHODS: dict[str, Callable[..., Any]] = {
    "identity": _identity,
    "execute_unit": _execute_unit,
    "train": _train,
}


def serve() -> None:
    """Worker main loop: frames in on stdin, frames out on stdout (prints go to stderr)."""
    from veritrain.device import Execution, deterministic

    execution = Execution(_device(), int(os.environ.get("VERITRAIN_BENCH_THREADS", "1")))
    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr
    with deterministic(execution):
        _serve_requests(requests, replies)


def _serve_requests(requests: IO[bytes], replies: IO[bytes]) -> None:
    while True:
        try:
            method, kwargs = _read_frame(requests)
        except EOFError:
            return
        try:
            reply: tuple[bool, object] = (True, METHODS[method](**kwargs))
        except Exception as error:  # reported to the parent, which raises BenchWorkerFailed
            reply = (False, f"{type(error).__name__}: {error}")
        _write_frame(replies, reply)


if __name__ == "__main__":
    serve()
