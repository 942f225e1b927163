"""Snapshot/restore latency vs a contiguous copy of the same bytes; disk save/load MB/s.

For each size, one capsule made of many state buffers of mixed dtypes, and in the
same rounds, side by side:
  copy      one contiguous `copy_` of the same payload bytes (the bandwidth limit)
  restore   `restore(arena, capsule)`: checks + one slab copy per device + hooks
  loop      a per-buffer `copy_` loop over the same buffers (an arena without slabs)
  foreach   `torch._foreach_copy_` over the same buffers
  clone     one contiguous `clone()` of the payload (fresh memory, as a snapshot needs)
  snapshot  `snapshot(arena, digest=False)`, and with digests
Then disk save / load (load includes the integrity check), in MB/s. On CUDA also copy and
restore issued 20 at a time back to back, timed by CUDA events: the device's own time per call.
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from benchmarks import harness
from benchmarks.report import Block, Table, publish, targets
from benchmarks.timing import back_to_back_us, machine, stats_us, timed
from capsule_rollout.capsules import (
    Arena,
    BufferComponent,
    BufferSpec,
    load_capsule,
    restore,
    save_capsule,
    snapshot,
)
from capsule_rollout.commands.result import ExperimentResult

_DTYPES = (torch.float32, torch.bfloat16, torch.uint8, torch.int64, torch.bool, torch.float16)
RESTORE_RATIO_TARGET = 1.5  # 64 MiB restore within 1.5x the contiguous copy
SMALL_RESTORE_TARGET_US = 50.0  # 4 KiB restore under 50 us


@dataclass(frozen=True)
class BenchCapsulesConfig:
    sizes_kib: tuple[int, ...] = (4, 1024, 65536)
    """Capsule sizes to measure, in KiB (4 KiB, 1 MiB, 64 MiB by default)."""
    buffers: tuple[int, ...] = (16, 64, 256)
    """Number of state buffers each capsule is split into (one per size)."""
    rounds: int = 300
    """Timed rounds per size; each round times every method once, side by side."""
    max_seconds_per_size: float = 20.0
    """Stop a size's rounds early once this much time has passed."""
    disk_rounds: int = 5
    """Rounds of the disk save/load measurement per size."""
    quick: bool = False
    """Fewer rounds (for `make demo`): 40 rounds, 2 disk rounds."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the capsule's buffers live: auto = CUDA when present, else CPU."""
    disk_dir: str = ""
    """Directory for the disk measurement; empty means a fresh temporary directory."""
    docs: str = ""
    """Markdown file whose bench_capsules section is replaced by the results (e.g. docs/BENCHMARKS.md); empty: none."""
    seed: int = 0
    """Seed of the buffer sizes and contents."""

    def __post_init__(self) -> None:
        if len(self.sizes_kib) != len(self.buffers):
            raise ValueError(
                f"--sizes_kib has {len(self.sizes_kib)} values but --buffers has {len(self.buffers)}: "
                "give one buffer count per size"
            )
        for size, n in zip(self.sizes_kib, self.buffers):
            if size < 1 or n < 1:
                raise ValueError("--sizes_kib and --buffers must be positive")
            if n * 64 > size * 1024:
                raise ValueError(f"{n} buffers do not fit {size} KiB with 64-byte buffers; use fewer --buffers")
        if self.rounds < 3 or self.disk_rounds < 1:
            raise ValueError("--rounds must be >= 3 and --disk_rounds >= 1")


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
    """One capsule of `total` bytes in `n` buffers on `device`: every method of this module's docstring timed in up
    to `rounds` shuffled rounds (fewer past `max_seconds_per_size`): statistics in us, the ratios to the contiguous
    copy and clone, digest MB/s; then the disk save / load."""
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
            progress: Callable[[str], object] = print) -> dict:
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


def report(summary: dict) -> list[Block]:
    m = summary["machine"]
    rows = []
    for s in summary["sizes"]:
        med = lambda k: s[k]["median"]  # noqa: B023 - used within this iteration only
        digest = f"{s['digest_mb_s']:.0f}" if s["digest_mb_s"] else "n/a"
        rows.append((fmt_size(s["size_bytes"]), str(s["buffers"]), str(s["copy_us"]["n"]), f"{med('copy_us'):.1f}",
                     f"{med('restore_us'):.1f}", f"{s['restore_over_copy']:.2f}x", f"{med('loop_us'):.1f}",
                     f"{med('foreach_us'):.1f}", f"{med('clone_us'):.1f}", f"{med('snapshot_us'):.1f}",
                     f"{med('snapshot_digest_us'):.1f}", digest, f"{s['save_mb_s']:.0f}", f"{s['load_mb_s']:.0f}"))
    blocks: list[Block] = [
        f"Device: **{summary['device']}** ({m.get('gpu') or m['cpu']}), torch {m['torch']}, "
        f"{m['torch_threads']} threads. Medians over interleaved rounds, microseconds.",
        Table(("capsule", "buffers", "rounds", "contiguous copy", "restore", "restore / copy", "per-buffer loop",
               "foreach", "clone", "snapshot", "snapshot + digest", "digest MB/s", "save MB/s", "load MB/s"), rows,
              title=f"capsule snapshot / restore on {summary['device']} (median us)"),
    ]
    back = [s for s in summary["sizes"] if s.get("back_to_back_us")]
    if back:  # on CUDA: restore against the contiguous copy when 20 calls are issued back to back (device time)
        blocks.append("Back to back on the device (CUDA events over 20 calls, median of 15, us per call): " + "; ".join(
            f"{fmt_size(s['size_bytes'])}: copy {s['back_to_back_us']['copy']:.1f}, restore "
            f"{s['back_to_back_us']['restore']:.1f} ({s['restore_over_copy_back_to_back']:.2f}x)" for s in back) + ".")
    return [*blocks, targets(summary["targets"])]


def run(config: BenchCapsulesConfig) -> ExperimentResult:
    if config.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but no CUDA device is visible; use --device cpu or auto")
    use_cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
    summary = measure(config, torch.device("cuda" if use_cuda else "cpu"))
    publish("bench_capsules", report(summary), config.docs)
    return ExperimentResult(summary)


def main(argv: list[str] | None = None) -> int:
    return harness.main(BenchCapsulesConfig(), run, "benchmarks.capsules", __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
