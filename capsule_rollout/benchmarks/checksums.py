"""bench_checksums' measurements (what they measure: `experiments/bench_checksums.py`): a zarr store recorded
with and without checksums, read with and without verifying them, side by side in one process."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from capsule_rollout.benchmarks.support import machine
from capsule_rollout.commands.configs import BenchChecksumsConfig
from capsule_rollout.stores import checksums as C
from capsule_rollout.stores.episode import Episode, EpisodeBuilder
from capsule_rollout.stores.zarr_reader import ZarrEpisodeReader, store_episodes
from capsule_rollout.stores.zarr_recorder import ZarrRecorder

RECORD = {"with checksums": True, "without": False}
READ = {"verified": True, "unverified": False}


def bench_episodes(config: BenchChecksumsConfig, images: str) -> list[Episode]:
    """`config.episodes` valid episodes (distinct ids, shared arrays): random or smooth moving images."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[: config.image_size, : config.image_size]
    builder = EpisodeBuilder()
    for t in range(config.steps):
        if images == "random":
            frames = {f"cam{c}": rng.integers(0, 256, (config.image_size, config.image_size, 3), np.uint8)
                      for c in range(config.cameras)}
        else:
            frames = {f"cam{c}": np.repeat(((2 * xx + yy + 3 * t + 40 * c) % 256).astype(np.uint8)[..., None], 3, -1)
                      for c in range(config.cameras)}
        builder.add(images=frames, state=rng.normal(size=8).astype(np.float32),
                    action=rng.uniform(-1, 1, 4).astype(np.float32), reward=0.0 if t == config.steps - 1 else -1.0,
                    policy_action=rng.uniform(-1, 1, 4), value=float(-1 + t / config.steps), subtask_id=0,
                    timestamp=1.7e9 + t * 0.1)
    base = builder.finish(episode_id="bench", seed=0, task="bench", instruction="record me", success=True,
                          stop_reason="success")
    return [Episode(base.steps, dataclasses.replace(base.meta, episode_id=f"bench-{i:05d}", seed=i))
            for i in range(config.episodes)]


def _clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(start: tuple[float, float]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of every thread of this process) since `start`."""
    wall, cpu = _clocks()
    return wall - start[0], cpu - start[1]


def record(path: Path, episodes: list[Episode], checksums: bool) -> tuple[float, float]:
    """(wall, CPU) seconds from the first `write` to the recorder's close (every episode committed)."""
    start = _clocks()
    with ZarrRecorder(path, checksums=checksums) as recorder:
        for episode in episodes:
            recorder.write(episode)
    return _since(start)


def read(path: Path, verify: bool) -> dict[str, tuple[float, float] | int]:
    """(wall, CPU) seconds reading every episode in blocks, as consolidate and export do (`blocks`), and one by
    one, as replay does (`one by one`); the decoded bytes (`bytes`)."""
    start = _clocks()
    reader = ZarrEpisodeReader(path, verify=verify)
    nbytes = sum(sum(v.nbytes for v in ep.steps.values()) for ep in store_episodes(reader, range(len(reader))))
    blocks = _since(start)
    start = _clocks()
    reader = ZarrEpisodeReader(path, verify=verify)
    for i in range(len(reader)):
        reader.episode(i)
    return {"blocks": blocks, "one by one": _since(start), "bytes": nbytes}


def measure(config: BenchChecksumsConfig) -> dict:
    directory = Path(config.out) if config.out else Path(tempfile.mkdtemp(prefix="bench_checksums-"))
    directory.mkdir(parents=True, exist_ok=True)
    rows, measured = [], []
    try:
        for images in config.images:
            episodes = bench_episodes(config, images)
            steps = sum(ep.length for ep in episodes)
            runs: list[dict] = []
            for r in range(config.rounds):
                run: dict = {"images": images, "round": r}
                for name in (list(RECORD) if r % 2 == 0 else list(RECORD)[::-1]):
                    wall, cpu = record(directory / f"{images}-{r}-{RECORD[name]}.zarr", episodes, RECORD[name])
                    run[f"record {name}"] = {"steps/s": steps / wall, "cpu s": cpu}
                store = directory / f"{images}-{r}-True.zarr"
                reads: dict[str, list[dict]] = {name: [] for name in READ}
                for _ in range(config.read_repeats):  # interleaved; the fastest of each kind counts
                    for name in (list(READ) if r % 2 == 0 else list(READ)[::-1]):
                        reads[name].append(read(store, READ[name]))
                for name, got in reads.items():
                    for how in ("blocks", "one by one"):
                        wall = min(g[how][0] for g in got)
                        run[f"read {how} {name}"] = {"MB/s": got[0]["bytes"] / wall / 1e6,
                                                     "cpu s": min(g[how][1] for g in got)}
                start = time.perf_counter()
                for episode in episodes:  # what the checksums themselves cost, alone
                    [C.checksum(v) for v in episode.steps.values()]
                run["hash s/episode"] = (time.perf_counter() - start) / len(episodes)
                for p in directory.glob(f"{images}-{r}-*.zarr"):
                    shutil.rmtree(p)
                runs.append(run)
            measured += runs
            rows.append(_row(images, runs, steps, episodes))
    finally:
        if not config.out:
            shutil.rmtree(directory, ignore_errors=True)
    return {"machine": machine(), "config": dataclasses.asdict(config), "rows": rows, "measurements": measured}


PAIRS = {"record": ("record with checksums", "record without", "steps/s"),
         "read blocks": ("read blocks verified", "read blocks unverified", "MB/s"),
         "read one by one": ("read one by one verified", "read one by one unverified", "MB/s")}


def _row(images: str, runs: list[dict], steps: int, episodes: list[Episode]) -> dict:
    """Medians over rounds; per pair, the medians of the rounds' ratios (each pair measured back to back) of the
    rate (`rate ratio`: with / without) and of the CPU seconds (`cpu ratio`: with / without)."""
    row: dict = {"images": images, "episodes": len(episodes), "steps": steps, "rounds": len(runs),
                 "mb_per_episode": sum(v.nbytes for v in episodes[0].steps.values()) / 1e6}
    for what, (with_, without, unit) in PAIRS.items():
        row[what] = {
            f"{unit} with": float(np.median([run[with_][unit] for run in runs])),
            f"{unit} without": float(np.median([run[without][unit] for run in runs])),
            "rate ratio": float(np.median([run[with_][unit] / run[without][unit] for run in runs])),
            "cpu ratio": float(np.median([run[with_]["cpu s"] / run[without]["cpu s"] for run in runs])),
        }
    hashing = float(np.median([run["hash s/episode"] for run in runs]))
    record_s = episodes[0].length / row["record"]["steps/s without"]  # an episode's recording, without checksums
    read_s = row["mb_per_episode"] / row["read blocks"]["MB/s without"]
    row["hash"] = {"ms/episode": hashing * 1e3, "GB/s": row["mb_per_episode"] / 1e3 / hashing,
                   "share of recording": hashing / record_s, "share of a block read": hashing / read_s}
    return row
