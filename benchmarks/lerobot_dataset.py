"""LeRobot export and import speed (frames/s) with and without video, and the dataset's size.

A store exported as a LeRobot v3.0 dataset, with and without video, and imported back.

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
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks import harness
from benchmarks.report import Block, Table, publish
from benchmarks.timing import machine
from capsule_rollout.cli.paths import resolve_input
from capsule_rollout.commands.result import ExperimentResult
from capsule_rollout.stores.lerobot_reader import LeRobotDatasetReader
from capsule_rollout.stores.lerobot_writer import LeRobotWriterOptions, export_lerobot, open_store
from capsule_rollout.stores.zarr_reader import ZarrEpisodeReader, store_episodes
from capsule_rollout.stores.zarr_recorder import ZarrRecorder


@dataclass(frozen=True)
class BenchLeRobotConfig:
    store: str = "runs/bench/demos200.zarr"
    """Zarr store exported (make one: `python -m capsule_rollout collect_demos --episodes 200 --out
    runs/bench/demos200.zarr`)."""
    rounds: int = 3
    """Interleaved rounds; each exports (and imports) once per method, in shuffled order."""
    vcodecs: tuple[str, ...] = ("h264", "libsvtav1")
    """Video encoders measured beside the export without video."""
    svt_presets: tuple[int, ...] = ()
    """More libsvtav1 speed presets to measure (at the default crf), beside the default 6 and LeRobot's 12."""
    docs: str = ""
    """Markdown file whose bench_lerobot section is replaced by the results; empty: none."""

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ValueError(f"--rounds must be >= 1, got {self.rounds}")
        if any(not 0 <= p <= 13 for p in self.svt_presets):
            raise ValueError(f"--svt_presets must be within 0..13, got {list(self.svt_presets)}")
        bad = [c for c in self.vcodecs if c not in ("h264", "libsvtav1", "hevc")]
        if bad:
            raise ValueError(f"--vcodecs {bad} unknown; choose from h264, libsvtav1, hevc")


FPS = 10


def _size_mb(path: Path) -> float:
    """MiB of every file under `path`."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def import_dataset(src: Path, out: Path) -> None:
    """The LeRobot dataset `src` read back into a fresh zarr store `out` (what an import measurement times)."""
    reader = LeRobotDatasetReader(src)
    with ZarrRecorder(out) as recorder:
        for episode in reader.episodes():
            recorder.write(episode)
    reader.close()


def frame_fidelity(source: np.ndarray, decoded: np.ndarray) -> dict[str, float]:
    """Mean absolute error (0..255) of the decoded images, and the share of frames "in place": of the frames where
    the scene moved (pixels that changed by more than 30 since the previous frame, at least 20 of them), those
    decoded nearer to their own source frame than to the previous one."""
    source, decoded = source.astype(np.int16), decoded.astype(np.int16)
    moved = np.abs(source[1:] - source[:-1]) > 30
    own = (np.abs(decoded[1:] - source[1:]) * moved).sum(axis=(1, 2, 3))
    previous = (np.abs(decoded[1:] - source[:-1]) * moved).sum(axis=(1, 2, 3))
    checked = moved.sum(axis=(1, 2, 3)) >= 20
    return {"mean_abs_error": float(np.abs(decoded - source).mean()),
            "frames_in_place": float((own[checked] < previous[checked]).mean()) if checked.any() else None,
            "frames_checked": int(checked.sum())}


def measure(config: BenchLeRobotConfig, store: str, progress: Callable[[str], object] = print) -> dict:
    """The store at `store` exported and imported once per method in each of `config.rounds` shuffled rounds:
    frames/s (medians), seconds per round, dataset MB and the first round's image fidelity per method, with the
    store's size and the machine; `progress` is told when a round is done."""
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
                import_dataset(out, Path(tmp) / "back.zarr")
                import_s[name].append(time.perf_counter() - t0)
                if cameras and name not in fidelity:
                    back = ZarrEpisodeReader(Path(tmp) / "back.zarr").load(cameras[:1])[cameras[0]]
                    fidelity[name] = frame_fidelity(source[cameras[0]], back)
                shutil.rmtree(out)
                shutil.rmtree(Path(tmp) / "back.zarr")
            progress(f"round {r + 1}/{config.rounds} done")
    frames = reader.n_steps
    image_shape = reader.steps(0, 1)[cameras[0]].shape[1:] if cameras else ()
    results = {name: {"export_frames_per_s": frames / statistics.median(export_s[name]),
                      "import_frames_per_s": frames / statistics.median(import_s[name]),
                      "export_seconds": export_s[name], "import_seconds": import_s[name],
                      "dataset_mb": sizes[name], **fidelity.get(name, {})} for name in methods}
    return {"store": str(config.store), "episodes": len(reader), "frames": frames, "cameras": cameras,
            "image_shape": list(image_shape), "rounds": config.rounds, "machine": machine(), "methods": results}


def report(summary: dict) -> list[Block]:
    m = summary["machine"]
    shape = "x".join(str(s) for s in summary["image_shape"][:2])
    return [f"CPU: {m['cpu']}, 2 cores shared with other work. Store: {summary['episodes']} `collect_demos` episodes, "
            f"{summary['frames']} frames, {len(summary['cameras'])} camera(s) at {shape}. Medians of "
            f"{summary['rounds']} interleaved rounds.",
            Table(("method", "export frames/s", "import frames/s", "dataset MB", "image error (0..255)",
                   "frames in place"), [(name, *_cells(res)) for name, res in summary["methods"].items()],
                  title=f"bench_lerobot: {summary['episodes']} episodes, {summary['frames']} frames")]


def _cells(res: dict) -> list[str]:
    quality = ["-", "-"]
    if "mean_abs_error" in res:
        quality[0] = f"{res['mean_abs_error']:.2f}"
    if res.get("frames_in_place") is not None:
        quality[1] = f"{res['frames_in_place']:.1%} of {res['frames_checked']}"
    return [f"{res['export_frames_per_s']:.0f}", f"{res['import_frames_per_s']:.0f}", f"{res['dataset_mb']:.1f}", *quality]


def run(config: BenchLeRobotConfig) -> ExperimentResult:
    summary = measure(config, resolve_input(config.store))
    publish("bench_lerobot", report(summary), config.docs)
    return ExperimentResult(summary)


def main(argv: list[str] | None = None) -> int:
    return harness.main(BenchLeRobotConfig(), run, "benchmarks.lerobot_dataset", __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
