"""Recording throughput with synthetic actors: single writer vs sharded, 1-8 actors.

What recording costs the driver. Each actor is a `RolloutActor` whose host returns one pre-built episode (renamed
per work item) at once, so nothing but recording limits the rate: the driver, its store and Ray's transfers. Each
measurement runs `run_rollouts` (the driver `sim_rollout` uses) over `--episodes` items on N actors, with the
single-writer store (every episode travels to the driver, which writes it) and with a sharded one (each actor
writes its own shard; the driver commits a manifest entry), each at every `--episodes_per_call` (one Ray call hands
an actor that many items; sharded, the actor commits them to its shard at once and the driver their manifest
entries in one append). Figures are taken from the first returned episode to the store's close (actor start-up left
out): recorded control steps/s, the driver process's CPU seconds per episode (`time.process_time`: every thread of
the driver, Ray's included, and the single writer's thread), and the bytes of episode arrays that reach the driver.
Images are random bytes (incompressible: the writer's worst case).
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
from capsule_rollout.rollout.host_config import EpisodeResult
from capsule_rollout.rollout.host_factory import RunSpec
from capsule_rollout.rollout.ray_rollout import init_ray, run_rollouts, shutdown_ray
from capsule_rollout.rollout.rollout_actor import RolloutActor, WorkItem
from capsule_rollout.stores.episode import Episode, EpisodeBuilder
from capsule_rollout.stores.sharded_reader import open_episode_reader
from capsule_rollout.stores.sharded_store import ShardedStore
from capsule_rollout.stores.zarr_recorder import ZarrRecorder


@dataclass(frozen=True)
class BenchRecordingConfig:
    actors: tuple[int, ...] = (1, 2, 4, 8)
    """Synthetic actor counts measured (each with the single-writer store and with a sharded one)."""
    episodes: int = 200
    """Episodes recorded per measurement."""
    rounds: int = 3
    """Rounds; each measures every (actors, store) pair once, the two stores back to back (which goes first
    alternates by round). Figures are medians over rounds; the CPU ratio is the median of the rounds' ratios."""
    steps: int = 80
    """Control steps per synthetic episode."""
    image_size: int = 64
    """Camera image side, in pixels."""
    cameras: int = 1
    """Cameras per step."""
    cpus_per_actor: float = 0.25
    """Ray CPU resources per synthetic actor (8 actors at 0.25 fit a 2-core machine)."""
    episodes_per_call: tuple[int, ...] = (1, 8)
    """Episodes per Ray call measured (`run_rollouts(episodes_per_call=...)`; sharded, an actor commits a call's
    episodes to its shard at once), each with both stores."""
    out: str = ""
    """Directory the measured stores are written to (each removed after its measurement); empty: a temp directory."""
    docs: str = ""
    """Markdown file whose bench_recording section is replaced by the results; empty: none."""

    def __post_init__(self) -> None:
        if not self.actors or min(self.actors) < 1:
            raise ValueError(f"--actors must be counts >= 1, got {list(self.actors)}")
        if self.episodes < 2 or self.steps < 1 or self.image_size < 1 or self.cameras < 0 or self.rounds < 1:
            raise ValueError("--episodes must be >= 2, --steps, --image_size and --rounds >= 1, --cameras >= 0")
        if not self.cpus_per_actor > 0:
            raise ValueError(f"--cpus_per_actor must be > 0, got {self.cpus_per_actor}")
        if not self.episodes_per_call or min(self.episodes_per_call) < 1:
            raise ValueError(f"--episodes_per_call must be counts >= 1, got {list(self.episodes_per_call)}")


MODES = ("single", "sharded")


def synthetic_episode(steps: int, image_size: int, cameras: int, seed: int = 0) -> Episode:
    """A valid episode of `steps` steps: random images and actions, state, rewards (success at the end)."""
    rng = np.random.default_rng(seed)
    builder = EpisodeBuilder()
    for t in range(steps):
        builder.add(images={f"cam{c}": rng.integers(0, 256, (image_size, image_size, 3), np.uint8)
                            for c in range(cameras)},
                    state=rng.normal(size=8).astype(np.float32), action=rng.uniform(-1, 1, 4).astype(np.float32),
                    reward=0.0 if t == steps - 1 else -1.0, policy_action=rng.uniform(-1, 1, 4),
                    value=float(-1 + t / steps), subtask_id=0, timestamp=1.7e9 + t * 0.1)
    return builder.finish(episode_id="synthetic", seed=seed, task="synthetic", instruction="record me",
                          success=True, stop_reason="success")


class PrebuiltHost:
    """A host whose every episode is one pre-built episode, renamed: no simulation, no inference."""

    def __init__(self, episode: Episode) -> None:
        self.episode, self.capsule_source = episode, None
        self.step_limit = episode.meta.length  # what the driver derives its deadlines from

    def run_episode(self, seed: int, *, episode_id: str | None = None, attempt: int = 0,
                    repeat: int = 0) -> EpisodeResult:
        meta = dataclasses.replace(self.episode.meta, episode_id=episode_id or f"s{seed}", seed=seed,
                                   attempt=attempt, repeat=repeat)
        return EpisodeResult(Episode(self.episode.steps, meta), "prebuilt", 0.0, 0.0, 0.0)

    def close(self) -> None:
        pass


def synthetic_actor(steps: int, image_size: int, cameras: int) -> type[RolloutActor]:
    """A `RolloutActor` class whose host returns a pre-built episode of this size."""

    class SyntheticActor(RolloutActor):
        def __init__(self, spec: RunSpec, index: int = 0, *, host=None, observers=None, shard_root: str = "",
                     capsule_key: bytes | None = None):
            episode = synthetic_episode(steps, image_size, cameras, seed=index)
            super().__init__(spec, index, host=PrebuiltHost(episode), shard_root=shard_root, capsule_key=capsule_key)

    return SyntheticActor


def measure_store(config: BenchRecordingConfig, mode: str, actors: int, directory: Path, per_call: int = 1) -> dict:
    """One measurement: `config.episodes` synthetic episodes on `actors` actors into a `mode` store, `per_call`
    episodes per Ray call: steps/s, the driver's CPU seconds and MB per episode, episodes recorded."""
    root = directory / f"{mode}-{actors}-{per_call}.zarr"
    recorder = ShardedStore(root) if mode == "sharded" else ZarrRecorder(root)
    items = [WorkItem(f"bench-{i:06d}", i) for i in range(config.episodes)]
    first: dict[str, float] = {}
    after = {"steps": 0, "bytes": 0, "episodes": 0}

    def on_report(report, stats) -> None:
        if not first:  # the clock starts at the first episode back: actor start-up left out
            first.update(wall=time.perf_counter(), cpu=time.process_time())
            return
        after["steps"] += report.episode.meta.length
        after["bytes"] += sum(v.nbytes for v in report.episode.steps.values())
        after["episodes"] += 1

    try:
        run_rollouts(RunSpec(), items, actors=actors, recorder=recorder, cpus_per_actor=config.cpus_per_actor,
                     on_report=on_report, actor_cls=synthetic_actor(config.steps, config.image_size, config.cameras),
                     episodes_per_call=per_call)
    finally:
        recorder.close()  # the single writer's last batch is committed inside the measurement
    wall, cpu = time.perf_counter() - first["wall"], time.process_time() - first["cpu"]
    recorded = len(open_episode_reader(root))
    shutil.rmtree(root)
    n = max(after["episodes"], 1)
    return {"mode": mode, "actors": actors, "per_call": per_call, "episodes": config.episodes, "recorded": recorded,
            "steps_per_s": after["steps"] / wall if wall > 0 else 0.0, "driver_cpu_s_per_episode": cpu / n,
            "driver_mb_per_episode": after["bytes"] / n / 1e6, "wall_s": wall}


def measure(config: BenchRecordingConfig) -> dict:
    """Every (actors, episodes per call) pair with both stores, `config.rounds` times (which store goes first
    alternates by round) on a Ray started here: the medians per row, the driver-CPU ratios, every measurement and
    the machine."""
    directory = Path(config.out) if config.out else Path(tempfile.mkdtemp(prefix="bench_recording-"))
    directory.mkdir(parents=True, exist_ok=True)
    where = init_ray()
    try:
        measured = [measure_store(config, mode, n, directory, k)
                    for r in range(config.rounds) for n in config.actors for k in config.episodes_per_call
                    for mode in (MODES if r % 2 == 0 else MODES[::-1])]
    finally:
        shutdown_ray(where)
        if not config.out:
            shutil.rmtree(directory, ignore_errors=True)
    rows, ratios = summarize(measured, config.actors, config.episodes_per_call)
    return {"machine": machine(), "config": dataclasses.asdict(config), "rows": rows, "driver_cpu_ratios": ratios,
            "measurements": measured}


def summarize(measured: list[dict], actors: tuple[int, ...],
              per_calls: tuple[int, ...] = (1,)) -> tuple[list[dict], list[dict]]:
    """Median rows per (store, actors, episodes per call) over rounds, and per (actors, episodes per call) the
    median of the rounds' single / sharded driver-CPU ratios (each round's pair measured back to back): at the
    same episodes per call (`same_call`), and against the single writer at one episode per call, the default
    (`vs_default_single`)."""
    rows, ratios = [], []

    def pick(mode, n, k):
        return [m for m in measured if m["mode"] == mode and m["actors"] == n and m["per_call"] == k]

    def paired(a_runs, b_runs):
        return float(np.median([a["driver_cpu_s_per_episode"] / max(b["driver_cpu_s_per_episode"], 1e-9)
                                for a, b in zip(a_runs, b_runs, strict=True)]))

    for n in actors:
        for k in per_calls:
            for mode in MODES:
                ms = pick(mode, n, k)
                rows.append({"mode": mode, "actors": n, "per_call": k, "episodes": ms[0]["episodes"],
                             "recorded": min(m["recorded"] for m in ms), "rounds": len(ms),
                             **{key: float(np.median([m[key] for m in ms])) for key in
                                ("steps_per_s", "driver_cpu_s_per_episode", "driver_mb_per_episode", "wall_s")}})
            ratios.append({"actors": n, "per_call": k, "same_call": paired(pick("single", n, k), pick("sharded", n, k)),
                           "vs_default_single": paired(pick("single", n, per_calls[0]), pick("sharded", n, k))})
    return rows, ratios


def report(summary: dict) -> list[Block]:
    c, m = summary["config"], summary["machine"]
    rows = [(str(r["actors"]), str(r["per_call"]), r["mode"], f"{r['recorded']}/{r['episodes']}",
             f"{r['steps_per_s']:.0f}", f"{r['driver_cpu_s_per_episode'] * 1e3:.2f}", f"{r['driver_mb_per_episode']:.3f}")
            for r in summary["rows"]]
    return [f"CPU: {m.get('cpu', '?')}. Synthetic actors ({c['steps']} steps of {c['cameras']} x {c['image_size']}x"
            f"{c['image_size']} random images an episode), from the first episode back to the store's close; medians "
            f"of {c['rounds']} rounds.",
            Table(("actors", "episodes / call", "store", "recorded", "steps/s", "driver CPU ms / episode",
                   "MB / episode via driver"), rows, title="bench_recording"),
            "Driver CPU per episode, single / sharded (the same episodes per call; against the single writer at the "
            "first episodes-per-call value): " + ", ".join(
                f"{r['actors']} actors x {r['per_call']}: {r['same_call']:.1f}x ({r['vs_default_single']:.1f}x)"
                for r in summary["driver_cpu_ratios"]) + "."]


def run(config: BenchRecordingConfig) -> ExperimentResult:
    summary = measure(config)
    publish("bench_recording", report(summary), config.docs)
    return ExperimentResult(summary)


def main(argv: list[str] | None = None) -> int:
    return harness.main(BenchRecordingConfig(), run, "benchmarks.recording", __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
