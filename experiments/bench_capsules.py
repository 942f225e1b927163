"""bench_capsules: capsule snapshot/restore latency against the memory-bandwidth limit.

For each size, one capsule made of many state buffers of mixed dtypes, and in the
same rounds, side by side:
  copy      one contiguous `copy_` of the same payload bytes (the bandwidth limit)
  restore   `restore(arena, capsule)`: checks + one slab copy per device + hooks
  loop      a per-buffer `copy_` loop over the same buffers (an arena without slabs)
  foreach   `torch._foreach_copy_` over the same buffers
  clone     one contiguous `clone()` of the payload (fresh memory, as a snapshot needs)
  snapshot  `snapshot(arena, digest=False)`, and with digests
Then disk save / load (load includes the integrity check), in MB/s.
"""

from __future__ import annotations

import random
import tempfile
import time
from pathlib import Path

import torch
from rich.table import Table

from capsules import (
    Arena,
    BufferComponent,
    BufferSpec,
    load_capsule,
    restore,
    save_capsule,
    snapshot,
)
from benchmarks.support import machine, stats_us, timed, update_markdown_section
from commands.configs import BenchCapsulesConfig
from experiments.console import make_console
from commands.result import ExperimentResult

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
    gen = torch.Generator().manual_seed(seed)
    arena.fill_random_(gen)


def _measure_size(total: int, n: int, config: BenchCapsulesConfig, device: torch.device, rounds: int) -> dict:
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
    result["snapshot_over_clone"] = result["snapshot_us"]["median"] / result["clone_us"]["median"]
    digest_s = max(0.0, result["snapshot_digest_us"]["median"] - result["snapshot_us"]["median"]) / 1e6
    result["digest_mb_s"] = total / digest_s / 1e6 if digest_s > 0 else None
    result.update(_measure_disk(capsule, config, 2 if config.quick else config.disk_rounds))
    return result


def _measure_disk(capsule, config: BenchCapsulesConfig, rounds: int) -> dict:
    with tempfile.TemporaryDirectory(dir=config.disk_dir or None) as tmp:
        path = Path(tmp) / "bench.capsule"
        save, load = [], []
        for _ in range(rounds):
            save.append(timed(lambda: save_capsule(capsule, path), torch.device("cpu")))
            load.append(timed(lambda: load_capsule(path), torch.device("cpu")))
        size = path.stat().st_size
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    return {"file_bytes": size, "save_mb_s": size / med(save) / 1e6, "load_mb_s": size / med(load) / 1e6}


def _fmt_size(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def markdown(summary: dict) -> str:
    m = summary["machine"]
    lines = [
        f"Device: **{summary['device']}** ({m.get('gpu') or m['cpu']}), torch {m['torch']}, "
        f"{m['torch_threads']} threads. Medians over interleaved rounds, microseconds.",
        "",
        "| capsule | buffers | rounds | contiguous copy | restore | restore / copy | per-buffer loop | "
        "foreach | clone | snapshot | snapshot + digest | digest MB/s | save MB/s | load MB/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary["sizes"]:
        med = lambda k: s[k]["median"]  # noqa: B023 - used within this iteration only
        digest = f"{s['digest_mb_s']:.0f}" if s["digest_mb_s"] else "n/a"
        lines.append(
            f"| {_fmt_size(s['size_bytes'])} | {s['buffers']} | {s['copy_us']['n']} | {med('copy_us'):.1f} | "
            f"{med('restore_us'):.1f} | {s['restore_over_copy']:.2f}x | {med('loop_us'):.1f} | {med('foreach_us'):.1f} | "
            f"{med('clone_us'):.1f} | {med('snapshot_us'):.1f} | {med('snapshot_digest_us'):.1f} | {digest} | "
            f"{s['save_mb_s']:.0f} | {s['load_mb_s']:.0f} |"
        )
    t = summary["targets"]
    lines += ["", "Targets:"]
    for name, ok in t.items():
        lines.append(f"- {name}: {'met' if ok else 'NOT met' if ok is not None else 'not measured'}")
    return "\n".join(lines)


def run(config: BenchCapsulesConfig) -> ExperimentResult:
    if config.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but no CUDA device is visible; use --device cpu or auto")
    use_cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if use_cuda else "cpu")
    rounds = 40 if config.quick else config.rounds
    console = make_console()
    sizes = []
    for kib, n in zip(config.sizes_kib, config.buffers):
        console.print(f"measuring {_fmt_size(kib * 1024)} in {n} buffers on {device} ...")
        sizes.append(_measure_size(kib * 1024, n, config, device, rounds))
    by_size = {s["size_bytes"]: s for s in sizes}
    big, small = by_size.get(64 << 20), by_size.get(4 << 10)
    summary = {
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
    console.print(_table(summary))
    if config.docs:
        update_markdown_section(config.docs, "bench_capsules", markdown(summary))
        console.print(f"results written to {config.docs}")
    return ExperimentResult(summary)


def _table(summary: dict) -> Table:
    table = Table(title=f"capsule snapshot / restore on {summary['device']} (median us)")
    cols = ("capsule", "buffers", "copy", "restore", "restore/copy", "loop", "foreach", "clone", "snapshot",
            "snap+digest", "save MB/s", "load MB/s")
    for c in cols:
        table.add_column(c, justify="right")
    for s in summary["sizes"]:
        med = lambda k: f"{s[k]['median']:.1f}"  # noqa: B023 - used within this iteration only
        table.add_row(
            _fmt_size(s["size_bytes"]), str(s["buffers"]), med("copy_us"), med("restore_us"),
            f"{s['restore_over_copy']:.2f}x", med("loop_us"), med("foreach_us"), med("clone_us"), med("snapshot_us"),
            med("snapshot_digest_us"), f"{s['save_mb_s']:.0f}", f"{s['load_mb_s']:.0f}",
        )
    return table
