"""What the benchmarks time with: one call synchronised around CUDA, calls back to back on the device, statistics
in microseconds, and the machine's facts every report names."""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds one call of `fn` takes, synchronising CUDA around it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def back_to_back_us(fn: Callable[[], object], device: torch.device, calls: int = 20, repeats: int = 15) -> float | None:
    """Median device time per call, in microseconds, of `calls` calls issued back to back, from CUDA events
    (None off CUDA): the host's work per call hides behind the device's work while it is the shorter."""
    if device.type != "cuda":
        return None
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(samples)


def stats_us(samples: list[float]) -> dict[str, float]:
    """Median, p10, p90 and p99 of samples given in seconds, in microseconds."""
    us = sorted(s * 1e6 for s in samples)
    pick = lambda q: us[min(len(us) - 1, int(q * (len(us) - 1) + 0.5))]  # noqa: E731
    return {"median": statistics.median(us), "p10": pick(0.10), "p90": pick(0.90), "p99": pick(0.99), "n": len(us)}


def machine() -> dict[str, object]:
    """The CPU's model, torch's version and threads, Python's version, and the GPU where there is one."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info: dict[str, object] = {
        "cpu": cpu,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info
