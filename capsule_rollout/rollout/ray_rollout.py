"""The Ray layer's driver (the actor it places, `RolloutActor`, is in `rollout.rollout_actor`).

The driver places N actors (CPU / GPU fractions each), hands work items (seed,
episode id, attempt, repeat) only to actors Ray has placed and that answered,
and writes each returned episode to the recorder (the loop: `rollout.ray_driver`). It is fault tolerant: an
actor that dies, or hangs (a phase of its work past its deadline, learned per phase from what the actors
measure: `rollout.deadlines`), is restarted, the episodes it was running are handed out again, and an episode
id that is already in the store is never written twice, so every episode lands
exactly once. An episode that hangs at the same place twice, or fails `max_attempts` times, is lost with a
report that says why, and the run goes on; a run that cannot go on gives up (`DriverStats.gave_up`) with every
item left reported lost. A reset that raises fails that episode, not the run; a fatal CUDA
error ends the actor's process (its context is unusable) and the episode is re-run
on a fresh one. Follow-up rollouts of a seed (`repeats`, and `attempts` after a
failure) go preferably to the actor that holds the seed's initial capsule, so
their resets are restores; another actor restores it from `capsule_dir`.

With a `ShardedStore` as the recorder, each actor (or, without Ray, this process) writes
its episodes to its own shard and returns only the manifest entry, the metadata and the
step arrays without images; the driver commits the entry (`stores.sharded_store`: the
manifest is the truth, so an actor killed between its shard write and the commit leaves
an orphan no reader sees, and the episode is run again).

`run_rollouts(..., actors=0)` plays the same items in this process (no Ray): the
same actor code, for tests, evaluation in a training loop, and small runs.
`init_ray()` joins the cluster named by `RAY_ADDRESS` (e.g. under `ray job submit`)
or starts an embedded local one, with a watchdog that ends that session's processes
if this process dies without `shutdown_ray` (even by SIGKILL: `rollout.ray_watchdog`).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping

import numpy as np
import ray

from capsule_rollout.rollout.deadlines import DeadlineSettings, call_deadlines
from capsule_rollout.rollout.host_factory import RunSpec, resolve_spec
from capsule_rollout.rollout.phase_clock import (
    BUILD,
    CAPSULE,
    CAPSULE_SAVE,
    CHUNK,
    COLD_RESET,
    HOST,
    RECORD_STEP,
    RESTORE,
    STEP,
    WRITE,
)
from capsule_rollout.rollout.ray_driver import RayDriver
from capsule_rollout.rollout.rollout_actor import ActorReport, RolloutActor, WorkItem
from capsule_rollout.rollout.rollout_host import RolloutHost
from capsule_rollout.rollout.slots.host import rows_filled
from capsule_rollout.rollout.work_plan import (
    LOST,
    DriverStats,
    WorkPlan,
    record_reports,
    succeeded,
    without_images,
)
from capsule_rollout.stores.sharded_store import ShardedStore

__all__ = ["DriverStats", "RayStart", "actor_throughput", "first_error", "init_ray", "run_rollouts",
           "shutdown_ray", "summarize_run"]

SLOT_ITEMS = 4
"""Items per slot in one call to an actor of several slots: enough that the slots stay busy while the call's
last episodes finish (measured: 16 items on 8 slots filled 5.3 of 8 rows per batched call)."""

LOST_LISTED = 100
"""Lost episodes a summary lists by id and reason (`lost` counts them all)."""

_watchdog: subprocess.Popen | None = None  # of the local Ray `init_ray` started here


def init_ray(num_cpus: int | None = None) -> str:
    """`ray.init` on `RAY_ADDRESS` when set (a running cluster), else a local embedded one, whose processes a
    watchdog ends if this process dies before `shutdown_ray` (Linux)."""
    global _watchdog
    if ray.is_initialized():
        return "existing"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=True)
        return address
    # address="local": always a new embedded cluster (never a stale one recorded in /tmp/ray)
    context = ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=True)
    if sys.platform.startswith("linux"):  # the watchdog reads /proc
        _watchdog = subprocess.Popen(
            [sys.executable, "-m", "capsule_rollout.rollout.ray_watchdog", str(os.getpid()),
             context.address_info["session_dir"], os.path.dirname(ray.__file__)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True)
    return "local"


def shutdown_ray(where: str) -> None:
    """Stop Ray if `init_ray` started it here (`where == "local"`), and its watchdog; leave a joined cluster
    running."""
    global _watchdog
    if where == "local":
        ray.shutdown()
        if _watchdog is not None:
            _watchdog.terminate()  # Ray has stopped its processes: nothing for the watchdog to do
            _watchdog.wait()
            _watchdog = None


class _QuietSigterm(logging.Filter):  # on the logger that says it
    """Ray's warning that a driver started off the main thread sets no SIGTERM handler (`RayStart`'s: a driver
    that dies is the watchdog's to clean up after, `rollout.ray_watchdog`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "SIGTERM handler is not set" not in record.getMessage()


class RayStart:
    """`init_ray` on a thread of its own, started now; `wait()` gives `init_ray`'s answer once Ray is up, `stop()`
    shuts it down, or `stop(wait=False)` lets it shut down there while this thread goes on (`sim_rollout` writes
    its plot and table meanwhile). The thread owns Ray until then: Ray ties its local processes to the thread
    that started them (their parent-death signal), so that thread lives as long as the run."""

    def __init__(self, num_cpus: int | None = None) -> None:
        self.seconds = 0.0  # what Ray took to start
        self._up, self._stop = threading.Event(), threading.Event()
        self._where, self._error = "", None
        self._thread = threading.Thread(target=self._own, args=(num_cpus,), name="ray-start", daemon=True)
        self._thread.start()

    def _own(self, num_cpus: int | None) -> None:
        t0 = time.perf_counter()
        quiet, says = _QuietSigterm(), logging.getLogger("ray._private.worker")
        says.addFilter(quiet)
        try:
            self._where = init_ray(num_cpus)
        except BaseException as exc:  # told by `wait`
            self._error = exc
            self._up.set()
            return
        finally:
            says.removeFilter(quiet)
            self.seconds = time.perf_counter() - t0
        self._up.set()
        self._stop.wait()
        shutdown_ray(self._where)

    def wait(self) -> str:
        """Block until Ray is up: where it runs (`init_ray`'s answer); its error if it could not start."""
        self._up.wait()
        if self._error is not None:
            raise self._error
        return self._where

    def stop(self, wait: bool = True) -> None:
        """Shut down the Ray this started (a joined cluster is left running), once it is up; `wait=False`: on its
        thread while this one goes on (a later `stop()` waits for it)."""
        self._up.wait()
        self._stop.set()
        if wait:
            self._thread.join()


def run_rollouts(
    spec: RunSpec,
    items: Iterable[WorkItem],
    *,
    actors: int = 2,
    recorder=None,
    cpus_per_actor: float = 1.0,
    gpus_per_actor: float = 0.0,
    max_restarts: int = 3,
    max_attempts: int = 3,
    repeats: int = 1,
    attempts: int = 1,
    episode_timeout_s: float | None = None,
    placement_timeout_s: float = 300.0,
    done: Mapping[str, bool] | None = None,
    host: RolloutHost | None = None,
    on_report: Callable[[ActorReport, DriverStats], None] | None = None,
    actor_cls: type[RolloutActor] = RolloutActor,
    episodes_per_call: int = 1,
    deadlines: DeadlineSettings = DeadlineSettings(),
) -> tuple[list[ActorReport], DriverStats]:
    """Play every item on `actors` Ray actors (0: in this process); episodes go to `recorder` once.

    `recorder`: a `ZarrRecorder`-like writer (the driver writes each episode) or a `ShardedStore` (each actor
    writes to its own shard, the driver commits the manifest entry). Once recorded, a report's episode keeps no
    images (the store has them; `on_report` sees it whole), so the driver holds a few KB per episode.

    `repeats`: rollouts per seed from its initial state; `attempts`: tries of a rollout that fails
    (each a restore of the initial capsule with noise of its own). `done`: episode id -> success of
    episodes already recorded (a resumed run walks past them). An item that hangs (a phase past its
    deadline) or whose actor dies is handed out again, up to `max_attempts` tries in all (one that hangs at the
    same place twice: two), then lost (a report without an episode saying why); `max_restarts`: the crashes an
    actor is restarted after (kills for a hang do not count). Nothing is raised for what happens to actors: when
    the run cannot go on, `stats.gave_up` says why and every item left has a lost report.
    `episode_timeout_s`: the deadline of an item; None (the default): derived per phase from what the actors
    measure, with `deadlines` (margin, floor, first-call allowance; `rollout.deadlines`); 0: no deadline (a
    warning on stderr).
    `actor_cls`: the actor class (a `RolloutActor` subclass with the same constructor: a benchmark's
    synthetic actor).

    `episodes_per_call`: items handed to an actor in one Ray call (its reports come back together; the
    deadline of the call is the sum of its items', and if the actor dies every item of the call is
    handed out again). More than 1 spreads Ray's per-call cost in the driver over several episodes: for
    short episodes and many actors. With `spec.slots` > 1 a call hands an actor at least `SLOT_ITEMS` items per
    slot (they play side by side; a slot that finishes takes the call's next item).
    """
    if actors < 0:
        raise ValueError(f"actors must be >= 0, got {actors}")
    if repeats < 1 or attempts < 1:
        raise ValueError(f"repeats and attempts must be >= 1, got {repeats}, {attempts}")
    if episodes_per_call < 1:
        raise ValueError(f"episodes_per_call must be >= 1, got {episodes_per_call}")
    if spec.slots > 1:
        episodes_per_call = max(episodes_per_call, SLOT_ITEMS * spec.slots)
    if host is None and spec.policy:  # here, once, if the caller has not: the actors take the resolution as it is
        spec = resolve_spec(spec)  # (a host handed over is built; a spec without a policy builds none: a test actor)
    if episode_timeout_s is not None and not (episode_timeout_s >= 0 and episode_timeout_s < float("inf")):
        raise ValueError(f"episode_timeout_s must be a finite number >= 0 (0: no deadline) or None (derived), got "
                         f"{episode_timeout_s}")
    if max_attempts < 1 or max_restarts < 0:
        raise ValueError(f"max_attempts must be >= 1 and max_restarts >= 0, got {max_attempts}, {max_restarts}")
    items = list(items)
    ids = [it.episode_id for it in items]
    if len(set(ids)) != len(ids):
        raise ValueError("work items must have unique episode ids")
    plan = WorkPlan(items, repeats, attempts, done or {})
    shard_root = recorder.shard_root if isinstance(recorder, ShardedStore) else ""
    if actors == 0:
        return _run_local(spec, plan, recorder, host, on_report, shard_root, actor_cls, episodes_per_call)
    if episode_timeout_s == 0:
        print("warning: episode deadlines are off (episode_timeout_s 0): an actor that hangs stalls the run",
              file=sys.stderr)
    driver = RayDriver(spec, plan, actors=actors, recorder=recorder, shard_root=shard_root, actor_cls=actor_cls,
                       cpus_per_actor=cpus_per_actor, gpus_per_actor=gpus_per_actor, max_restarts=max_restarts,
                       max_attempts=max_attempts, deadlines=call_deadlines(episode_timeout_s, deadlines),
                       settings=deadlines, placement_timeout_s=placement_timeout_s, on_report=on_report,
                       episodes_per_call=episodes_per_call)
    return driver.run()


def _run_local(spec, plan: WorkPlan, recorder, host, on_report, shard_root, actor_cls, per_call: int):
    actor = actor_cls(spec, host=host, shard_root=shard_root)
    stats, reports = DriverStats(actors_placed=1, ready_at=time.monotonic()), []
    try:
        while plan:
            batch = [plan.take(0) for _ in range(min(per_call, len(plan)))]
            got = actor.run_batch(batch)
            record_reports(got, recorder, stats)
            for item, report in zip(batch, got, strict=True):
                stats.follow_ups += plan.follow(item, succeeded(report), 0)
                reports.append(report)
                if on_report is not None:
                    on_report(report, stats)
                if recorder is not None:
                    without_images(report)  # recorded: the store has them
    finally:
        actor.close_shard()
        if host is None:
            actor.close()
        else:  # the caller's host stays open; hosts the actor built for other families do not
            for built in actor.hosts.values():
                if built is not host:
                    built.close()
    return reports, stats


def summarize_run(reports: list[ActorReport], stats: DriverStats) -> dict:
    """Outcomes, stop reasons, resets by kind and by actor, and the driver's tallies of a run's reports."""
    episodes = [r.episode for r in reports if r.episode is not None]
    lost = [r for r in reports if r.episode is None]  # played nothing that could be recorded (and why)
    errored = [r for r in reports if r.errored]
    reasons = Counter(e.meta.stop_reason for e in episodes)
    resets = [r.reset_ms for r in reports if r.episode is not None]
    played = [r for r in reports if r.reset_kind != LOST]  # a lost item's report is the driver's, not an actor's
    by_actor: dict[str, Counter] = {}
    for r in played:
        by_actor.setdefault(str(r.actor_index if r.actor_index >= 0 else r.actor_pid), Counter())[r.reset_kind] += 1
    first = [e for e in episodes if e.meta.attempt == 0]
    by_task: dict[str, list[bool]] = {}
    for e in episodes:
        by_task.setdefault(e.meta.task, []).append(bool(e.meta.success))
    return {
        "episodes": len(episodes),
        "successes": sum(e.meta.success for e in episodes),
        "success_rate": (sum(e.meta.success for e in episodes) / len(episodes)) if episodes else 0.0,
        "first_attempt_success_rate": (sum(e.meta.success for e in first) / len(first)) if first else 0.0,
        "seeds_solved": len({(e.meta.task, e.meta.seed) for e in episodes if e.meta.success}),
        "by_task": {task: {"episodes": len(wins), "successes": sum(wins), "success_rate": sum(wins) / len(wins)}
                      for task, wins in sorted(by_task.items())},
        "stop_reasons": dict(reasons),
        "failed_before_first_step": stats.failed_before_first_step,
        "errors": [r.error for r in reports if r.error][:10],
        "ended_in_errors": len(errored),  # lost, or recorded with stop reason `error`
        "first_error": first_error(errored),
        "reset_ms_median": float(np.median(resets)) if resets else None,
        "reset_kinds": dict(Counter(r.reset_kind for r in played)),
        "reset_kinds_by_actor": {k: dict(v) for k, v in sorted(by_actor.items())},
        "episodes_by_node": dict(Counter(r.node for r in reports if r.episode is not None and r.node)),
        "control_hz_per_actor_median": float(np.median([r.steps_per_s for r in played])) if played else None,
        "actor_failures": stats.actor_failures,
        "timeouts": stats.timeouts,
        "hangs": stats.hangs,
        "episode_deadline_s": stats.episode_deadline_s,
        "phase_deadlines": stats.phase_deadlines,
        "resubmitted": stats.resubmitted,
        "duplicates_skipped": stats.duplicates_skipped,
        "lost": len(lost),
        "lost_episodes": [{"episode_id": r.item.episode_id if r.item else "?", "why": r.error}
                          for r in lost[:LOST_LISTED]],
        "gave_up": stats.gave_up or None,
        "rows": rows_filled(played),
        "time_by_part": time_by_part(stats, sum(e.meta.length for e in episodes)),
    }


PART_NAMES = {STEP: "env_step", CHUNK: "models", HOST: "host_loop", RECORD_STEP: "record_step",
              COLD_RESET: "cold_reset", CAPSULE: "capsule", RESTORE: "restore", BUILD: "build", WRITE: "shard_write",
              CAPSULE_SAVE: "capsule_save"}
"""The summary's name of each phase and part of `rollout.phase_clock` (`record_step` is part of `host_loop`,
`capsule` of `cold_reset`; `capsule_save` is outside the phases)."""


def time_by_part(stats: DriverStats, steps: int) -> dict:
    """Where the actors' time went: seconds in each phase and part their clocks stamped (`PART_NAMES`; the env's
    steps with their images, the batched policy and critic calls, the loop's own work with each step's recording,
    resets, building hosts, writing shards, waiting for the seeds' initial capsules to be saved), and the driver's
    recording (`driver_record`); each also in ms per recorded control step. Episodes that hung or were not played
    are not counted."""
    seconds = {PART_NAMES.get(k, k): v for k, v in stats.part_s.items()}
    seconds["driver_record"] = stats.record_s
    return {"steps": steps, "seconds": seconds,
            "ms_per_step": {k: (v * 1e3 / steps if steps else None) for k, v in seconds.items()}}


NOT_THE_ACTORS_OWN = (PART_NAMES[CAPSULE], PART_NAMES[RECORD_STEP], "driver_record")
"""Parts of `time_by_part` that are not more of an actor's time: counted within a phase already, or the driver's."""


def add_time_not_stamped(parts: dict, actors_s: float) -> None:
    """Add to `time_by_part` what the actors' clocks did not stamp (`actors_other`): `actors_s`, the actors' wall
    time together (each actor's from the first actor ready to the last episode back), less their phases: waiting for
    a call, Ray's hand-off of calls and episodes, the actor's own work outside its hosts. Nothing when no step was
    recorded or no time passed."""
    if actors_s <= 0 or not parts["steps"]:
        return
    other = actors_s - sum(v for k, v in parts["seconds"].items() if k not in NOT_THE_ACTORS_OWN)
    parts["seconds"]["actors_other"] = other
    parts["ms_per_step"]["actors_other"] = other * 1e3 / parts["steps"]


def first_error(errored: list[ActorReport]) -> dict | None:
    """The first report that ended in an error, for a summary: its episode id, the error's line and the user's
    frames under it."""
    if not errored:
        return None
    first = errored[0]
    return {"episode_id": first.item.episode_id if first.item else "?", "error": first.error,
            "traceback": first.traceback}


def actor_throughput(spec: RunSpec, seeds: list[int], *, counts=(1, 2), cpus_per_actor: float = 1.0) -> dict:
    """Control steps/s of `seeds` played on n actors, for each n in `counts` (in that order).

    The actors are made and warmed up first (each plays every seed once, so later
    resets are restores); returns {n: [steps/s, ...]}.
    """
    n_max = max(counts)
    remote = ray.remote(RolloutActor).options(num_cpus=cpus_per_actor)
    pool = [remote.remote(spec, i) for i in range(n_max)]
    try:
        ray.get([a.run.remote(WorkItem(f"warm-{i}-{s}", s)) for i, a in enumerate(pool) for s in seeds])
        out: dict[int, list[float]] = {}
        for n in counts:
            t0 = time.perf_counter()
            refs = [pool[i % n].run.remote(WorkItem(f"n{n}-{s}", s)) for i, s in enumerate(seeds)]
            steps = sum(r.episode.meta.length for r in ray.get(refs))
            out.setdefault(n, []).append(steps / (time.perf_counter() - t0))
        return out
    finally:
        for a in pool:
            ray.kill(a)
