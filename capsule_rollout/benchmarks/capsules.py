"""bench_capsules' measurements (what they compare: `experiments/bench_capsules.py`): capsule snapshot / restore
latency against a contiguous copy of the same bytes, and disk save / load speed."""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from capsule_rollout.benchmarks.support import back_to_back_us, machine, stats_us, timed
from capsule_rollout.capsules import (
    Arena,
    BufferComponent,
    BufferSpec,
    load_capsule,
    restore,
    save_capsule,
    snapshot,
)
from capsule_rollout.commands.configs import BenchCapsulesConfig

_DTYPES = (torch.float32, torch.bfloat16, torch.uint8, torch.int64, torch.bool, torch.float16)
RESTORE_RATIO_TARGET = 1.5  # 64 MiB restore within 1.5x the contiguous copy
SMALL_RESTORE_TARGET_US = 50.0  # 4 KiB restore under 50 us


class ManyBuffers(BufferComponent):
    """`n` state buffers of mixed dtypes whose payload is exactly `total` bytes."""

    def __init__(self, total: int, n: int, device: str, rng: random.Random) -> None:
        super().__init__()
        self.name = "bench"
        units = total // 64
        cuts = sorted(rng.sample(range(1, units), n - 1)) if n > 1 else []
        bounds = [0, *cuts, units]
        self.sizes = [(b - a) * 64 for a, b in zip(bounds, bounds[1:])]
        self.device = device

    def buffer_specs(self) -> list[BufferSpec]:
        specs = []
        for i, nbytes in enumerate(self.sizes):
            dtype = _DTYPES[i % len(_DTYPES)]
            specs.append(BufferSpec(f"b{i:04d}", (nbytes // dtype.itemsize,), dtype, self.device))
        return specs


def _fill(arena: Arena, seed: int) -> None:
    """Fill every buffer of `arena` with random contents from `seed`."""
    gen = torch.Generator().manual_seed(seed)
    arena.fill_random_(gen)


def measure_size(total: int, n: int, config: BenchCapsulesConfig, device: torch.device, rounds: int) -> dict:
    """One capsule of `total` bytes in `n` buffers on `device`: every method of `experiments/bench_capsules.py`'s
    docstring timed in up to `rounds` shuffled rounds (fewer past `max_seconds_per_size`): statistics in us, the
    ratios to the contiguous copy and clone, digest MB/s; then the disk save / load."""
    rng = random.Random(config.seed + total + n)
    component = ManyBuffers(total, n, str(device), rng)
    arena = Arena([component]).allocate()
    _fill(arena, config.seed)
    capsule = snapshot(arena, label="bench")
    _fill(arena, config.seed + 1)  # restores must really move bytes
    src = torch.randint(0, 256, (total,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    cap_views = capsule.tensors()
    live = arena.buffers()
    keys = list(live)
    dsts, srcs = [live[k] for k in keys], [cap_views[k] for k in keys]

    def loop() -> None:
        for d, s in zip(dsts, srcs):
            d.copy_(s)

    methods = {
        "copy": lambda: dst.copy_(src),
        "restore": lambda: restore(arena, capsule),
        "loop": loop,
        "foreach": lambda: torch._foreach_copy_(dsts, srcs),
        "clone": lambda: src.clone(),
        "snapshot": lambda: snapshot(arena, digest=False),
        "snapshot_digest": lambda: snapshot(arena),
    }
    samples: dict[str, list[float]] = {m: [] for m in methods}
    order = list(methods)
    for _ in range(3):  # warm-up: allocator, caches, lazy plans
        for m in order:
            methods[m]()
    start = time.perf_counter()
    for r in range(rounds):
        rng.shuffle(order)  # no method always runs right after the same neighbour
        for m in order:
            samples[m].append(timed(methods[m], device))
        if time.perf_counter() - start > config.max_seconds_per_size and r >= 2:
            break
    result = {"size_bytes": total, "buffers": n, "capsule_bytes": capsule.nbytes}
    result.update({f"{m}_us": stats_us(s) for m, s in samples.items()})
    copy_med = result["copy_us"]["median"]
    result["restore_over_copy"] = result["restore_us"]["median"] / copy_med
    result["loop_over_copy"] = result["loop_us"]["median"] / copy_med
    if device.type == "cuda":  # the device's own time: what a restore costs when the host is not waiting on it
        back = {m: back_to_back_us(methods[m], device) for m in ("copy", "restore")}
        result["back_to_back_us"] = back
        result["restore_over_copy_back_to_back"] = back["restore"] / back["copy"]
    result["snapshot_over_clone"] = result["snapshot_us"]["median"] / result["clone_us"]["median"]
    digest_s = max(0.0, result["snapshot_digest_us"]["median"] - result["snapshot_us"]["median"]) / 1e6
    result["digest_mb_s"] = total / digest_s / 1e6 if digest_s > 0 else None
    result.update(measure_disk(capsule, config, 2 if config.quick else config.disk_rounds))
    return result


def measure_disk(capsule, config: BenchCapsulesConfig, rounds: int) -> dict:
    """`capsule` saved to and loaded from disk (load includes the integrity check) `rounds` times: the file's
    bytes and the median save / load MB/s."""
    with tempfile.TemporaryDirectory(dir=config.disk_dir or None) as tmp:
        path = Path(tmp) / "bench.capsule"
        save, load = [], []
        for _ in range(rounds):
            save.append(timed(lambda: save_capsule(capsule, path), torch.device("cpu")))
            load.append(timed(lambda: load_capsule(path), torch.device("cpu")))
        size = path.stat().st_size
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    return {"file_bytes": size, "save_mb_s": size / med(save) / 1e6, "load_mb_s": size / med(load) / 1e6}


def fmt_size(n: int) -> str:
    """`n` bytes as a whole number of MiB or KiB where it is one, else bytes."""
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def measure(config: BenchCapsulesConfig, device: torch.device,
            progress: Callable[[str], object] = lambda _: None) -> dict:
    """`measure_size` for every size of the config (40 rounds with `--quick`), the machine and whether each
    target is met; `progress` is told which size starts."""
    rounds = 40 if config.quick else config.rounds
    sizes = []
    for kib, n in zip(config.sizes_kib, config.buffers):
        progress(f"measuring {fmt_size(kib * 1024)} in {n} buffers on {device} ...")
        sizes.append(measure_size(kib * 1024, n, config, device, rounds))
    by_size = {s["size_bytes"]: s for s in sizes}
    big, small = by_size.get(64 << 20), by_size.get(4 << 10)
    return {
        "device": str(device),
        "machine": machine(),
        "quick": config.quick,
        "sizes": sizes,
        "targets": {
            f"restore 64 MiB within {RESTORE_RATIO_TARGET}x contiguous copy": (
                big["restore_over_copy"] <= RESTORE_RATIO_TARGET if big else None
            ),
            f"restore 4 KiB under {SMALL_RESTORE_TARGET_US:.0f} us": (
                small["restore_us"]["median"] < SMALL_RESTORE_TARGET_US if small else None
            ),
        },
    }
