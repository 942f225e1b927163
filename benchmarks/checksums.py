"""What the stores' checksums cost: recording steps/s and read MB/s with and without them.

Side by side in one process, per round and image kind: `--episodes` synthetic episodes recorded into a fresh zarr
store with checksums and into another without (`ZarrRecorder(checksums=False)`, the format before them), each timed
from the first `write` to the recorder's close: recorded control steps/s. The store with checksums is then read
whole with and without verifying (`ZarrEpisodeReader(verify=False)`), in blocks as `consolidate` and
`export_lerobot` read (`store_episodes`) and episode by episode as `replay` does: decoded MB/s, the files in the
page cache (what the checksums cost the CPU, not the disk). The pairs alternate which goes first (reads:
`--read_repeats` each, interleaved, the fastest counting); figures are medians over rounds, ratios the medians of
the rounds' ratios, of the rates (wall clock) and of the CPU seconds the process spent (every thread). The hashing
alone (every step array of every episode, as the recorder does) is timed too, and given as a share of an episode's
recording and block reading without checksums: the figure the noise of a shared machine disturbs least.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks import harness
from benchmarks.report import Block, Table, publish
from benchmarks.timing import machine
from capsule_rollout.commands.result import ExperimentResult
from capsule_rollout.stores import checksums as C
from capsule_rollout.stores.episode import Episode, EpisodeBuilder
from capsule_rollout.stores.zarr_reader import ZarrEpisodeReader, store_episodes
from capsule_rollout.stores.zarr_recorder import ZarrRecorder


@dataclass(frozen=True)
class BenchChecksumsConfig:
    episodes: int = 40
    """Episodes recorded per measurement (one `write` each, as a driver does; timed to the recorder's close)."""
    steps: int = 100
    """Control steps per synthetic episode."""
    image_size: int = 64
    """Camera image side, in pixels."""
    cameras: int = 2
    """Cameras per step."""
    images: tuple[str, ...] = ("random", "smooth")
    """Image kinds measured: random bytes (incompressible: the least work per byte besides the checksum, its
    worst case) and smooth gradients that move (compress like renders)."""
    rounds: int = 7
    """Rounds; each records with and without checksums and reads with and without verifying, back to back (which
    goes first alternates by round). Figures are medians over rounds, ratios medians of the rounds' ratios."""
    read_repeats: int = 3
    """Reads of each kind per round, interleaved; the fastest counts (the least disturbed by other work)."""
    out: str = ""
    """Directory the measured stores are written to (removed at the end); empty: a temp directory."""
    docs: str = ""
    """Markdown file whose bench_checksums section is replaced by the results; empty: none."""

    def __post_init__(self) -> None:
        if min(self.episodes, self.steps, self.image_size, self.rounds, self.read_repeats) < 1 or self.cameras < 0:
            raise ValueError("--episodes, --steps, --image_size, --rounds and --read_repeats must be >= 1, "
                             "--cameras >= 0")
        bad = [kind for kind in self.images if kind not in ("random", "smooth")]
        if bad or not self.images:
            raise ValueError(f"--images must name random and/or smooth, got {list(self.images)}")


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


def report(summary: dict) -> list[Block]:
    c = summary["config"]
    rows = []
    for r in summary["rows"]:
        for what, unit in (("record", "steps/s"), ("read blocks", "MB/s"), ("read one by one", "MB/s")):
            m = r[what]
            rows.append((r["images"], f"{what} ({unit})", f"{m[unit + ' with']:.0f}", f"{m[unit + ' without']:.0f}",
                         f"{m['rate ratio']:.3f}", f"{m['cpu ratio']:.3f}"))
    hashing = [f"{r['images']}: hashing an episode's {r['mb_per_episode']:.2f} MB alone takes "
               f"{r['hash']['ms/episode']:.2f} ms ({r['hash']['GB/s']:.1f} GB/s): "
               f"{r['hash']['share of recording'] * 100:.1f}% of recording it, "
               f"{r['hash']['share of a block read'] * 100:.1f}% of reading it in blocks (without checksums)."
               for r in summary["rows"]]
    return [f"CPU: {summary['machine'].get('cpu', '?')}. {c['episodes']} episodes of {c['steps']} steps, "
            f"{c['cameras']} x {c['image_size']}x{c['image_size']} cameras; medians of {c['rounds']} rounds; ratios: "
            "with / without, medians of the rounds' ratios.",
            Table(("images", "measure", "with", "without", "rate ratio", "CPU s ratio"), rows, title="bench_checksums"),
            "\n".join(hashing)]


def run(config: BenchChecksumsConfig) -> ExperimentResult:
    summary = measure(config)
    publish("bench_checksums", report(summary), config.docs)
    return ExperimentResult(summary)


def main(argv: list[str] | None = None) -> int:
    return harness.main(BenchChecksumsConfig(), run, "benchmarks.checksums", __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
