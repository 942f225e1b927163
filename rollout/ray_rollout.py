"""The Ray layer: `RolloutActor` (the only Ray-aware wrapper of `RolloutHost`) and the driver.

The driver places N actors (CPU / GPU fractions each), hands work items (seed,
episode id, attempt, repeat) only to actors Ray has placed and that answered,
and writes each returned episode to the recorder. It is fault tolerant: an actor
that dies (or hangs past the episode deadline, and is killed) is restarted by Ray
(`max_restarts`), the episode it was running is handed out again, and an episode
id that is already in the store is never written twice, so every episode lands
exactly once. A reset that raises fails that episode, not the run; a fatal CUDA
error ends the actor's process (its context is unusable) and the episode is re-run
on a fresh one. Follow-up rollouts of a seed (`repeats`, and `attempts` after a
failure) go preferably to the actor that holds the seed's initial capsule, so
their resets are restores; another actor restores it from `capsule_dir`.

With a `ShardedStore` as the recorder, each actor (or, without Ray, this process) writes
its episodes to its own shard and returns only the manifest entry, the metadata and the
step arrays without images; the driver commits the entry (`rollout.sharded_store`: the
manifest is the truth, so an actor killed between its shard write and the commit leaves
an orphan no reader sees, and the episode is run again).

`run_rollouts(..., actors=0)` plays the same items in this process (no Ray): the
same actor code, for tests, evaluation in a training loop, and small runs.
`init_ray()` joins the cluster named by `RAY_ADDRESS` (e.g. under `ray job submit`)
or starts an embedded local one.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

from capsules import CapsuleError, load_capsule
from rollout import episode_schema as S
from rollout.episode import Episode
from rollout.host_factory import (
    FAULT_AFTER_RECORD,
    MIXED,
    HostSpec,
    build_host,
    capsule_path,
    save_initial_capsule,
)
from rollout.observer import EpisodeObserver
from rollout.rollout_host import RolloutHost
from rollout.shard_manifest import ManifestEntry
from rollout.sharded_store import ShardedStore, ShardWriter

CUDA_FATAL = ("CUDA error", "device-side assert", "illegal memory access", "CUBLAS_STATUS", "cudaError",
              "unspecified launch failure")


@dataclass(frozen=True)
class WorkItem:
    episode_id: str
    seed: int
    attempt: int = 0
    """0: the seed's first rollout; k: the k-th retry after a failure (noise of its own)."""
    repeat: int = 0
    """Which rollout from the seed's initial state (noise of its own)."""
    base: str = ""
    """The episode id of the seed's first rollout (follow-ups are named after it); empty: `episode_id`."""
    family: str = ""
    """The tabletop family this episode plays: needed in a mixed-family run (`HostSpec.family` "all"), where each
    actor keeps a host per family; empty: the spec's family."""

    @property
    def base_id(self) -> str:
        return self.base or self.episode_id


def follow_up_id(base: str, attempt: int, repeat: int) -> str:
    """Episode id of a seed's repeat / retry: `base`, `base-r1`, `base-a1`, `base-r1-a2`..."""
    return base + (f"-r{repeat}" if repeat else "") + (f"-a{attempt}" if attempt else "")


@dataclass
class ActorReport:
    """What an actor returns per episode (the episode itself plus host figures)."""

    episode: object  # rollout.episode.Episode (None when it failed before its first step); without images when
    # `shard` is set
    reset_kind: str
    reset_ms: float
    steps_per_s: float
    error: str
    actor_pid: int
    item: WorkItem | None = None
    extra: dict = field(default_factory=dict)  # the observers' per-episode results
    actor_index: int = -1
    shard: ManifestEntry | None = None  # where the actor wrote the episode (sharded recording), for the driver to commit
    node: str = ""  # the Ray node the actor runs on (its node id; empty in-process)


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


def _is_cuda_fatal(error: str) -> bool:
    return any(marker in error for marker in CUDA_FATAL)


class RolloutActor:
    """One rollout host in its own process (or in this one); `run(item)` plays one episode."""

    def __init__(self, spec: HostSpec, index: int = 0, *, host: RolloutHost | None = None,
                 observers: list[EpisodeObserver] | None = None, shard_root: str = "") -> None:
        """`host`: a host built by the caller (in-process use); else one is built from `spec`. `shard_root`: a
        sharded store's root; each episode is then written to this process's own shard there."""
        self.spec, self.index = spec, index
        self.shard_root = shard_root
        self.node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
        self._shard: ShardWriter | None = None
        if spec.pin_cores and hasattr(os, "sched_setaffinity"):
            cores = sorted(os.sched_getaffinity(0))
            os.sched_setaffinity(0, {cores[index % len(cores)]})
        if spec.device.startswith("cuda") and ray.is_initialized():
            gpu_ids = ray.get_gpu_ids()  # MuJoCo's EGL ignores CUDA_VISIBLE_DEVICES: render on our GPU
            if gpu_ids:
                os.environ.setdefault("MUJOCO_EGL_DEVICE_ID", str(int(float(gpu_ids[0]))))
        self._observers = observers
        self.hosts: dict[str, RolloutHost] = {}  # family -> its host (several in a mixed-family run)
        if host is not None:
            self._adopt(host.task if spec.family == MIXED else spec.family, host)
        elif spec.family != MIXED:
            self._adopt(spec.family, build_host(spec, observers=observers))
        else:
            self.host = None  # each family's host is built when its first item comes

    def _adopt(self, family: str, host: RolloutHost) -> RolloutHost:
        if self.spec.capsule_dir and host.capsule_source is None:
            host.capsule_source = self._saved_capsule
        self.hosts[family] = self.host = host
        return host

    def _host_for(self, item: WorkItem) -> RolloutHost:
        """The host that plays `item`: its family's (built on first use in a mixed-family run)."""
        if self.spec.env:
            return self.host  # one env: every item plays on it
        family = item.family or self.spec.family
        if family == MIXED:
            raise ValueError(f"{item.episode_id}: a mixed-family run needs each work item's family")
        if family not in self.hosts:
            self._adopt(family, build_host(dataclasses.replace(self.spec, family=family), observers=self._observers))
        return self.hosts[family]

    def ready(self) -> int:
        """Answers once the actor is placed and its host built (the driver waits for it); a mixed-family
        actor builds each family's host with that family's first item."""
        return os.getpid()

    pid = ready

    def _saved_capsule(self, key: str, seed: int):
        """A seed's initial capsule saved under `capsule_dir` (by this or another actor), or None."""
        path = capsule_path(self.spec.capsule_dir, self.host.task, seed)
        if not path.exists():
            return None
        try:
            return load_capsule(path)
        except CapsuleError:
            return None  # unreadable: the reset is cold (and writes no new file over it)

    def run(self, item: WorkItem) -> ActorReport:
        """Play one episode (and, sharded, write it to this actor's shard)."""
        return self.run_batch([item])[0]

    def run_batch(self, items: list[WorkItem]) -> list[ActorReport]:
        """Play `items` one after another; sharded, write their episodes to this actor's shard in one commit
        (one Ray call for several episodes: `run_rollouts(episodes_per_call=...)`)."""
        reports = []
        for item in items:
            try:
                self.host = self._host_for(item)
            except Exception as exc:  # a host that cannot be built: this episode failed, the actor goes on
                reports.append(ActorReport(None, "failed", 0.0, 0.0, f"{type(exc).__name__}: {exc}", os.getpid(),
                                           item, {}, self.index, node=self.node))
                continue
            reports.append(self._play(item))
        recorded = [r for r in reports if r.episode is not None]
        if self.shard_root and recorded:
            if self._shard is None:
                self._shard = ShardWriter(self.shard_root, prefix=f"a{self.index:03d}")
            entries = self._shard.write_many([r.episode for r in recorded])
            for report, entry in zip(recorded, entries, strict=True):
                episode = report.episode
                report.shard = entry
                report.episode = Episode({k: v for k, v in episode.steps.items()
                                          if not k.startswith(S.IMAGE_PREFIX)}, episode.meta, episode.extra)
        for item in items:
            self._fault_after_record(item)
        return reports

    def _play(self, item: WorkItem) -> ActorReport:
        try:
            result = self.host.run_episode(item.seed, episode_id=item.episode_id, attempt=item.attempt,
                                           repeat=item.repeat)
        except Exception as exc:  # a reset that raised: this episode failed, the actor goes on
            error = f"{type(exc).__name__}: {exc}"
            if _is_cuda_fatal(error):
                os._exit(3)  # the CUDA context is dead: Ray restarts the process, the driver re-runs the item
            return ActorReport(None, "failed", 0.0, 0.0, error, os.getpid(), item, {}, self.index, node=self.node)
        if _is_cuda_fatal(result.error):
            os._exit(3)
        save_initial_capsule(self.host, self.spec, item.seed)
        return ActorReport(episode=result.episode, reset_kind=result.reset_kind, reset_ms=result.reset_ms,
                           steps_per_s=result.steps_per_s, error=result.error, actor_pid=os.getpid(), item=item,
                           extra=result.extra, actor_index=self.index, node=self.node)

    def _fault_after_record(self, item: WorkItem) -> None:
        """Fault injection (`HostSpec.crash` in mode `exit_after_record`): exit once the episode is played and
        written to this actor's shard, before the driver hears of it."""
        crash = self.spec.crash
        if len(crash) == 4 and crash[3] == FAULT_AFTER_RECORD and crash[0] == item.episode_id:
            marker = Path(crash[2])
            if not marker.exists():
                marker.write_text(f"{FAULT_AFTER_RECORD}\n")
                os._exit(1)

    def close_shard(self) -> None:
        """Close this process's shard writer (every episode it returned is committed to the shard already)."""
        if self._shard is not None:
            self._shard.close()
            self._shard = None

    def close(self) -> None:
        self.close_shard()
        for host in self.hosts.values():
            host.close()


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
                                item.repeat, base, item.family))
        if item.attempt == 0 and item.repeat + 1 < self.repeats:
            out.append(WorkItem(follow_up_id(base, 0, item.repeat + 1), item.seed, 0, item.repeat + 1, base,
                                item.family))
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
    past `episode_timeout_s`, is handed out again (up to `max_attempts` tries). `actor_cls`: the actor class
    (a `RolloutActor` subclass with the same constructor: a benchmark's synthetic actor).

    `episodes_per_call`: items handed to an actor in one Ray call (its reports come back together; the
    deadline of the call is `episode_timeout_s` per item, and if the actor dies every item of the call is
    handed out again). More than 1 spreads Ray's per-call cost in the driver over several episodes: for
    short episodes and many actors.
    """
    if actors < 0:
        raise ValueError(f"actors must be >= 0, got {actors}")
    if repeats < 1 or attempts < 1:
        raise ValueError(f"repeats and attempts must be >= 1, got {repeats}, {attempts}")
    if episodes_per_call < 1:
        raise ValueError(f"episodes_per_call must be >= 1, got {episodes_per_call}")
    if episode_timeout_s is not None and not episode_timeout_s > 0:
        raise ValueError(f"episode_timeout_s must be > 0 or None, got {episode_timeout_s}")
    items = list(items)
    ids = [it.episode_id for it in items]
    if len(set(ids)) != len(ids):
        raise ValueError("work items must have unique episode ids")
    plan = _Plan(items, repeats, attempts, done or {})
    shard_root = recorder.shard_root if isinstance(recorder, ShardedStore) else ""
    if actors == 0:
        return _run_local(spec, plan, recorder, host, on_report, shard_root, actor_cls)
    return _run_ray(spec, plan, actors=actors, recorder=recorder, shard_root=shard_root, actor_cls=actor_cls,
                    cpus_per_actor=cpus_per_actor, gpus_per_actor=gpus_per_actor, max_restarts=max_restarts,
                    max_attempts=max_attempts, episode_timeout_s=episode_timeout_s,
                    placement_timeout_s=placement_timeout_s, on_report=on_report,
                    episodes_per_call=episodes_per_call)


def _run_local(spec, plan: _Plan, recorder, host, on_report, shard_root, actor_cls):
    actor = actor_cls(spec, host=host, shard_root=shard_root)
    stats, reports = DriverStats(actors_placed=1), []
    try:
        while plan:
            item = plan.take(0)
            report = actor.run(item)
            _record([report], recorder, stats)
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
    pool = [remote_cls.remote(spec, i, shard_root=shard_root) for i in range(actors)]
    idle: deque[int] = deque()
    in_flight: dict = {}  # object ref -> (actor index, items, deadline or None)
    probes: dict = {ray_actor.ready.remote(): i for i, ray_actor in enumerate(pool)}  # placed and built?
    alive = set(range(actors))
    placed: set[int] = set()
    tries: dict[str, int] = {}
    timed_out: set = set()
    stats = DriverStats()
    reports: list[ActorReport] = []
    started = time.monotonic()
    try:
        while plan or in_flight:
            while plan and idle:
                index = idle.popleft()
                batch = [plan.take(index) for _ in range(min(episodes_per_call, len(plan)))]
                for item in batch:
                    tries[item.episode_id] = tries.get(item.episode_id, 0) + 1
                deadline = None if episode_timeout_s is None else time.monotonic() + episode_timeout_s * len(batch)
                in_flight[pool[index].run_batch.remote(batch)] = (index, batch, deadline)
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
                    if "creation task" in str(exc) or index not in placed:  # the host could not be built
                        raise RuntimeError(f"a rollout actor could not start: {exc}") from exc
                    alive.discard(index)  # out of restarts
                    if not alive:
                        raise RuntimeError(f"every rollout actor died; {len(plan)} episodes were not run") from None
                continue
            index, batch, _ = in_flight.pop(ref)
            try:
                got = ray.get(ref)
            except (RayActorError, ActorDiedError, ActorUnavailableError) as exc:
                if "creation task" in str(exc):  # the host could not be built: retrying will not help
                    raise RuntimeError(f"a rollout actor could not start: {exc}") from exc
                stats.actor_failures += 1
                why = f"ran past the {episode_timeout_s} s deadline" if ref in timed_out else f"{exc}"
                for item in reversed(batch):  # re-run them first, in order, on the next actors that are ready
                    if tries[item.episode_id] >= max_attempts:
                        raise RuntimeError(f"episode {item.episode_id} failed {max_attempts} times; "
                                           f"last: {why}") from exc
                    stats.resubmitted += 1
                    plan.retry(item)
                probes[pool[index].ready.remote()] = index  # Ray restarts this one meanwhile
                continue
            idle.append(index)
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
    deadlines = [d for _, _, d in in_flight.values() if d is not None]
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
    for ref, (index, _batch, deadline) in list(in_flight.items()):
        if deadline is not None and now >= deadline and ref not in timed_out:
            timed_out.add(ref)
            stats.timeouts += 1
            ray.kill(pool[index], no_restart=False)  # Ray restarts it; the pending call then fails


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
