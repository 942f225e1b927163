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
from dataclasses import dataclass
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
from capsule_rollout.rollout.ray_rollout import RayStart, add_time_not_stamped, run_rollouts, summarize_run
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
    # the inputs checked (their sizes too) and the preflight passed before anything is started: a mistake is one
    # line before any actor starts
    out, opened, conditioning = _open_run(config)
    prepared = time.monotonic()
    items = _items(config, opened.legacy_ids)
    slot_check = _before_ray(console, config, opened, items)
    # Ray on a thread of its own: it shuts down there while this thread writes the plot and the table
    starting = [RayStart()] if config.actors else []
    try:
        where = starting[0].wait() if starting else "in-process"
    except BaseException:
        opened.recorder.close()
        raise
    ray_up = time.monotonic()
    try:
        played = _play(config, opened, items, starting)
        # Ray shuts down on its thread meanwhile
        startup = {"before_command_s": since_process, "preflight_s": prepared - began,
                   "ray_s": starting[0].seconds if starting else 0.0, "to_ray_up_s": ray_up - began,
                   "to_actors_ready_s": None if played.stats.ready_at is None else played.stats.ready_at - began,
                   "to_first_episode_s": None if played.first_report is None else played.first_report - began}
        summary = _summary(config, opened, conditioning, played, startup=startup, where=where, slot_check=slot_check)
        episodes = [r.episode for r in played.reports if r.episode is not None]
        if episodes:
            summary["plot"] = str(_plot(episodes, out / "rollout.png"))
            if config.video:
                summary["video"] = str(_video(episodes, out / "episode.gif", opened.store))
        _table(console, summary)
        failed = _say_what_failed(console, played, summary)
        return ExperimentResult(summary, exit_code=1 if failed else 0)
    finally:
        if starting:
            starting[0].stop()


def _before_ray(console, config: SimRolloutConfig, opened: OpenedRun, items: list[WorkItem]):
    """What the run says before Ray starts: the preflight's warnings, the slot check (`--check_slots`: one item at 1
    slot and in the last of N, in this process; its result, or None), what a resumed run already holds."""
    for warning in opened.checked.warnings:
        console.print(f"[yellow]warning[/yellow]: {warning}", markup=True, highlight=False, soft_wrap=True)
    slot_check = None
    if config.check_slots:
        first = items[0]
        slot_check = check_slots(opened.spec, opened.spec.slots, seed=first.seed, task=first.task)
        console.print(slot_check.line(), highlight=False, soft_wrap=True)
    if opened.done:
        console.print(f"{len(opened.done)} episodes are already in {opened.store}; running the rest")
    return slot_check


@dataclass
class _Played:
    """What `_play` gives back: the reports, the driver's tallies, and its clock."""

    reports: list
    stats: object
    steps: int  # control steps played
    wall: float  # seconds from the first item handed out to the last report
    ended: float  # monotonic time of the last report
    driver_cpu: float  # this process's CPU while the actors played (recording, Ray's calls)
    first_report: float | None  # monotonic time of the first report
    orphans: int  # a sharded store's episodes no manifest names (ignored by readers)


def _play(config: SimRolloutConfig, opened: OpenedRun, items: list[WorkItem], starting: list) -> _Played:
    """Every item played (`run_rollouts`), a progress bar as they come back; the recorder closed after, and Ray
    told to stop (on its thread) as soon as the last report is in."""
    spec, recorder = opened.spec, opened.recorder
    bar = tqdm(total=len(items) * config.repeats, desc=f"sim_rollout {config.env or config.family}", unit="ep",
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
                                      done=opened.done, on_report=on_report,
                                      episodes_per_call=config.episodes_per_call,
                                      deadlines=DeadlineSettings(floor_s=config.deadline_floor_s,
                                                                 first_call_s=config.first_call_s))
        ended, driver_cpu = time.monotonic(), time.process_time() - cpu0
        orphans = len(recorder.orphans()) if isinstance(recorder, ShardedStore) else 0
    finally:
        bar.close()
        recorder.close()
        if starting:
            starting[0].stop(wait=False)
    return _Played(reports, stats, steps_total[0], time.perf_counter() - t0, ended, driver_cpu,
                   first_report[0] if first_report else None, orphans)


def _summary(config: SimRolloutConfig, opened: OpenedRun, conditioning: Conditioning, played: _Played, *,
             startup: dict, where: str, slot_check) -> dict:
    """The run's summary (`--json`): the episodes' tallies, how the policy acted, speed, start-up, where."""
    spec, stats, wall = opened.spec, played.stats, played.wall
    run = summarize_run(played.reports, stats)
    if stats.ready_at is not None:
        add_time_not_stamped(run["time_by_part"], max(config.actors, 1) * (played.ended - stats.ready_at))
    return {**run, "advantage": conditioning.advantage, "beta": conditioning.beta,
            "n_exec": spec.host.n_exec, "noise_scale": spec.noise_scale,
            "steps_per_s": played.steps / wall if wall > 0 else 0.0, "actors": config.actors,
            "slots": spec.slots, "wall_s": wall, "startup": startup,
            "driver_cpu_s": played.driver_cpu,  # this process's CPU while the actors played (recording, Ray's calls)
            # from the first actor ready to the last episode back: the rate once started
            "steps_per_s_started": played.steps / (played.ended - stats.ready_at)
            if stats.ready_at is not None and played.ended > stats.ready_at else None,
            "store": str(opened.store), "sharded": config.shards, "orphans": played.orphans, "ray": where,
            "instances_by_actor": instances_by_actor(played.reports),
            "slot_check": None if slot_check is None else slot_check.summary()}


def _say_what_failed(console, played: _Played, summary: dict) -> bool:
    """Say why the run gave up, or how many episodes ended in errors and the first one's traceback; whether
    either happened."""
    reports, stats = played.reports, played.stats
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
    return bool(errored or stats.gave_up)


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
        *((("an actor's ms per step: env / models / loop (recording) / cold resets (capsules) / restores / hosts "
            "built / capsules saved / not stamped",
            " / ".join(f"{ms.get(k) or 0:.2f}" for k in ("env_step", "models")) +
            f" / {ms.get('host_loop') or 0:.2f} ({ms.get('record_step') or 0:.2f}) / "
            f"{ms.get('cold_reset') or 0:.2f} ({ms.get('capsule') or 0:.2f}) / " +
            " / ".join(f"{ms.get(k) or 0:.2f}" for k in ("restore", "build", "capsule_save")) + " / " +
            (f"{ms['actors_other']:.2f}" if "actors_other" in ms else "-")),)
          if (ms := s["time_by_part"]["ms_per_step"]) and s["time_by_part"]["steps"] else ()),
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
