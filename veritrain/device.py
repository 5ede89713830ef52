"""Devices: where a unit trains, its hardware class, deterministic settings, and refusal before a unit starts.

Why a hardware class: honest results are bitwise identical only on the same class (DESIGN.md §4.6), so
replicas of one unit prefer one class (fast path) and tolerance tables are keyed by pairs of classes.

- CPU class: vendor (Intel and AMD differ: MKL takes other kernels), ATen vector path
  (``ATEN_CPU_CAPABILITY``), MKL reproducibility mode (``MKL_CBWR``), torch build and the **intra-op thread
  count**. Thread count is in the class because no CPU build promises thread-invariant results (measured:
  digits-mlp's last-layer weight gradient differs between 1 and 2 threads on an AMD EPYC, not on an Intel
  Xeon). The unit runner pins it (``Execution.threads``), so a provider's class is what it really runs.
- GPU class (cuBLAS and PyTorch promise bitwise equality only on the same architecture, SM count and
  toolkit): GPU name, compute capability, SM count, CUDA/cuBLAS/torch versions, dtype policy.
- Dtype policy: every registry recipe trains in fp32 with TF32 off (``fp32``); no recipe uses bf16 yet,
  so there is no bf16 capability check to make.

``measure_device`` (agents' registration) also measures matmul throughput and memory, because the market
puts hard constraints on them and prices work per PFLOP. Nothing here was measured on a GPU (none was
available when this was written); the GPU paths are the documented settings, exercised only as pure logic.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from veritrain.errors import DeviceUnavailable, DeviceUnsuitable, InvalidInput

if TYPE_CHECKING:
    import torch

    from veritrain.recipes import Recipe

MATMUL_SIZE = 512
MIN_MEASURE_SECONDS = 0.25
DEVICE_PATTERN = re.compile(r"^(cpu|mps|cuda(:\d{1,3})?)$")
CUBLAS_WORKSPACE = ":4096:8"
CUBLAS_DETERMINISTIC_WORKSPACES = (":4096:8", ":16:8")
DTYPE_POLICY = "fp32"  # fp32 weights and math, TF32 off


@dataclass(frozen=True)
class Execution:
    """Where a unit trains: a torch device string and, on a CPU, the intra-op thread count to pin.

    ``threads=None`` keeps the process's current setting (the thread count still enters the class).
    """

    device: str = "cpu"
    threads: int | None = None

    def __post_init__(self) -> None:
        if not DEVICE_PATTERN.match(self.device):
            raise InvalidInput(f"device must be cpu, mps, cuda or cuda:<index>, got {self.device!r}")
        if self.threads is not None and not 1 <= self.threads <= 1024:
            raise InvalidInput(f"threads must be in 1..1024, got {self.threads}")

    @property
    def kind(self) -> str:
        return self.device.split(":")[0]

    def effective_threads(self) -> int:
        import torch

        return self.threads if self.threads is not None else torch.get_num_threads()


@dataclass(frozen=True)
class HardwareClass:
    """Everything that changes the bits of a training result; equal classes give equal honest results."""

    kind: str
    torch_version: str
    dtype_policy: str = DTYPE_POLICY
    cpu_vendor: str = ""
    vector_path: str = ""
    mkl_mode: str = ""
    threads: int = 0
    gpu_name: str = ""
    compute_capability: str = ""
    sm_count: int = 0
    cuda_version: str = ""
    cublas_version: str = ""

    def key(self) -> str:
        """The compact string agents register and tolerance tables are keyed by (≤ 128 characters)."""
        if self.kind == "cpu":
            parts = [
                "cpu",
                self.cpu_vendor,
                self.vector_path,
                f"t{self.threads}",
                *([f"cbwr-{self.mkl_mode}"] if self.mkl_mode else []),
            ]
        elif self.kind == "cuda":
            parts = [
                "cuda",
                self.gpu_name,
                f"sm{self.compute_capability}",
                f"{self.sm_count}sm",
                f"cuda{self.cuda_version}",
                f"cublas{self.cublas_version}",
            ]
        else:
            parts = [self.kind, self.gpu_name]
        return "/".join([*parts, f"torch{self.torch_version}", self.dtype_policy])[:128]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def cpu_vendor() -> str:
    """'intel', 'amd' or the raw vendor id (first /proc/cpuinfo vendor_id; platform fallback)."""
    vendor = ""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("vendor_id"):
                    vendor = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    vendor = vendor or platform.processor() or platform.machine()
    return {"GenuineIntel": "intel", "AuthenticAMD": "amd"}.get(vendor, vendor.lower() or "unknown")


def _cublas_version() -> str:
    """cuBLAS ships in pip wheels named nvidia-cublas-cu<major>; otherwise it is the toolkit's own."""
    import torch

    for distribution in ("nvidia-cublas-cu13", "nvidia-cublas-cu12", "nvidia-cublas-cu11", "nvidia-cublas"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(distribution)
    return f"of-cuda{torch.version.cuda}"


def hardware_class_of(execution: Execution) -> HardwareClass:
    """The class of this process on `execution`; DeviceUnavailable when the device cannot be probed."""
    import torch

    if execution.kind == "cpu":
        capability = os.environ.get("ATEN_CPU_CAPABILITY") or torch.backends.cpu.get_cpu_capability()
        return HardwareClass(
            kind="cpu",
            torch_version=torch.__version__,
            cpu_vendor=cpu_vendor(),
            vector_path=capability.lower(),
            mkl_mode=os.environ.get("MKL_CBWR", "").lower(),
            threads=execution.effective_threads(),
        )
    if execution.kind == "mps":
        if not torch.backends.mps.is_available():
            raise DeviceUnavailable("device mps: this torch build or machine has no Metal (MPS) backend")
        return HardwareClass(kind="mps", torch_version=torch.__version__, gpu_name=platform.machine())
    index = _cuda_index(execution)
    try:
        properties = torch.cuda.get_device_properties(index)
    except (RuntimeError, AssertionError) as error:  # driver/runtime failures surface as these
        raise DeviceUnavailable(f"device {execution.device}: CUDA probe failed: {error}") from error
    return HardwareClass(
        kind="cuda",
        torch_version=torch.__version__,
        gpu_name=properties.name,
        compute_capability=f"{properties.major}{properties.minor}",
        sm_count=properties.multi_processor_count,
        cuda_version=str(torch.version.cuda),
        cublas_version=_cublas_version(),
    )


def _cuda_index(execution: Execution) -> int:
    import torch

    try:
        available = torch.cuda.is_available()
        count = torch.cuda.device_count() if available else 0
    except (RuntimeError, AssertionError) as error:
        raise DeviceUnavailable(f"device {execution.device}: CUDA driver error: {error}") from error
    if not available:
        raise DeviceUnavailable(f"device {execution.device}: no CUDA device (torch {torch.__version__})")
    index = int(execution.device.split(":")[1]) if ":" in execution.device else 0
    if index >= count:
        raise DeviceUnavailable(f"device {execution.device}: only {count} CUDA device(s) here")
    return index


def available_memory_bytes(device: str = "cpu") -> int:
    """Memory a unit may use: free device memory on a GPU, MemAvailable (or total RAM) on a CPU."""
    if device.startswith("cuda"):
        import torch

        try:
            free, _total = torch.cuda.mem_get_info(_cuda_index(Execution(device)))
        except RuntimeError as error:
            raise DeviceUnavailable(f"device {device}: cannot read free memory: {error}") from error
        return int(free)
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


@dataclass(frozen=True)
class DeviceProbe:
    """What a device is (its class) and has free, read once before a unit starts."""

    execution: Execution
    hardware_class: HardwareClass
    free_memory_bytes: int


def probe(execution: Execution) -> DeviceProbe:
    """Probe a device (DeviceUnavailable on a missing device or a driver error)."""
    return DeviceProbe(
        execution=execution,
        hardware_class=hardware_class_of(execution),
        free_memory_bytes=available_memory_bytes(execution.device),
    )


def check_can_run(recipe: Recipe, device: DeviceProbe) -> None:
    """Refuse (DeviceUnsuitable) a recipe the device cannot train, before any step is taken."""
    needed = recipe.memory_estimate().total
    if needed > device.free_memory_bytes:
        raise DeviceUnsuitable(
            f"{recipe.name} needs about {needed / 2**20:.0f} MiB (weights, gradients, AdamW moments, "
            f"activations) but {device.execution.device} has {device.free_memory_bytes / 2**20:.0f} MiB free"
        )


def prepare(recipe: Recipe, execution: Execution) -> DeviceProbe:
    """Probe and check in one call: what the unit runner and the verifier do before training."""
    device = probe(execution)
    check_can_run(recipe, device)
    return device


@contextlib.contextmanager
def deterministic(execution: Execution) -> Iterator[torch.device]:
    """Run a block with the settings that make results reproducible on `execution`, then restore them.

    CPU: the intra-op thread count pinned to ``execution.threads``. CUDA: deterministic algorithms,
    ``CUBLAS_WORKSPACE_CONFIG`` (must be set before cuBLAS starts; a conflicting value is refused), TF32
    off for matmuls and cuDNN, cuDNN benchmarking off. MPS: deterministic algorithms (MPS has known
    nondeterministic kernels: results there are trusted only through the tolerance path).
    """
    import torch

    if execution.kind == "cuda":
        workspace = os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
        if workspace not in CUBLAS_DETERMINISTIC_WORKSPACES:
            raise DeviceUnsuitable(
                f"CUBLAS_WORKSPACE_CONFIG={workspace} is not deterministic; use {CUBLAS_WORKSPACE}"
            )
    saved_threads = torch.get_num_threads()
    saved_deterministic = torch.are_deterministic_algorithms_enabled()
    saved_flags = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
    )
    if execution.threads is not None:
        torch.set_num_threads(execution.threads)
    if execution.kind == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    if execution.kind != "cpu":
        torch.use_deterministic_algorithms(True)
    try:
        yield torch.device(execution.device)
    finally:
        torch.set_num_threads(saved_threads)
        torch.use_deterministic_algorithms(saved_deterministic)
        (
            torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32,
            torch.backends.cudnn.benchmark,
            torch.backends.cudnn.deterministic,
        ) = saved_flags


# ---------------------------------------------------------------- what an agent registers


@dataclass(frozen=True)
class DeviceProfile:
    """What a provider offers: measured speed and memory, and what makes its results bit-identical."""

    device: str
    tflops: float
    memory_bytes: int
    threads: int
    hardware_class: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def measure_matmul_tflops(
    device: str = "cpu", size: int = MATMUL_SIZE, min_seconds: float = MIN_MEASURE_SECONDS
) -> float:
    """fp32 matmul throughput in TFLOP/s: 2·n³ FLOPs per product, timed over at least `min_seconds`."""
    import torch

    left = torch.randn(size, size, device=device)
    right = torch.randn(size, size, device=device)
    torch.matmul(left, right)  # warm-up: allocations, kernel selection
    iterations = 0
    started = time.perf_counter()
    elapsed = 0.0
    while elapsed < min_seconds:
        torch.matmul(left, right)
        iterations += 1
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - started
    return 2.0 * size**3 * iterations / elapsed / 1e12


def hardware_class(device: str = "cpu") -> str:
    """The class key of this process on `device` at its current thread count."""
    return hardware_class_of(Execution(device)).key()


def measure_device(device: str = "cpu") -> DeviceProfile:
    """Measure everything the market needs to know about this provider's device."""
    import torch

    execution = Execution(device)
    with deterministic(execution):
        tflops = measure_matmul_tflops(device)
    return DeviceProfile(
        device=device,
        tflops=tflops,
        memory_bytes=available_memory_bytes(device),
        threads=torch.get_num_threads(),
        hardware_class=hardware_class_of(execution).key(),
    )
