"""sim_rollout: the policy and critic on N Ray actors, every episode recorded once to zarr.

Writes, under `--out` (a path or a file:// URL): `episodes.zarr` (the episodes: one zarr store
written by the driver, or with `--shards true` a sharded store root, each actor writing its own
shard and the driver a manifest entry per episode), `capsules/` (each seed's initial capsule, for
`replay`), `rollout.json` (the host spec), `rollout.png` (success rate and value curves) and
`episode.gif` (one episode).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
from rich.table import Table
from tqdm import tqdm

from capsule_rollout.cli.console import make_console, process_age_s, startup_rows
from capsule_rollout.cli.paths import resolve_input
from capsule_rollout.commands.configs import SimRolloutConfig
from capsule_rollout.commands.result import ExperimentResult, checking_inputs
from capsule_rollout.input_bounds import check_output_dir, check_run
from capsule_rollout.learning.options import SHIPPED_CRITIC, SHIPPED_POLICY
from capsule_rollout.policies.conditioning import Conditioning
from capsule_rollout.rollout.deadlines import DeadlineSettings
from capsule_rollout.rollout.host_factory import ANY_TASK, RunSpec
from capsule_rollout.rollout.ray_rollout import RayStart, run_rollouts, summarize_run
from capsule_rollout.rollout.record import OpenedRun, episode_id_of, open_run, run_spec
from capsule_rollout.rollout.rollout_actor import WorkItem
from capsule_rollout.rollout.slots.check import check_slots, require_slots
from capsule_rollout.rollout.slots.host import instances_by_actor
from capsule_rollout.stores import episode_schema as S
from capsule_rollout.stores.sharded_reader import open_episode_reader
from capsule_rollout.stores.sharded_store import ShardedStore, parse_store_root
from capsule_rollout.tabletop.tasks import FAMILY_NAMES

ALL = "all"  # --family all: every tabletop family on each seed


def spec_from_config(config: SimRolloutConfig, out: Path) -> RunSpec:
    if config.env and config.model.policy == SHIPPED_POLICY:
        raise ValueError(f"--env {config.env}: give its policy (--policy: a checkpoint or `package.module:make_policy`); "
                         "the shipped policy acts in the tabletop only")
    critic = "" if config.env and config.model.critic == SHIPPED_CRITIC else config.model.critic  # tabletop's only
    return run_spec(  # what record_rollouts builds from the same options
        out, env=config.env or f"tabletop:{ANY_TASK if config.family == ALL else config.family}",
        policy=resolve_input(config.model.policy), critic=resolve_input(critic) if critic else "",
        n_exec=config.act.n_exec, noise_scale=config.act.noise_scale, advantage=config.act.advantage,
        beta=config.act.beta, max_steps=config.max_steps, value_threshold=config.value_threshold,
        value_patience=config.value_patience, cameras=config.cameras, image_size=config.image_size,
        observers=config.observers, lanes=config.lanes, gpus_per_actor=config.gpus_per_actor,
        cpus_per_actor=config.cpus_per_actor, pin_cores=config.pin_cores, pin_seeds=config.pin_seeds,
        capsule_budget_mb=config.capsule_budget_mb, slots=config.slots, env_threads=config.env_threads,
        batch_invariant=config.batch_invariant)


def _items(config: SimRolloutConfig, legacy: bool) -> list[WorkItem]:
    """The run's items; `legacy`: named as a run recorded before ids were made file-system-safe (resumed)."""
    task = config.env or config.family
    if task == ALL:  # a mix: every family on each seed, interleaved (the spec: `tabletop:*`)
        return [WorkItem(episode_id_of(f, s), s, task=f) for s in config.seeds.range for f in FAMILY_NAMES]
    return [WorkItem(episode_id_of(task, s, legacy=legacy), s) for s in config.seeds.range]


def _open_run(config: SimRolloutConfig) -> tuple[Path, OpenedRun, Conditioning]:
    """Check the inputs, run the preflight (`rollout.preflight`) and open the run's output."""
    with checking_inputs():
        out = parse_store_root(config.out)
        check_output_dir(out)
        if config.check_slots:
            require_slots(config.slots)
        counts = f" x --repeats {config.repeats}" * (config.repeats > 1) + f" x --attempts {config.attempts}" * (
            config.attempts > 1) + " x 4 families" * (config.episodes_at_most > config.seeds.count * config.repeats
                                                        * config.attempts)
        check_run(config.episodes_at_most, f"--seeds.count (--episodes){counts}",
                  config.actors, config.slots, config.cpus_per_actor)
        spec = spec_from_config(config, out)
        if config.attempts > 1 and spec.noise_scale == 0:
            raise ValueError("--attempts: at noise scale 0 every retry plays the failed episode again; pass "
                             "--act.noise_scale > 0 (e.g. 1) to retry with fresh noise")
        conditioning = spec.conditioning()
        first = WorkItem("", config.seeds.first, task=FAMILY_NAMES[0] if (config.env or config.family) == ALL else "")
        opened = open_run(out, spec, config.shards, first=first, n_exec_given=config.act.n_exec is not None)
    return out, opened, conditioning


def run(config: SimRolloutConfig) -> ExperimentResult:
    console = make_console()
    began = time.monotonic()
    since_process = process_age_s()  # what imports and the command line took before this
    task = config.env or config.family
    # the inputs checked (their sizes too) and the preflight passed before anything is started: a mistake is one
    # line before any actor starts
    out, opened, conditioning = _open_run(config)
    prepared = time.monotonic()
    items = _items(config, opened.legacy_ids)
    spec, store, done, recorder = opened.spec, opened.store, opened.done, opened.recorder
    for warning in opened.checked.warnings:
        console.print(f"[yellow]warning[/yellow]: {warning}", markup=True, highlight=False, soft_wrap=True)
    slot_check = None
    if config.check_slots:  # before Ray: one item at 1 slot and in the last of N, in this process
        first = items[0]
        slot_check = check_slots(spec, spec.slots, seed=first.seed, task=first.task)
        console.print(slot_check.line(), highlight=False, soft_wrap=True)
    if done:
        console.print(f"{len(done)} episodes are already in {store}; running the rest")
    # Ray on a thread of its own: it shuts down there while this thread writes the plot and the table
    starting = [RayStart()] if config.actors else []
    try:
        where = starting[0].wait() if starting else "in-process"
    except BaseException:
        recorder.close()
        raise
    ray_up = time.monotonic()
    bar = tqdm(total=len(items) * config.repeats, desc=f"sim_rollout {task}", unit="ep",
               disable=not config.progress)
    steps_total = [0]
    first_report: list[float] = []
    t0, cpu0 = time.perf_counter(), time.process_time()

    def on_report(report, stats) -> None:
        if not first_report:
            first_report.append(time.monotonic())
        if report.episode is not None:
            steps_total[0] += report.episode.meta.length
        elapsed = time.perf_counter() - t0
        if report.item is None or report.item.attempt == 0:
            bar.update(1)
        bar.set_postfix(success=f"{stats.successes}/{stats.episodes}", hz=f"{steps_total[0] / elapsed:.0f}")

    try:
        reports, stats = run_rollouts(spec, items, actors=config.actors, recorder=recorder,
                                      cpus_per_actor=config.cpus_per_actor, gpus_per_actor=config.gpus_per_actor,
                                      max_restarts=config.max_restarts, repeats=config.repeats,
                                      attempts=config.attempts, episode_timeout_s=config.episode_timeout_s,
                                      done=done, on_report=on_report, episodes_per_call=config.episodes_per_call,
                                      deadlines=DeadlineSettings(floor_s=config.deadline_floor_s,
                                                                 first_call_s=config.first_call_s))
        ended, driver_cpu = time.monotonic(), time.process_time() - cpu0
        orphans = len(recorder.orphans()) if isinstance(recorder, ShardedStore) else 0  # ignored by readers
    finally:
        bar.close()
        recorder.close()
        if starting:
            starting[0].stop(wait=False)
    try:  # Ray shuts down on its thread meanwhile
        startup = {"before_command_s": since_process, "preflight_s": prepared - began,
                   "ray_s": starting[0].seconds if starting else 0.0, "to_ray_up_s": ray_up - began,
                   "to_actors_ready_s": None if stats.ready_at is None else stats.ready_at - began,
                   "to_first_episode_s": first_report[0] - began if first_report else None}
        wall = time.perf_counter() - t0
        episodes = [r.episode for r in reports if r.episode is not None]
        summary = {**summarize_run(reports, stats), "advantage": conditioning.advantage, "beta": conditioning.beta,
                   "n_exec": spec.host.n_exec, "noise_scale": spec.noise_scale,
                   "steps_per_s": steps_total[0] / wall if wall > 0 else 0.0, "actors": config.actors,
                   "slots": spec.slots, "wall_s": wall, "startup": startup,
               "driver_cpu_s": driver_cpu,  # this process's CPU while the actors played (recording, Ray's calls)
                   # from the first actor ready to the last episode back: the rate once started
                   "steps_per_s_started": steps_total[0] / (ended - stats.ready_at)
                   if stats.ready_at is not None and ended > stats.ready_at else None,
                   "store": str(store), "sharded": config.shards, "orphans": orphans, "ray": where,
                   "instances_by_actor": instances_by_actor(reports),
                   "slot_check": None if slot_check is None else slot_check.summary()}
        if episodes:
            summary["plot"] = str(_plot(episodes, out / "rollout.png"))
            if config.video:
                summary["video"] = str(_video(episodes, out / "episode.gif", store))
        _table(console, summary)
        lost = [r for r in reports if r.episode is None]  # played nothing that could be recorded (each says why)
        errored = [r for r in reports if r.errored]  # lost, or recorded with stop reason `error`
        if stats.gave_up:
            console.print(f"[red]gave up[/red]: {stats.gave_up}; {len(lost)} of {len(reports)} episodes lost (each "
                          "with its reason in --json; a resumed run plays them)", markup=True, highlight=False,
                          soft_wrap=True)
            if stats.gave_up_traceback:
                console.print(stats.gave_up_traceback, markup=False, highlight=False, soft_wrap=True)
        elif errored:
            first = summary["first_error"]
            console.print(f"[red]{len(errored)} of {len(reports)} episodes ended in errors[/red] ({len(lost)} lost, "
                          f"{len(errored) - len(lost)} recorded with stop reason error); the first "
                          f"({first['episode_id']}): {first['error']}", markup=True, highlight=False, soft_wrap=True)
            if first["traceback"]:
                console.print(first["traceback"], markup=False, highlight=False, soft_wrap=True)
        return ExperimentResult(summary, exit_code=1 if errored or stats.gave_up else 0)
    finally:
        if starting:
            starting[0].stop()


def _table(console, s: dict) -> None:
    table = Table(title="sim_rollout")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("episodes", s["episodes"]),
        ("policy acts: actions per chunk, noise scale", f"{s['n_exec']}, {s['noise_scale']:g}"),
        ("success rate", f"{s['success_rate']:.0%} ({s['successes']}/{s['episodes']})"),
        *((f"  {task}", f"{f['success_rate']:.0%} ({f['successes']}/{f['episodes']})")
          for task, f in s["by_task"].items() if len(s["by_task"]) > 1),
        ("stop reasons", ", ".join(f"{k} {v}" for k, v in sorted(s["stop_reasons"].items()))),
        ("reset (median)", f"{s['reset_ms_median']:.2f} ms" if s["reset_ms_median"] is not None else "-"),
        ("resets by kind", ", ".join(f"{k} {v}" for k, v in sorted(s["reset_kinds"].items()))),
        *((f"  actor {a}", ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
          for a, kinds in s["reset_kinds_by_actor"].items()),
        ("steps/s, all actors (wall, incl. start-up)", f"{s['steps_per_s']:.0f}"),
        ("env slots per actor (episodes side by side, batched policy and critic)", s["slots"]),
        *((f"  actor {a}: policy / critic instances", f"{n['policy']} / {n['critic']}")
          for a, n in s["instances_by_actor"].items()),
        *((("rows filled per batched call, all calls / while an item waited for a slot",
            f"{r['rows_filled']:.0%} / {r['rows_filled_with_work_left']:.0%} ({r['calls']} calls)"),)
          if (r := s["rows"]) else ()),
        *startup_rows(s["startup"]),
        ("control Hz per " + ("slot" if s["slots"] > 1 else "actor") + " (median episode)",
         f"{s['control_hz_per_actor_median']:.0f}"
         if s["control_hz_per_actor_median"] is not None else "-"),
        ("Ray nodes that played episodes", len(s["episodes_by_node"]) or "-"),
        ("actors / failures / timeouts / re-run / lost",
         f"{s['actors']} / {s['actor_failures']} / {s['timeouts']} / {s['resubmitted']} / {s['lost']}"),
        ("store", s["store"]),
    ]
    for name, value in rows:
        table.add_row(name, str(value))
    console.print(table)


def _plot(episodes, path: Path) -> Path:
    os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    tasks = sorted({e.meta.task for e in episodes})
    for task in tasks:  # one curve per family in a mixed run
        mine = [e for e in episodes if e.meta.task == task]
        wins = np.cumsum([e.meta.success for e in mine])
        ax1.plot(np.arange(1, len(mine) + 1), wins / np.arange(1, len(mine) + 1), marker="o",
                 label=f"{task} ({int(wins[-1])}/{len(mine)})")
    if len(tasks) > 1:
        ax1.legend(fontsize=8)
    ax1.set(xlabel="episodes finished", ylabel="success rate so far", ylim=(-0.05, 1.05), title="success rate")
    for e in episodes:
        v = e.steps[S.VALUE]
        t = np.flatnonzero(np.isfinite(v))
        ax2.plot(t, v[t], color="tab:green" if e.meta.success else "tab:red", alpha=0.6, lw=1)
    ax2.set(xlabel="control step", ylabel="critic value", ylim=(-1.05, 0.05),
            title="value per chunk (green: success, red: failure)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _video(episodes, path: Path, store: Path) -> Path:
    import imageio.v2 as imageio

    chosen = next((e for e in episodes if e.meta.success), episodes[0])
    if not chosen.image_keys:  # sharded: the actor kept the images in its shard
        reader = open_episode_reader(store)
        chosen = reader.episode(reader.episode_ids.index(chosen.meta.episode_id))
    key = next((k for k in chosen.image_keys), None)
    if key is None:
        return path
    frames = np.repeat(np.repeat(chosen.steps[key], 4, axis=1), 4, axis=2)  # 4x, nearest
    imageio.mimsave(path, list(frames), duration=0.1, loop=0)
    return path
