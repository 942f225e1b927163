"""bench_capsules: capsule snapshot/restore latency against the memory-bandwidth limit.

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

The measurements are `benchmarks/capsules.py`'s; this command prints them and writes its section into the `--docs` file.
"""

from __future__ import annotations

import torch
from rich.table import Table

from capsule_rollout.benchmarks.capsules import fmt_size, measure
from capsule_rollout.benchmarks.support import update_markdown_section
from capsule_rollout.commands.configs import BenchCapsulesConfig
from capsule_rollout.commands.result import ExperimentResult
from capsule_rollout.experiments.console import make_console


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
            f"| {fmt_size(s['size_bytes'])} | {s['buffers']} | {s['copy_us']['n']} | {med('copy_us'):.1f} | "
            f"{med('restore_us'):.1f} | {s['restore_over_copy']:.2f}x | {med('loop_us'):.1f} | {med('foreach_us'):.1f} | "
            f"{med('clone_us'):.1f} | {med('snapshot_us'):.1f} | {med('snapshot_digest_us'):.1f} | {digest} | "
            f"{s['save_mb_s']:.0f} | {s['load_mb_s']:.0f} |"
        )
    lines += _back_to_back(summary)
    t = summary["targets"]
    lines += ["", "Targets:"]
    for name, ok in t.items():
        lines.append(f"- {name}: {'met' if ok else 'NOT met' if ok is not None else 'not measured'}")
    return "\n".join(lines)


def _back_to_back(summary: dict) -> list[str]:
    """On CUDA: restore against the contiguous copy when 20 calls are issued back to back (device time)."""
    rows = [s for s in summary["sizes"] if s.get("back_to_back_us")]
    return ["", "Back to back on the device (CUDA events over 20 calls, median of 15, us per call): " + "; ".join(
        f"{fmt_size(s['size_bytes'])}: copy {s['back_to_back_us']['copy']:.1f}, restore "
        f"{s['back_to_back_us']['restore']:.1f} ({s['restore_over_copy_back_to_back']:.2f}x)" for s in rows
    ) + "."] if rows else []


def run(config: BenchCapsulesConfig) -> ExperimentResult:
    if config.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but no CUDA device is visible; use --device cpu or auto")
    use_cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if use_cuda else "cpu")
    console = make_console()
    summary = measure(config, device, console.print)
    console.print(_table(summary))
    for line in _back_to_back(summary):
        console.print(line)
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
            fmt_size(s["size_bytes"]), str(s["buffers"]), med("copy_us"), med("restore_us"),
            f"{s['restore_over_copy']:.2f}x", med("loop_us"), med("foreach_us"), med("clone_us"), med("snapshot_us"),
            med("snapshot_digest_us"), f"{s['save_mb_s']:.0f}", f"{s['load_mb_s']:.0f}",
        )
    return table
