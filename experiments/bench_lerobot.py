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
"""

from __future__ import annotations

import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.table import Table

from benchmarks.support import machine, update_markdown_section
from commands.configs import BenchLeRobotConfig
from experiments.console import make_console
from experiments.paths import resolve_input
from commands.result import ExperimentResult
from rollout.lerobot_reader import LeRobotDatasetReader
from rollout.lerobot_writer import LeRobotWriterOptions, export_lerobot, open_store
from rollout.zarr_reader import ZarrEpisodeReader, store_episodes
from rollout.zarr_recorder import ZarrRecorder

FPS = 10


def _size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def _import(src: Path, out: Path) -> None:
    reader = LeRobotDatasetReader(src)
    with ZarrRecorder(out) as recorder:
        for episode in reader.episodes():
            recorder.write(episode)
    reader.close()


def frame_fidelity(source: np.ndarray, decoded: np.ndarray) -> dict[str, float]:
    """Mean absolute error and the share of moving frames decoded at their own time (module docstring)."""
    source, decoded = source.astype(np.int16), decoded.astype(np.int16)
    moved = np.abs(source[1:] - source[:-1]) > 30
    own = (np.abs(decoded[1:] - source[1:]) * moved).sum(axis=(1, 2, 3))
    previous = (np.abs(decoded[1:] - source[:-1]) * moved).sum(axis=(1, 2, 3))
    checked = moved.sum(axis=(1, 2, 3)) >= 20
    return {"mean_abs_error": float(np.abs(decoded - source).mean()),
            "frames_in_place": float((own[checked] < previous[checked]).mean()) if checked.any() else None,
            "frames_checked": int(checked.sum())}


def run(config: BenchLeRobotConfig) -> ExperimentResult:
    console = make_console()
    store = resolve_input(config.store)
    reader = open_store(store)
    methods = {"no video (PNG)": LeRobotWriterOptions(fps=FPS, video=False)}
    methods.update({f"video {c}": LeRobotWriterOptions(fps=FPS, vcodec=c) for c in config.vcodecs})
    for preset in config.svt_presets:
        methods[f"video libsvtav1 preset {preset}"] = LeRobotWriterOptions(fps=FPS, vcodec="libsvtav1",
                                                                           svt_preset=preset)
    if "libsvtav1" in config.vcodecs:  # LeRobot's own recording settings, for comparison
        methods["video libsvtav1, LeRobot's settings (preset 12, crf 30)"] = LeRobotWriterOptions(
            fps=FPS, vcodec="libsvtav1", crf=30, svt_preset=12)
    export_s: dict[str, list[float]] = {m: [] for m in methods}
    import_s: dict[str, list[float]] = {m: [] for m in methods}
    sizes: dict[str, float] = {}
    fidelity: dict[str, dict] = {}
    cameras = [k for k in reader.keys if k.startswith("image_")]
    source = reader.load(cameras[:1]) if cameras else {}
    rng = random.Random(0)
    with tempfile.TemporaryDirectory(prefix="bench_lerobot-") as tmp:
        for r in range(config.rounds):
            order = list(methods)
            rng.shuffle(order)
            for name in order:
                out = Path(tmp) / f"r{r}-{len(export_s[name])}"
                t0 = time.perf_counter()
                export_lerobot(store_episodes(reader, range(len(reader))), out, methods[name])
                export_s[name].append(time.perf_counter() - t0)
                sizes[name] = _size_mb(out)
                t0 = time.perf_counter()
                _import(out, Path(tmp) / "back.zarr")
                import_s[name].append(time.perf_counter() - t0)
                if cameras and name not in fidelity:
                    back = ZarrEpisodeReader(Path(tmp) / "back.zarr").load(cameras[:1])[cameras[0]]
                    fidelity[name] = frame_fidelity(source[cameras[0]], back)
                shutil.rmtree(out)
                shutil.rmtree(Path(tmp) / "back.zarr")
            console.print(f"round {r + 1}/{config.rounds} done")
    frames = reader.n_steps
    image_shape = reader.steps(0, 1)[cameras[0]].shape[1:] if cameras else ()
    results = {name: {"export_frames_per_s": frames / statistics.median(export_s[name]),
                      "import_frames_per_s": frames / statistics.median(import_s[name]),
                      "export_seconds": export_s[name], "import_seconds": import_s[name],
                      "dataset_mb": sizes[name], **fidelity.get(name, {})} for name in methods}
    summary = {"store": str(config.store), "episodes": len(reader), "frames": frames, "cameras": cameras,
               "image_shape": list(image_shape), "rounds": config.rounds, "machine": machine(), "methods": results}
    table = Table(title=f"bench_lerobot: {len(reader)} episodes, {frames} frames")
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
