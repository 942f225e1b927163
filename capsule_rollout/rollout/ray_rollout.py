"""The Ray layer's driver (the actor it places, `RolloutActor`, is in `rollout.rollout_actor`).

The driver places N actors (CPU / GPU fractions each), hands work items (seed,
episode id, attempt, repeat) only to actors Ray has placed and that answered,
and writes each returned episode to the recorder. It is fault tolerant: an actor
that dies (or hangs past the episode deadline, and is killed) is restarted by Ray
(`max_restarts`), the episode it was running is handed out again (the deadline is on by default, derived
from the step limit and step time the actors report: `rollout.deadlines`), and an episode
id that is already in the store is never written twice, so every episode lands
exactly once. A reset that raises fails that episode, not the run; a fatal CUDA
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

import os
import subprocess
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

from capsule_rollout.capsules import signing_key
from capsule_rollout.rollout.deadlines import call_deadlines
from capsule_rollout.rollout.host_factory import HostSpec
from capsule_rollout.rollout.rollout_actor import ActorReport, RolloutActor, WorkItem, follow_up_id
from capsule_rollout.rollout.rollout_host import RolloutHost
from capsule_rollout.stores.shard_manifest import ManifestEntry
from capsule_rollout.stores.sharded_store import ShardedStore

SLOT_ITEMS = 4
"""Items per slot in one call to an actor of several slots: enough that the slots stay busy while the call's
last episodes finish (measured: 16 items on 8 slots filled 5.3 of 8 rows per batched call)."""

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


@dataclass
class DriverStats:
    episodes: int = 0
    successes: int = 0
    resubmitted: int = 0
    actor_failures: int = 0
    timeouts: int = 0
    duplicates_skipped: int = 0
    failed_before_first_step: int = 0
    actors_placed: int = 0
    follow_ups: int = 0
    episode_deadline_s: float | None = None  # the deadline per episode of the last call handed out (None: none)


class _Plan:
    """The work: items to hand out, follow-ups (repeats, retries) as results come in, resumes."""

    def __init__(self, items: Iterable[WorkItem], repeats: int, attempts: int, done: Mapping[str, bool]) -> None:
        self.repeats, self.attempts, self.done = repeats, attempts, dict(done)
        self.todo: deque[WorkItem] = deque()
        self.preferred: dict[int, deque[WorkItem]] = {}
        self.skipped = 0
        for item in items:
            self._add(item, None)

    def _add(self, item: WorkItem, actor: int | None) -> None:
        """Queue `item`, or, when already recorded, walk on to what it would lead to."""
        if item.episode_id in self.done:
            self.skipped += 1
            for nxt in self.after(item, self.done[item.episode_id]):
                self._add(nxt, actor)
            return
        (self.preferred.setdefault(actor, deque()) if actor is not None else self.todo).append(item)

    def after(self, item: WorkItem, success: bool) -> list[WorkItem]:
        """What a finished rollout leads to: a retry after a failure, the seed's next repeat."""
        base, out = item.base_id, []
        if not success and item.attempt + 1 < self.attempts:
            out.append(WorkItem(follow_up_id(base, item.attempt + 1, item.repeat), item.seed, item.attempt + 1,
                                item.repeat, base, item.task))
        if item.attempt == 0 and item.repeat + 1 < self.repeats:
            out.append(WorkItem(follow_up_id(base, 0, item.repeat + 1), item.seed, 0, item.repeat + 1, base,
                                item.task))
        return out

    def follow(self, item: WorkItem, success: bool, actor: int) -> int:
        nxt = self.after(item, success)
        for it in nxt:
            self._add(it, actor)
        return len(nxt)

    def retry(self, item: WorkItem) -> None:
        self.todo.appendleft(item)

    def take(self, actor: int) -> WorkItem | None:
        """The next item for `actor`: its own follow-ups, then new work, then another's follow-ups
        (better a restore from `capsule_dir`, or a cold reset, than an idle actor)."""
        own = self.preferred.get(actor)
        if own:
            return own.popleft()
        if self.todo:
            return self.todo.popleft()
        for queue in self.preferred.values():
            if queue:
                return queue.popleft()
        return None

    def __bool__(self) -> bool:
        return bool(self.todo) or any(self.preferred.values())

    def __len__(self) -> int:
        return len(self.todo) + sum(len(q) for q in self.preferred.values())


def _record(reports: list[ActorReport], recorder, stats: DriverStats) -> None:
    """Write (single store) or commit (sharded store: the actors wrote them; one group commit) returned
    episodes, each once."""
    entries: list[ManifestEntry] = []
    ids: set[str] = set()
    for report in reports:
        if report.episode is None:
            stats.failed_before_first_step += 1
            continue
        episode_id = report.episode.meta.episode_id
        if recorder is not None and (episode_id in recorder or episode_id in ids):
            stats.duplicates_skipped += 1  # sharded: this copy stays an orphan in its shard, the manifest names the first
            continue
        ids.add(episode_id)
        if isinstance(recorder, ShardedStore):
            if report.shard is None:
                raise RuntimeError(f"episode {episode_id} came back without a shard entry")
            entries.append(report.shard)
        elif recorder is not None:
            recorder.write(report.episode)
        stats.episodes += 1
        stats.successes += int(report.episode.meta.success)
    if entries:
        recorder.commit_many(entries)


def _success(report: ActorReport) -> bool:
    return report.episode is not None and bool(report.episode.meta.success)


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
    repeats: int = 1,
    attempts: int = 1,
    episode_timeout_s: float | None = None,
    placement_timeout_s: float = 300.0,
    done: Mapping[str, bool] | None = None,
    host: RolloutHost | None = None,
    on_report: Callable[[ActorReport, DriverStats], None] | None = None,
    actor_cls: type[RolloutActor] = RolloutActor,
    episodes_per_call: int = 1,
) -> tuple[list[ActorReport], DriverStats]:
    """Play every item on `actors` Ray actors (0: in this process); episodes go to `recorder` once.

    `recorder`: a `ZarrRecorder`-like writer (the driver writes each episode) or a `ShardedStore` (each actor
    writes to its own shard, the driver commits the manifest entry).

    `repeats`: rollouts per seed from its initial state; `attempts`: tries of a rollout that fails
    (each a restore of the initial capsule with noise of its own). `done`: episode id -> success of
    episodes already recorded (a resumed run walks past them). An item whose actor dies, or runs
    past its deadline (the driver kills the actor), is handed out again (up to `max_attempts` tries).
    `episode_timeout_s`: the deadline of an item; None (the default): derived from the step limit and the
    seconds per step the actors report (`rollout.deadlines`); 0: no deadline (a warning on stderr).
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
    if episode_timeout_s is not None and not episode_timeout_s >= 0:
        raise ValueError(f"episode_timeout_s must be >= 0 (0: no deadline) or None (derived), got {episode_timeout_s}")
    items = list(items)
    ids = [it.episode_id for it in items]
    if len(set(ids)) != len(ids):
        raise ValueError("work items must have unique episode ids")
    plan = _Plan(items, repeats, attempts, done or {})
    shard_root = recorder.shard_root if isinstance(recorder, ShardedStore) else ""
    if actors == 0:
        return _run_local(spec, plan, recorder, host, on_report, shard_root, actor_cls, episodes_per_call)
    if episode_timeout_s == 0:
        print("warning: episode deadlines are off (episode_timeout_s 0): an actor that hangs stalls the run",
              file=sys.stderr)
    return _run_ray(spec, plan, actors=actors, recorder=recorder, shard_root=shard_root, actor_cls=actor_cls,
                    cpus_per_actor=cpus_per_actor, gpus_per_actor=gpus_per_actor, max_restarts=max_restarts,
                    max_attempts=max_attempts, episode_timeout_s=episode_timeout_s,
                    placement_timeout_s=placement_timeout_s, on_report=on_report,
                    episodes_per_call=episodes_per_call)


def _run_local(spec, plan: _Plan, recorder, host, on_report, shard_root, actor_cls, per_call: int):
    actor = actor_cls(spec, host=host, shard_root=shard_root)
    stats, reports = DriverStats(actors_placed=1), []
    try:
        while plan:
            batch = [plan.take(0) for _ in range(min(per_call, len(plan)))]
            got = actor.run_batch(batch)
            _record(got, recorder, stats)
            for item, report in zip(batch, got, strict=True):
                stats.follow_ups += plan.follow(item, _success(report), 0)
                reports.append(report)
                if on_report is not None:
                    on_report(report, stats)
    finally:
        actor.close_shard()
        if host is None:
            actor.close()
        else:  # the caller's host stays open; hosts the actor built for other families do not
            for built in actor.hosts.values():
                if built is not host:
                    built.close()
    return reports, stats


def _run_ray(spec, plan: _Plan, *, actors, recorder, shard_root, actor_cls, cpus_per_actor, gpus_per_actor,
             max_restarts, max_attempts, episode_timeout_s, placement_timeout_s, on_report, episodes_per_call):
    # SPREAD: on a cluster the actors go to as many nodes as can take them (the default packs the driver's node
    # first); on one node it changes nothing
    remote_cls = ray.remote(actor_cls).options(num_cpus=cpus_per_actor, num_gpus=gpus_per_actor,
                                                   max_restarts=max_restarts, max_task_retries=0,
                                                   scheduling_strategy="SPREAD")
    key = signing_key()  # the actors sign and check the run's capsules with the driver's key
    pool = [remote_cls.remote(spec, i, shard_root=shard_root, capsule_key=key) for i in range(actors)]
    idle: deque[int] = deque()
    in_flight: dict = {}  # object ref -> (actor index, items, deadline or None, its seconds)
    probes: dict = {ray_actor.ready.remote(): i for i, ray_actor in enumerate(pool)}  # placed and built?
    alive = set(range(actors))
    placed: set[int] = set()
    warm: set[int] = set()  # actors that finished a call since they were placed or restarted
    deadlines = call_deadlines(episode_timeout_s)
    tries: dict[str, int] = {}
    timed_out: set = set()
    stats = DriverStats()
    reports: list[ActorReport] = []
    started = time.monotonic()
    try:
        while plan or in_flight:
            while plan and idle:
                index = idle.popleft()
                # slots: share what is left among the actors rather than fill one actor's call with all of it
                share = max(spec.slots, -(-len(plan) // actors)) if spec.slots > 1 else episodes_per_call
                batch = [plan.take(index) for _ in range(min(episodes_per_call, share, len(plan)))]
                for item in batch:
                    tries[item.episode_id] = tries.get(item.episode_id, 0) + 1
                seconds = deadlines.call_s(batch, first_call=index not in warm)
                stats.episode_deadline_s = None if seconds is None else seconds / len(batch)
                deadline = None if seconds is None else time.monotonic() + seconds
                in_flight[pool[index].run_batch.remote(batch)] = (index, batch, deadline, seconds)
            if not in_flight and not probes:
                raise RuntimeError(f"every rollout actor is gone; {len(plan)} episodes were not run")
            wait = _next_deadline(in_flight, placed & alive, probes, started, placement_timeout_s)
            done, _ = ray.wait([*in_flight, *probes], num_returns=1, timeout=wait)
            if not done:
                _expire(in_flight, probes, pool, timed_out, stats, placed & alive, started, placement_timeout_s,
                        cpus_per_actor, gpus_per_actor)
                continue
            ref = done[0]
            if ref in probes:  # an actor placed (or restarted): to work; still restarting; or gone
                index = probes.pop(ref)
                try:
                    ray.get(ref)
                    placed.add(index)
                    stats.actors_placed = len(placed)
                    idle.append(index)
                except ActorUnavailableError:
                    time.sleep(0.2)
                    probes[pool[index].ready.remote()] = index
                except (RayActorError, ActorDiedError) as exc:
                    if getattr(exc, "actor_init_failed", False) or index not in placed:  # the host could not be built
                        raise RuntimeError(f"a rollout actor could not start: {exc}") from exc
                    alive.discard(index)  # out of restarts
                    if not alive:
                        raise RuntimeError(f"every rollout actor died; {len(plan)} episodes were not run") from None
                continue
            index, batch, _, seconds = in_flight.pop(ref)
            try:
                got = ray.get(ref)
            except (RayActorError, ActorDiedError, ActorUnavailableError) as exc:
                if getattr(exc, "actor_init_failed", False):  # the host could not be built: retrying will not help
                    raise RuntimeError(f"a rollout actor could not start: {exc}") from exc
                stats.actor_failures += 1
                warm.discard(index)
                why = f"ran past its {seconds:.0f} s deadline" if ref in timed_out else f"{exc}"
                for item in reversed(batch):  # re-run them first, in order, on the next actors that are ready
                    if tries[item.episode_id] >= max_attempts:
                        raise RuntimeError(f"episode {item.episode_id} failed {max_attempts} times; "
                                           f"last: {why}") from exc
                    stats.resubmitted += 1
                    plan.retry(item)
                probes[pool[index].ready.remote()] = index  # Ray restarts this one meanwhile
                continue
            idle.append(index)
            if index in warm:  # a first call's compile is what its allowance is for: not a measure of later ones
                deadlines.observe(got)
            warm.add(index)
            _record(got, recorder, stats)
            for item, report in zip(batch, got, strict=True):
                stats.follow_ups += plan.follow(item, _success(report), index)
                reports.append(report)
                if on_report is not None:
                    on_report(report, stats)
    finally:
        for ray_actor in pool:
            ray.kill(ray_actor, no_restart=True)
    return reports, stats


def _next_deadline(in_flight, placed, probes, started, placement_timeout_s) -> float | None:
    """Seconds until the next deadline (a call's, or placement's while no actor is placed)."""
    now = time.monotonic()
    waits = []
    deadlines = [d for _, _, d, _ in in_flight.values() if d is not None]
    if deadlines:
        waits.append(min(deadlines) - now)
    if not placed and probes:
        waits.append(started + placement_timeout_s - now)
    return max(0.0, min(waits)) if waits else None


def _expire(in_flight, probes, pool, timed_out, stats, placed, started, placement_timeout_s, cpus, gpus) -> None:
    now = time.monotonic()
    if not placed and probes and now >= started + placement_timeout_s:
        raise RuntimeError(f"no rollout actor was placed within {placement_timeout_s:.0f} s: each asks for "
                           f"{cpus} CPU and {gpus} GPU; the cluster has {ray.available_resources()} free. "
                           "Ask for less (--cpus_per_actor, --gpus_per_actor) or fewer --actors")
    for ref, (index, _batch, deadline, _seconds) in list(in_flight.items()):
        if deadline is not None and now >= deadline and ref not in timed_out:
            timed_out.add(ref)
            stats.timeouts += 1
            ray.kill(pool[index], no_restart=False)  # Ray restarts it; the pending call then fails


def summarize_run(reports: list[ActorReport], stats: DriverStats) -> dict:
    """Outcomes, stop reasons, resets by kind and by actor, and the driver's tallies of a run's reports."""
    episodes = [r.episode for r in reports if r.episode is not None]
    reasons = Counter(e.meta.stop_reason for e in episodes)
    resets = [r.reset_ms for r in reports if r.episode is not None]
    by_actor: dict[str, Counter] = {}
    for r in reports:
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
        "reset_ms_median": float(np.median(resets)) if resets else None,
        "reset_kinds": dict(Counter(r.reset_kind for r in reports)),
        "reset_kinds_by_actor": {k: dict(v) for k, v in sorted(by_actor.items())},
        "episodes_by_node": dict(Counter(r.node for r in reports if r.episode is not None and r.node)),
        "control_hz_per_actor_median": float(np.median([r.steps_per_s for r in reports])) if reports else None,
        "actor_failures": stats.actor_failures,
        "timeouts": stats.timeouts,
        "episode_deadline_s": stats.episode_deadline_s,
        "resubmitted": stats.resubmitted,
        "duplicates_skipped": stats.duplicates_skipped,
    }


def actor_throughput(spec: HostSpec, seeds: list[int], *, counts=(1, 2), cpus_per_actor: float = 1.0) -> dict:
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
