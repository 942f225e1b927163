"""The Ray layer: `RolloutActor` (the only Ray-aware wrapper of `RolloutHost`) and the driver.

The driver places N actors (CPU / GPU fractions each), hands out work items
(family, seed, episode id), and writes each returned episode to the recorder. It
is fault tolerant: an actor that dies is restarted by Ray (`max_restarts`), the
episode it was running is handed out again, and an episode id that is already in
the store is never written twice, so every episode lands exactly once.

`init_ray()` joins the cluster named by `RAY_ADDRESS` (e.g. under `ray job submit`)
or starts an embedded local one.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

from rollout.host_factory import HostSpec, build_host, save_initial_capsule


@dataclass(frozen=True)
class WorkItem:
    episode_id: str
    seed: int


@dataclass
class ActorReport:
    """What an actor returns per episode (the episode itself plus host figures)."""

    episode: object  # rollout.episode.Episode (None when it failed before its first step)
    reset_kind: str
    reset_ms: float
    steps_per_s: float
    error: str
    actor_pid: int


def init_ray(num_cpus: int | None = None) -> str:
    """`ray.init` on `RAY_ADDRESS` when set (a running cluster), else a local embedded one."""
    if ray.is_initialized():
        return "existing"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=True)
        return address
    # address="local": always a new embedded cluster (never a stale one recorded in /tmp/ray)
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=True)
    return "local"


def shutdown_ray(where: str) -> None:
    """Stop Ray if `init_ray` started it here (`where == "local"`); leave a joined cluster running."""
    if where == "local":
        ray.shutdown()


class RolloutActor:
    """One rollout host in its own process; `run(item)` plays one episode."""

    def __init__(self, spec: HostSpec, index: int = 0) -> None:
        self.spec = spec
        if spec.pin_cores and hasattr(os, "sched_setaffinity"):
            cores = sorted(os.sched_getaffinity(0))
            os.sched_setaffinity(0, {cores[index % len(cores)]})
        self.host = build_host(spec)

    def run(self, item: WorkItem) -> ActorReport:
        result = self.host.run_episode(item.seed, episode_id=item.episode_id)
        save_initial_capsule(self.host, self.spec, item.seed)
        return ActorReport(episode=result.episode, reset_kind=result.reset_kind, reset_ms=result.reset_ms,
                           steps_per_s=result.steps_per_s, error=result.error, actor_pid=os.getpid())

    def pid(self) -> int:
        return os.getpid()


@dataclass
class DriverStats:
    episodes: int = 0
    successes: int = 0
    resubmitted: int = 0
    actor_failures: int = 0
    duplicates_skipped: int = 0
    failed_before_first_step: int = 0


def run_rollouts(
    spec: HostSpec,
    items: Iterable[WorkItem],
    *,
    actors: int = 2,
    recorder=None,
    cpus_per_actor: float = 1.0,
    gpus_per_actor: float = 0.0,
    max_restarts: int = 3,
    max_attempts: int = 3,
    on_report: Callable[[ActorReport, DriverStats], None] | None = None,
) -> tuple[list[ActorReport], DriverStats]:
    """Play every item on `actors` Ray actors; episodes go to `recorder` exactly once.

    An item whose actor dies is handed out again (up to `max_attempts` tries);
    an episode id already in the recorder is not written again.
    """
    if actors < 1:
        raise ValueError(f"actors must be >= 1, got {actors}")
    todo = deque(items)
    ids = [it.episode_id for it in todo]
    if len(set(ids)) != len(ids):
        raise ValueError("work items must have unique episode ids")
    remote_cls = ray.remote(RolloutActor).options(num_cpus=cpus_per_actor, num_gpus=gpus_per_actor,
                                                   max_restarts=max_restarts, max_task_retries=0)
    pool = [remote_cls.remote(spec, i) for i in range(actors)]
    idle = deque(pool)
    in_flight: dict = {}  # object ref -> (actor, item)
    probes: dict = {}  # object ref -> actor being restarted (a `pid()` call answers once it is back)
    alive = len(pool)
    attempts: dict[str, int] = {}
    stats = DriverStats()
    reports: list[ActorReport] = []
    try:
        while todo or in_flight:
            while todo and idle:
                item, actor = todo.popleft(), idle.popleft()
                attempts[item.episode_id] = attempts.get(item.episode_id, 0) + 1
                in_flight[actor.run.remote(item)] = (actor, item)
            if not in_flight and not probes:
                raise RuntimeError(f"every rollout actor is gone; {len(todo)} episodes were not run")
            done, _ = ray.wait([*in_flight, *probes], num_returns=1)
            ref = done[0]
            if ref in probes:  # a restarted actor: back to work, or still restarting, or gone
                actor = probes.pop(ref)
                try:
                    ray.get(ref)
                    idle.append(actor)
                except ActorUnavailableError:
                    time.sleep(0.2)
                    probes[actor.pid.remote()] = actor
                except (RayActorError, ActorDiedError):
                    alive -= 1  # out of restarts
                    if not alive:
                        raise RuntimeError(f"every rollout actor died; {len(todo)} episodes were not run") from None
                continue
            actor, item = in_flight.pop(ref)
            try:
                report: ActorReport = ray.get(ref)
            except (RayActorError, ActorDiedError, ActorUnavailableError) as exc:
                if "creation task" in str(exc):  # the host could not be built: retrying will not help
                    raise RuntimeError(f"a rollout actor could not start: {exc}") from exc
                stats.actor_failures += 1
                if attempts[item.episode_id] >= max_attempts:
                    raise RuntimeError(f"episode {item.episode_id} failed {max_attempts} times; last: {exc}") from exc
                stats.resubmitted += 1
                todo.appendleft(item)  # re-run it first, on the next actor that is ready
                probes[actor.pid.remote()] = actor  # Ray restarts this one meanwhile
                continue
            idle.append(actor)
            if report.episode is None:
                stats.failed_before_first_step += 1
            elif recorder is not None and report.episode.meta.episode_id in recorder:
                stats.duplicates_skipped += 1
            else:
                if recorder is not None:
                    recorder.write(report.episode)
                stats.episodes += 1
                stats.successes += int(report.episode.meta.success)
            reports.append(report)
            if on_report is not None:
                on_report(report, stats)
    finally:
        for actor in pool:
            ray.kill(actor, no_restart=True)
    return reports, stats


def actor_throughput(spec: HostSpec, seeds: list[int], *, counts=(1, 2), cpus_per_actor: float = 1.0) -> dict:
    """Control steps/s of `seeds` played on n actors, for each n in `counts` (in that order).

    The actors are made and warmed up first (each plays every seed once, so later
    resets are restores); returns {n: [steps/s, ...]}.
    """
    n_max = max(counts)
    remote = ray.remote(RolloutActor).options(num_cpus=cpus_per_actor)
    actors = [remote.remote(spec, i) for i in range(n_max)]
    try:
        ray.get([a.run.remote(WorkItem(f"warm-{i}-{s}", s)) for i, a in enumerate(actors) for s in seeds])
        out: dict[int, list[float]] = {}
        for n in counts:
            t0 = time.perf_counter()
            refs = [actors[i % n].run.remote(WorkItem(f"n{n}-{s}", s)) for i, s in enumerate(seeds)]
            steps = sum(r.episode.meta.length for r in ray.get(refs))
            out.setdefault(n, []).append(steps / (time.perf_counter() - t0))
        return out
    finally:
        for a in actors:
            ray.kill(a)
