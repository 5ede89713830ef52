"""Measure an agent's device: dense matmul throughput (TFLOP/s) and usable memory.

Shared by providers and verifiers. Why measured, not declared: the market's matching engine puts hard
constraints on speed and memory and prices work per PFLOP, so an offer must rest on a number the machine
actually produced. The
hardware class (device, torch build, CPU vector path, thread count) is reported too, because replicas of
one unit prefer one class so that honest results are bit-identical (DESIGN.md §4.6).
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import asdict, dataclass
from typing import Any

MATMUL_SIZE = 512
MIN_MEASURE_SECONDS = 0.25


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
        if device != "cpu":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - started
    return 2.0 * size**3 * iterations / elapsed / 1e12


def available_memory_bytes(device: str = "cpu") -> int:
    """Memory a unit may use: free device memory on a GPU, MemAvailable (or total RAM) on a CPU."""
    if device.startswith("cuda"):
        import torch

        free, _total = torch.cuda.mem_get_info()
        return int(free)
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def hardware_class(device: str = "cpu") -> str:
    """Equal for machines whose honest results are bit-identical (device, torch build, vector path)."""
    import torch

    capability = os.environ.get("ATEN_CPU_CAPABILITY") or torch.backends.cpu.get_cpu_capability()
    cbwr = os.environ.get("MKL_CBWR", "")
    parts = [device, f"torch{torch.__version__}", platform.machine(), capability.lower()]
    if cbwr:
        parts.append(f"cbwr-{cbwr.lower()}")
    return "/".join(parts)


def measure_device(device: str = "cpu") -> DeviceProfile:
    """Measure everything the market needs to know about this provider's device."""
    import torch

    return DeviceProfile(
        device=device,
        tflops=measure_matmul_tflops(device),
        memory_bytes=available_memory_bytes(device),
        threads=torch.get_num_threads(),
        hardware_class=hardware_class(device),
    )
