"""bench_lerobot's measurements (what they measure: `experiments/bench_lerobot.py`): a store exported as a
LeRobot v3.0 dataset with and without video and imported back, timed, and the decoded images' fidelity."""

from __future__ import annotations

import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from capsule_rollout.benchmarks.support import machine
from capsule_rollout.commands.configs import BenchLeRobotConfig
from capsule_rollout.stores.lerobot_reader import LeRobotDatasetReader
from capsule_rollout.stores.lerobot_writer import LeRobotWriterOptions, export_lerobot, open_store
from capsule_rollout.stores.zarr_reader import ZarrEpisodeReader, store_episodes
from capsule_rollout.stores.zarr_recorder import ZarrRecorder

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


def measure(config: BenchLeRobotConfig, store: str, progress: Callable[[str], object] = lambda _: None) -> dict:
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
