"""bench_lerobot: export a store as a LeRobot v3.0 dataset, with and without video, and import it back.

Side by side in one run: each round exports the whole store once per method (no video: PNG images
in the parquet; video: one mp4 per camera with each encoder, SVT-AV1 at other presets if asked, and
with LeRobot's own AV1 settings),
in shuffled order, then imports each dataset into a fresh zarr store. Frames/s count the store's
frames over the wall time of the whole export (reading the store, encoding, parquet, stats,
metadata) or import (reading, decoding, validating, writing the store); medians over rounds.
Image fidelity, from the first round's import: mean absolute error of the decoded images (0..255),
and the share of frames "in place": where the scene moved (pixels that changed by more than 30
since the previous frame, at least 20 of them), the decoded frame is nearer to its own source
frame than to the previous one.

The measurements are `benchmarks/lerobot.py`'s; this command prints them and writes its section into the `--docs` file.
"""

from __future__ import annotations

from rich.table import Table

from capsule_rollout.benchmarks.lerobot import measure
from capsule_rollout.benchmarks.support import update_markdown_section
from capsule_rollout.commands.configs import BenchLeRobotConfig
from capsule_rollout.commands.result import ExperimentResult
from capsule_rollout.experiments.console import make_console
from capsule_rollout.experiments.paths import resolve_input


def run(config: BenchLeRobotConfig) -> ExperimentResult:
    console = make_console()
    summary = measure(config, resolve_input(config.store), console.print)
    results, frames = summary["methods"], summary["frames"]
    table = Table(title=f"bench_lerobot: {summary['episodes']} episodes, {frames} frames")
    for column in ("method", "export frames/s", "import frames/s", "dataset MB", "image error", "frames in place"):
        table.add_column(column)
    for name, res in results.items():
        table.add_row(name, *_cells(res))
    console.print(table)
    if config.docs:
        update_markdown_section(config.docs, "bench_lerobot", markdown(summary))
        console.print(f"results written to {config.docs}")
    return ExperimentResult(summary)


def markdown(summary: dict) -> str:
    m = summary["machine"]
    shape = "x".join(str(s) for s in summary["image_shape"][:2])
    lines = [
        f"CPU: {m['cpu']}, 2 cores shared with other work. Store: {summary['episodes']} `collect_demos` episodes, "
        f"{summary['frames']} frames, {len(summary['cameras'])} camera(s) at {shape}. Medians of "
        f"{summary['rounds']} interleaved rounds.",
        "",
        "| method | export frames/s | import frames/s | dataset MB | image error (0..255) | frames in place |",
        "|---|---|---|---|---|---|",
    ]
    for name, res in summary["methods"].items():
        lines.append(f"| {name} | " + " | ".join(_cells(res)) + " |")
    return "\n".join(lines)


def _cells(res: dict) -> list[str]:
    quality = ["-", "-"]
    if "mean_abs_error" in res:
        quality[0] = f"{res['mean_abs_error']:.2f}"
    if res.get("frames_in_place") is not None:
        quality[1] = f"{res['frames_in_place']:.1%} of {res['frames_checked']}"
    return [f"{res['export_frames_per_s']:.0f}", f"{res['import_frames_per_s']:.0f}", f"{res['dataset_mb']:.1f}", *quality]
