"""A mix of tasks on slots: `sim_rollout --family all` against one family (the same episode count, actors and slots),
rows filled per call, start-up, and steps/s over the env alone.

Each run is a `sim_rollout` in a process of its own, as a user runs it.

1. The mix against one family: `sim_rollout --family all` (every family on each of `seeds` seeds) and `--family
   <family>` on 4x the seeds (the same episode count), the same actors and slots, in paired rounds: steps/s once
   the first actor is ready (`steps_per_s_started`: start-up left out), with start-up, and the rows filled per
   batched call (every call, and the calls made while an item waited for a slot). The mix is also run with larger
   calls (`--episodes_per_call`), and by an earlier checkout (`--before`: steps/s with start-up, what it reports).
2. Start-up: a one-seed run (mostly start-up) of this checkout and of an earlier one (`--before`), in paired
   rounds: the process's wall time; this checkout's summary says where its start-up went.
3. The env alone: the mix's recorded episodes replayed (reset on the seed, the recorded actions, every step's
   observation with its images, as the run records them) on as many processes as the run had actors: its
   steps/s, against which the run's are set, with the share of the run's time the batched policy and critic
   calls took (what bounds the run's steps/s against the env alone on the same cores).
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks import harness
from benchmarks.report import Block, Table, publish, targets
from benchmarks.timing import machine
from capsule_rollout.cli.paths import resolve_input
from capsule_rollout.commands.result import ExperimentResult
from capsule_rollout.learning.options import FAMILIES
from capsule_rollout.tabletop.tasks import FAMILY_NAMES


@dataclass(frozen=True)
class BenchTasksConfig:
    policy: str = "checkpoints/policy"
    """Policy checkpoint."""
    critic: str = "checkpoints/critic"
    """Critic checkpoint."""
    family: FAMILIES = "pick_place"
    """The one family the mix is measured against."""
    n_exec: int | None = None
    """Actions per chunk executed (None: as the policy checkpoint records)."""
    actors: int = 2
    """Ray actors of each run."""
    slots: int = 4
    """Env slots per actor."""
    seeds: int = 32
    """Seeds of every family in the mix (the one-family run plays 4x as many seeds: the same episode count)."""
    rounds: int = 2
    """Paired rounds (the mix and the one family, in turn)."""
    episodes_per_call: tuple[int, ...] = (0, 64)
    """The mix's runs also measured with these `--episodes_per_call` (0: the default, 4 per slot)."""
    startup_rounds: int = 3
    """Paired rounds of a one-seed run (mostly start-up), this checkout and `--before`'s."""
    before: str = ""
    """A checkout of an earlier version (its package directory's parent) whose one-seed runs are timed beside this
    one's; empty: none."""
    out: str = "runs/bench/tasks"
    """Where the runs are written (each run's directory made afresh)."""
    docs: str = ""
    """Markdown file whose bench_tasks section is replaced by the results; empty: none."""

    def __post_init__(self) -> None:
        if min(self.actors, self.slots, self.seeds, self.rounds, self.startup_rounds) < 1:
            raise ValueError("--actors, --slots, --seeds, --rounds and --startup_rounds must be >= 1")
        if any(k < 0 for k in self.episodes_per_call):
            raise ValueError("--episodes_per_call values must be >= 0 (0: the default)")


MIX_TARGET = 0.9  # the mix's steps/s (start-up left out) at least 0.9x one family's
ROWS_TARGET = 0.9  # rows filled per call while an item waits for a slot


def _sim_rollout(config: BenchTasksConfig, out: Path, family: str, seeds: int, *, per_call: int = 0,
                 checkout: str = "") -> dict:
    """One `sim_rollout` run in a process of its own: its summary, and the process's wall time (`process_s`)."""
    shutil.rmtree(out, ignore_errors=True)
    summary = out.with_suffix(".json")
    cmd = [sys.executable, "-m", "capsule_rollout", "sim_rollout", "--actors", str(config.actors), "--slots",
           str(config.slots), "--family", family, "--seeds.count", str(seeds), "--model.policy", config.policy,
           "--model.critic", config.critic, "--out", str(out), "--no-progress", "--no-video", "--json", str(summary)]
    if per_call:
        cmd += ["--episodes_per_call", str(per_call)]
    if config.n_exec is not None:
        cmd += ["--act.n_exec", str(config.n_exec)]
    env = dict(os.environ)
    if checkout:
        env["PYTHONPATH"] = os.pathsep.join([checkout, *filter(None, [env.get("PYTHONPATH")])])
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=checkout or None, capture_output=True, text=True)
    process_s = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    data = json.loads(summary.read_text())
    data["process_s"] = process_s
    return data


def _replay(job: tuple[str, list[tuple[str, int, np.ndarray]]]) -> int:
    """Replay episodes (task, seed, actions) on the env alone: steps played."""
    from capsule_rollout.envs.suites import make_env

    envs: dict = {}
    steps = 0
    for task, seed, actions in job[1]:
        env = envs.get(task)
        if env is None:
            env = envs[task] = make_env(f"tabletop:{task}", cameras=None, image_size=int(job[0]))
        env.reset(seed=seed)
        for action in actions:
            env.step(action)
            steps += 1
    for env in envs.values():
        env.close()
    return steps


def env_alone(store: Path, processes: int, image_size: int) -> dict:
    """The run's episodes replayed on the env alone over `processes` processes (dealt in turn): steps/s."""
    from capsule_rollout.stores.sharded_reader import open_episode_reader

    reader = open_episode_reader(store)
    episodes = [reader.episode(i) for i in range(len(reader))]
    played = [(e.meta.task, int(e.meta.seed), np.asarray(e.steps["action"])) for e in episodes]
    jobs = [(str(image_size), played[p::processes]) for p in range(processes)]
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        pool.map(_replay, [(j[0], j[1][:1]) for j in jobs])  # the processes up and the scenes made once
        t0 = time.perf_counter()
        steps = sum(pool.map(_replay, jobs))
        wall = time.perf_counter() - t0
    return {"episodes": len(played), "steps": steps, "steps_per_s": steps / wall, "processes": processes}


def _phases(runs: list[dict]) -> dict:
    """Medians of a one-seed run's start-up phases (its summary's `startup`, seconds from the command's start), and
    `after_episodes_s`: from its episodes back to the process's end (the plot, the table, Ray's shutdown, exit)."""
    out = {k: float(np.median([r["startup"][k] for r in runs])) for k in runs[0]["startup"]}
    out["after_episodes_s"] = float(np.median([r["process_s"] - r["startup"]["before_command_s"]
                                               - r["startup"]["to_first_episode_s"] for r in runs]))
    return out


def _median(runs: list[dict], key: str) -> float:
    return float(np.median([r[key] for r in runs]))


def measure(config: BenchTasksConfig, progress: Callable[[str], object] = print) -> dict:
    out = Path(config.out).resolve()  # the earlier checkout's runs start in its own directory
    out.mkdir(parents=True, exist_ok=True)
    mixes: dict[int, list[dict]] = {k: [] for k in config.episodes_per_call}
    one: list[dict] = []
    mix_before: list[dict] = []
    for r in range(config.rounds):
        for k in config.episodes_per_call:
            progress(f"round {r + 1}: the mix, episodes per call {k or 'default'} ...")
            mixes[k].append(_sim_rollout(config, out / f"mix-{k}", "all", config.seeds, per_call=k))
        progress(f"round {r + 1}: {config.family} alone ...")
        one.append(_sim_rollout(config, out / "one", config.family, config.seeds * len(FAMILY_NAMES)))
        if config.before:
            progress(f"round {r + 1}: the mix, the earlier checkout ...")
            mix_before.append(_sim_rollout(config, out / "mix-before", "all", config.seeds, checkout=config.before))
    default = config.episodes_per_call[0]
    progress("the env alone ...")
    alone = env_alone(out / f"mix-{default}" / "episodes.zarr", config.actors, 64)
    one_alone = env_alone(out / "one" / "episodes.zarr", config.actors, 64)
    tasks_cost = alone["steps_per_s"] / one_alone["steps_per_s"]  # the mix's tasks against the one family's
    rows, cores = [], len(os.sched_getaffinity(0))
    for k, runs in mixes.items():
        share = float(np.median([_models_share(m, config.actors) for m in runs]))
        rows.append({"episodes_per_call": k, "steps_per_s_started": _median(runs, "steps_per_s_started"),
                     "steps_per_s": _median(runs, "steps_per_s"),
                     "over_one_family": float(np.median([m["steps_per_s_started"] / o["steps_per_s_started"]
                                                         for m, o in zip(runs, one, strict=True)])),
                     # the same, each run over its episodes' env alone: what the layout costs, the tasks aside
                     "over_one_family_per_env": float(np.median([
                         m["steps_per_s_started"] / o["steps_per_s_started"] for m, o in zip(runs, one, strict=True)]))
                     / tasks_cost,
                     "rows_filled": _median([m["rows"] for m in runs], "rows_filled"),
                     "rows_filled_with_work_left": _median([m["rows"] for m in runs], "rows_filled_with_work_left"),
                     "over_env_alone": _median(runs, "steps_per_s_started") / alone["steps_per_s"],
                     "models_share": share, "limit_over_env_alone": 1.0 - share,
                     "driver_share": float(np.median([m["driver_cpu_s"] / (cores * m["wall_s"]) for m in runs])),
                     "ms_per_step": _parts(runs),
                     # each actor's ms per step once started, and the env alone's (the same cores, replayed)
                     "core_ms_per_step": config.actors * 1e3 / _median(runs, "steps_per_s_started"),
                     "env_alone_ms_per_step": _process_ms(alone)})
    startup: dict = {"rounds": config.startup_rounds, "now": []}
    if config.before:
        startup["before"] = []
    for r in range(config.startup_rounds):
        progress(f"start-up round {r + 1} ...")
        startup["now"].append(_sim_rollout(config, out / "start-now", config.family, 1))
        if config.before:
            startup["before"].append(_sim_rollout(config, out / "start-before", config.family, 1,
                                                  checkout=config.before))
    start = {"now_process_s": _median(startup["now"], "process_s"), "now_phases": _phases(startup["now"])}
    if config.before:
        start["before_process_s"] = _median(startup["before"], "process_s")
        start["before_phases"] = _phases(startup["before"])
        start["before_over_now"] = float(np.median([b["process_s"] / n["process_s"] for b, n in
                                                    zip(startup["before"], startup["now"], strict=True)]))
    return {"machine": machine(), "cores": len(os.sched_getaffinity(0)), "actors": config.actors,
            "slots": config.slots, "family": config.family, "seeds_per_family": config.seeds,
            "episodes": config.seeds * len(FAMILY_NAMES), "rounds": config.rounds,
            "one_family": {"steps_per_s_started": _median(one, "steps_per_s_started"),
                           "steps_per_s": _median(one, "steps_per_s"),
                           "rows_filled": _median([o["rows"] for o in one], "rows_filled"),
                           "rows_filled_with_work_left": _median([o["rows"] for o in one],
                                                                 "rows_filled_with_work_left")},
            "mix": rows, "env_alone": alone, "env_alone_one_family": one_alone, "startup": start,
            "mix_before": {"steps_per_s": _median(mix_before, "steps_per_s"),
                           "process_s": _median(mix_before, "process_s"),
                           "ms_per_step": _parts(mix_before),
                           "steps_per_s_started": _median(mix_before, "steps_per_s_started"),
                           "now_over_before": float(np.median([m["steps_per_s"] / b["steps_per_s"] for m, b in
                                                               zip(mixes[default], mix_before, strict=True)]))}
            if mix_before else None,
            "targets": {"mix_ge_0_9x": rows[0]["over_one_family"] >= MIX_TARGET,
                        "rows_ge_90pct": rows[0]["rows_filled_with_work_left"] >= ROWS_TARGET}}


PARTS_SHOWN = ("env_step", "models", "host_loop", "record_step", "cold_reset", "capsule", "restore", "build",
               "capsule_save", "shard_write", "actors_other", "driver_record")
"""The parts of a run's `time_by_part` the table shows, in its order."""


def _parts(runs: list[dict]) -> dict[str, float] | None:
    """The median over runs of each part's ms per control step (`time_by_part`); None: runs that do not say."""
    said = [r["time_by_part"]["ms_per_step"] for r in runs if r.get("time_by_part", {}).get("steps")]
    if not said:
        return None
    return {k: float(np.median([p.get(k) or 0.0 for p in said])) for k in PARTS_SHOWN}


def _process_ms(alone: dict) -> float:
    """The env alone's ms of a process per step (its processes each on a core)."""
    return alone["processes"] * 1e3 / alone["steps_per_s"]


def _models_share(summary: dict, actors: int) -> float:
    """The share of the actors' cores the batched policy and critic calls took, from the first actor ready to the
    last episode back (each actor on a core of its own)."""
    steps = summary["steps_per_s"] * summary["wall_s"]
    started_s = steps / summary["steps_per_s_started"]
    return summary["rows"]["call_s"] / (actors * started_s)


def report(summary: dict) -> list[Block]:
    m = summary["machine"]
    return [f"Device: **cpu** ({m.get('cpu', '?')}, {summary['cores']} cores), torch {m.get('torch', '?')}; each run "
            f"a `sim_rollout` process, {summary['actors']} actors x {summary['slots']} slots, the shipped policy and "
            f"critic; {summary['rounds']} paired rounds, medians.",
            Table(("measure", "value", "target"), _rows(summary),
                  title=f"bench_tasks ({summary['actors']} actors x {summary['slots']} slots)"),
            targets(summary["targets"])]


def _rows(s: dict) -> list[tuple[str, str, str]]:
    one, n = s["one_family"], s["episodes"]
    rows = [(f"{s['family']} alone, {n} episodes: steps/s once started / with start-up",
             f"{one['steps_per_s_started']:.0f} / {one['steps_per_s']:.0f}", ""),
            (f"{s['family']} alone: rows filled per call, all / while an item waited",
             f"{one['rows_filled']:.0%} / {one['rows_filled_with_work_left']:.0%}", "")]
    for m in s["mix"]:
        calls = f"episodes per call {m['episodes_per_call']}" if m["episodes_per_call"] else "default calls"
        rows += [(f"--family all, {n} episodes ({calls}): steps/s once started / with start-up",
                  f"{m['steps_per_s_started']:.0f} / {m['steps_per_s']:.0f}", ""),
                 (f"--family all ({calls}) / {s['family']} alone, once started", f"{m['over_one_family']:.3f}x",
                  "≥ 0.9x" if m is s["mix"][0] else ""),
                 (f"--family all ({calls}) / {s['family']} alone, once started, each over its episodes' env alone "
                  "(the layout's cost, the tasks' own cost aside)", f"{m['over_one_family_per_env']:.3f}x", ""),
                 (f"--family all ({calls}): rows filled per call, all / while an item waited",
                  f"{m['rows_filled']:.0%} / {m['rows_filled_with_work_left']:.0%}",
                  "≥ 90% while an item waited" if m is s["mix"][0] else ""),
                 (f"--family all ({calls}): steps/s over the env alone (once started); the limit the models' share "
                  f"of a core ({m['models_share']:.0%}) sets",
                  f"{m['over_env_alone']:.2f} / {m['limit_over_env_alone']:.2f}", ""),
                 (f"--family all ({calls}): the driver's CPU (recording, Ray's calls) over the cores' time",
                  f"{m['driver_share']:.0%}", "")]
        if m.get("ms_per_step"):
            p = m["ms_per_step"]
            rows.append((f"--family all ({calls}): an actor's ms per step once started ({m['core_ms_per_step']:.2f}; "
                         f"the env alone {m['env_alone_ms_per_step']:.2f}): env step / models / loop (of it, "
                         "recording) / cold resets (of them, capsules made) / restores / hosts built / capsules saved / "
                         "shard writes / not stamped; the driver's recording",
                         " / ".join(f"{p[k]:.3f}" for k in PARTS_SHOWN[:-1]) + f"; {p['driver_record']:.3f}", ""))
    if s.get("mix_before"):
        b, now = s["mix_before"], s["mix"][0]
        rows.append((f"--family all, {n} episodes, with start-up: now / the earlier checkout",
                     f"{now['steps_per_s']:.0f} / {b['steps_per_s']:.0f} steps/s ({b['now_over_before']:.2f}x)", ""))
        if b.get("ms_per_step"):
            p = b["ms_per_step"]
            rows.append(("--family all, the earlier checkout: an actor's ms per step once started, the parts as above",
                         " / ".join(f"{p[k]:.3f}" for k in PARTS_SHOWN[:-1]) + f"; {p['driver_record']:.3f}", ""))
    a = s["env_alone"]
    o = s["env_alone_one_family"]
    rows.append((f"the env alone: the mix's {a['episodes']} episodes / {s['family']}'s {o['episodes']} replayed on "
                 f"{a['processes']} processes, images every step",
                 f"{a['steps_per_s']:.0f} / {o['steps_per_s']:.0f} steps/s", ""))
    st = s["startup"]
    rows.append(("one-seed run, process wall time: now" + (" / before" if "before_process_s" in st else ""),
                 f"{st['now_process_s']:.1f} s" + (f" / {st['before_process_s']:.1f} s ({st['before_over_now']:.2f}x)"
                                                   if "before_process_s" in st else ""), ""))
    for tree in ("now", "before") if "before_phases" in st else ("now",):
        ph = st[f"{tree}_phases"]
        rows.append((f"one-seed run {tree}, medians: before the command / inputs checked and preflight / Ray's "
                     "start / to the first actor ready / its episodes back (from the command's start) / after them "
                     "(plot, table, Ray's shutdown, exit)",
                     f"{ph['before_command_s']:.1f} / {ph['preflight_s']:.1f} / {ph['ray_s']:.1f} / "
                     f"{ph['to_actors_ready_s']:.1f} / {ph['to_first_episode_s']:.1f} / "
                     f"{ph['after_episodes_s']:.1f} s", ""))
    return rows


def run(config: BenchTasksConfig) -> ExperimentResult:
    config = dataclasses.replace(config, policy=resolve_input(config.policy), critic=resolve_input(config.critic))
    summary = measure(config)
    publish("bench_tasks", report(summary), config.docs)
    return ExperimentResult(summary)


def main(argv: list[str] | None = None) -> int:
    return harness.main(BenchTasksConfig(), run, "benchmarks.tasks", __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
