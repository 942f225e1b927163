"""`RolloutActor`: one rollout host in a process (a Ray actor's, or the driver's with `actors=0`), and what
it is handed and returns: `WorkItem` (seed, episode id, attempt, repeat, task) and `ActorReport`.

The actor plays one item per call (or K, `run_batch`; with `RunSpec.slots` > 1 the K items are played on the
host's slots side by side, `rollout.slots.host`, and the actor holds two calls at once, both played from one feed:
`rollout.slots.calls`), builds the host for the item's task when a run over several of a suite's tasks
(`RunSpec.env` `suite:*`) first needs it (with slots, one slot host for every task), records its episode to its
own shard when the store is sharded, and turns a fatal CUDA error into the end of its process (the context is unusable;
the driver re-runs the episode on a fresh one). The driver that places actors and hands them items is
`rollout.ray_rollout`.

In a Ray actor the host is built and played on a thread of its own ("rollout-play"), and once the driver has
said how (`watch`), the thread that took the call watches the phase clocks of the hosts (`rollout.phase_clock`)
against their deadlines (`rollout.deadlines`): a phase past its deadline ends the call at once with the items
done, the hung one (`ActorReport.hang`: phase, step, seconds) and the rest unplayed; the driver then kills the
actor (its play thread is stuck) and Ray restarts it.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ray
import torch

from capsule_rollout.capsules import CapsuleError, load_capsule, signing_key
from capsule_rollout.rollout.host_factory import (
    ANY_TASK,
    RunSpec,
    build_host,
    build_slots,
    env_for_task,
    is_multi_task,
)
from capsule_rollout.rollout.observer import EpisodeObserver
from capsule_rollout.rollout.phase_clock import (
    BUILD,
    CAPSULE_SAVE,
    WRITE,
    Hang,
    PhaseClock,
    Times,
    combined_times,
    combined_totals,
)
from capsule_rollout.rollout.rollout_host import RolloutHost, capsule_key
from capsule_rollout.rollout.run_capsules import capsule_path, save_initial_capsule
from capsule_rollout.rollout.run_trust import check_label
from capsule_rollout.rollout.slots.calls import WATCH_POLL_S, SlotCalls
from capsule_rollout.rollout.slots.host import SlotHost
from capsule_rollout.stores import episode_schema as S
from capsule_rollout.stores.episode import Episode
from capsule_rollout.stores.shard_manifest import ManifestEntry
from capsule_rollout.user_code import describe, user_frames

if TYPE_CHECKING:  # it imports this module
    from capsule_rollout.rollout.deadlines import DeadlineSettings, PhaseDeadlines
    from capsule_rollout.stores.sharded_store import ShardWriter

CUDA_FATAL: tuple[type[BaseException], ...] = (torch.AcceleratorError,)
"""What torch (>= 2.8, the project's floor) raises when the CUDA context is dead (an illegal access, a
device-side assert, a failed launch): the process cannot go on."""


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
    task: str = ""
    """The task this episode plays: needed in a run over several of a suite's tasks (`RunSpec.env` `suite:*`),
    where each actor keeps a host per task; empty: the spec's env."""

    @property
    def base_id(self) -> str:
        return self.base or self.episode_id

    @property
    def plays(self) -> int:
        """Episodes of at most the host's step limit this item plays (its deadline scales with it): 1."""
        return 1


def follow_up_id(base: str, attempt: int, repeat: int) -> str:
    """Episode id of a seed's repeat / retry: `base`, `base-r1`, `base-a1`, `base-r1-a2`..."""
    return base + (f"-r{repeat}" if repeat else "") + (f"-a{attempt}" if attempt else "")


@dataclass
class ActorReport:
    """What an actor returns per episode (the episode itself plus host figures)."""

    episode: object  # stores.episode.Episode (None when it failed before its first step); without images when
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
    steps: int = 0  # control steps the item played (a branch item: its replays and branches too)
    busy_s: float = 0.0  # the actor's seconds on the item: host built, reset, steps, its share of the shard write
    step_limit: int = 0  # the host's step limit of one episode (0: no host); with `steps`, `busy_s`: the deadlines
    phases: Times = field(default_factory=dict)  # the longest phase times measured in the call (each report of a
    # call carries the same): what the driver learns the deadlines from
    part_s: dict = field(default_factory=dict)  # seconds in each phase and part (`phase_clock.PARTS`) since the
    # actor's last call ended, on the first report of a call only (the run's summary adds them up: `time_by_part`)
    hang: Hang | None = None  # this item hung there (no episode); the actor's play thread is stuck: kill it
    unplayed: bool = False  # the call ended (another item hung) before this one was played: hand it out again
    traceback: str = ""  # the user's own frames of the exception behind `error` (`user_code.user_frames`)

    @property
    def errored(self) -> bool:
        """Whether the item ended in an error: lost (nothing recorded) or an episode stopped by one."""
        return self.episode is None or (self.episode.meta.stop_reason == S.StopReason.ERROR.value)


@dataclass(frozen=True)
class StartFailure:
    """Why an actor's host could not be built: the error's line and the user's own frames."""

    error: str
    traceback: str = ""


def _in_ray_actor() -> bool:
    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


def _is_cuda_fatal(exc: BaseException | None) -> bool:
    """Whether `exc`, or what caused it, is a dead CUDA context (by type)."""
    while exc is not None:
        if isinstance(exc, CUDA_FATAL):
            return True
        exc = exc.__cause__
    return False


class RolloutActor(SlotCalls):
    """One rollout host in its own process (or in this one); `run(item)` plays one episode."""

    side_by_side = True
    """With slots: a call's items play side by side (a subclass whose items use the slots otherwise says False)."""

    def __init__(self, spec: RunSpec, index: int = 0, *, host: RolloutHost | None = None,
                 observers: list[EpisodeObserver] | None = None, shard_root: str = "",
                 capsule_key: bytes | None = None) -> None:
        """`host`: a host built by the caller (in-process use); else one is built from `spec`. `shard_root`: a
        sharded store's root; each episode is then written to this process's own shard there. `capsule_key`: what
        the seeds' initial capsules are signed and checked with (the driver's; `capsules.signing_key()` when None)."""
        self.spec, self.index = spec, index
        self.capsule_key = capsule_key if capsule_key is not None else signing_key()
        self.shard_root = shard_root
        self.clock = PhaseClock()  # the actor's own phases: building a host, writing the shard
        self._deadlines: PhaseDeadlines | None = None  # once a call came with deadlines to watch
        self._deadlines_lock = threading.Lock()  # two calls at once (slots) each bring theirs
        # in a Ray actor: build, play and close on one thread of its own, so that the call's thread can watch
        self._player = ThreadPoolExecutor(1, thread_name_prefix="rollout-play") if _in_ray_actor() else None
        self._current: int | None = None  # the index in the call of the item played (or its host built) now
        self._done: dict[int, ActorReport] = {}  # the call's items played so far
        self._init_slot_calls()  # with slots: every call's items played from one feed (`rollout.slots.calls`)
        self.node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
        self._shard: ShardWriter | None = None
        self._saver: ThreadPoolExecutor | None = None  # signs and saves the seeds' initial capsules (`_save_later`)
        self._saving: list[Future] = []
        if spec.pin_cores and hasattr(os, "sched_setaffinity"):
            cores = sorted(os.sched_getaffinity(0))
            os.sched_setaffinity(0, {cores[index % len(cores)]})
        if spec.device.startswith("cuda") and ray.is_initialized():
            gpu_ids = ray.get_gpu_ids()  # MuJoCo's EGL ignores CUDA_VISIBLE_DEVICES: render on our GPU
            if gpu_ids:
                os.environ.setdefault("MUJOCO_EGL_DEVICE_ID", str(int(float(gpu_ids[0]))))
        if spec.slots > 1 and observers is not None:
            raise ValueError(f"{spec.slots} slots keep an observer each: name them in RunSpec.observers (import paths "
                             "built in each slot), not as objects")
        self._observers = observers
        self.hosts: dict[str, RolloutHost | SlotHost] = {}  # task -> its host (several in a `suite:*` run)
        self.start_failure: StartFailure | None = None
        if host is not None:
            self._adopt(host.task if is_multi_task(spec.env) else "", host)
        elif not is_multi_task(spec.env):
            try:
                self._adopt("", self._on_player(self._build, spec))
            except Exception as exc:
                if not _in_ray_actor():
                    raise
                # told to the driver by `ready` in one line and the user's frames (not Ray's traceback of a
                # constructor that raised)
                self.host, self.start_failure = None, StartFailure(*describe(exc))
        else:
            self.host = None  # each task's host is built when its first item comes

    def _on_player(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` on the play thread (here, in-process)."""
        return fn(*args) if self._player is None else self._player.submit(fn, *args).result()

    def _build(self, spec: RunSpec) -> RolloutHost | SlotHost:
        return build_slots(spec) if spec.slots > 1 else build_host(spec, observers=self._observers)

    def _adopt(self, task: str, host: RolloutHost | SlotHost) -> RolloutHost | SlotHost:
        for slot in host.every_host if isinstance(host, SlotHost) else [host]:
            self._source(slot)
        if isinstance(host, SlotHost):
            host.prepare = self._source  # a slot's host for another task, made when the slot first plays it
        self.hosts[task] = self.host = host
        return host

    def _source(self, host: RolloutHost) -> None:
        """Give `host` the seeds' initial capsules saved under `capsule_dir` (its own task's)."""
        if self.spec.capsule_dir and host.capsule_source is None:
            host.capsule_source = lambda key, seed: self._saved_capsule(host.task, seed)

    def _host_for(self, item: WorkItem) -> RolloutHost:
        """The host that plays `item`: its task's (built on first use in a `suite:*` run)."""
        if not is_multi_task(self.spec.env):
            return self.host  # one env: every item plays on it
        if not item.task:
            raise ValueError(f"{item.episode_id}: a run over several tasks ({self.spec.env}) needs each work "
                             "item's task")
        if self.spec.slots > 1:  # one slot host for every task: a slot plays any task's item
            if ANY_TASK not in self.hosts:
                self.clock.enter(BUILD)
                try:
                    built = build_slots(self.spec, task=item.task)
                finally:
                    self.clock.enter(None)
                self._adopt(ANY_TASK, built)
            return self.hosts[ANY_TASK]
        if item.task not in self.hosts:
            self.clock.enter(BUILD)
            try:
                built = self._build(dataclasses.replace(self.spec, env=env_for_task(self.spec.env, item.task)))
            finally:
                self.clock.enter(None)
            self._adopt(item.task, built)
        return self.hosts[item.task]

    def ready(self) -> int | StartFailure:
        """Answers once the actor is placed and its host built (the driver waits for it): its process id, or why
        its host could not be built; in a `suite:*` run the actor builds each task's host with that task's first
        item."""
        return self.start_failure if self.start_failure is not None else os.getpid()

    pid = ready

    def watch(self, settings: DeadlineSettings, times: Times) -> None:
        """Watch every call from now on: its phases against deadlines (`rollout.deadlines.DeadlineSettings`)
        learned from `times` (what the driver has learned) and from what this actor measures. The driver hands
        them with each call (`run_batch(items, watch=...)`): a separate call could run after the one it was
        meant for (an actor of slots takes two calls at once, in no set order), which then went unwatched."""
        from capsule_rollout.rollout.deadlines import PhaseDeadlines  # it imports this module

        with self._deadlines_lock:
            if self._deadlines is None or self._deadlines.settings != settings:
                self._deadlines = PhaseDeadlines(settings)
            self._deadlines.merge(times)

    def _saved_capsule(self, task: str, seed: int):
        """A seed's initial capsule of `task` saved under `capsule_dir` (by this or another actor), or None."""
        path = capsule_path(self.spec.capsule_dir, task, seed)
        if not path.exists():
            return None
        try:
            capsule = load_capsule(path, key=self.capsule_key)
        except CapsuleError:
            return None  # unreadable, or not signed with the run's key: the reset is cold (no new file over it)
        try:
            check_label(capsule, capsule_key(task, seed), path)
        except ValueError as exc:  # signed, but for another seed or task (moved or swapped): a cold reset
            warnings.warn(str(exc), stacklevel=1)
            return None
        return capsule

    def run(self, item: WorkItem) -> ActorReport:
        """Play one episode (and, sharded, write it to this actor's shard)."""
        return self.run_batch([item])[0]

    def run_batch(self, items: list[WorkItem], watch: tuple[DeadlineSettings, Times] | None = None
                  ) -> list[ActorReport]:
        """Play `items` (one after another; with slots, side by side on the slots); sharded, write their episodes to
        this actor's shard in one commit (one Ray call for several episodes: `run_rollouts(episodes_per_call=...)`).
        The reports come back in the items' order. Watched (`watch`: the deadlines' settings and the phase times
        the driver has learned, given with the call), a phase past its deadline ends the call: the hung item's
        report says where (`hang`), the items not played are marked `unplayed`."""
        if watch is not None:
            self.watch(*watch)
        if self.spec.slots > 1 and self.side_by_side:
            return self._run_slot_call(items)
        if self._player is None:
            return self._play_batch(items)
        future = self._player.submit(self._play_batch, items)
        while True:
            try:
                return future.result(timeout=WATCH_POLL_S)
            except FutureTimeout:
                found = None if self._deadlines is None else self._overrun()  # watched from when deadlines come
                if found is not None:
                    return self._hung(items, *found)

    def _play_batch(self, items: list[WorkItem]) -> list[ActorReport]:
        self._done, self._current = {}, None
        reports = self._play_each(items)
        self._current = None
        self._write_shard(reports)
        self._saved()
        self._learned(reports)
        return reports

    def _clocks(self) -> list[PhaseClock]:
        """Every phase clock of this actor: its own, its hosts' (a slot host's and each slot's)."""
        clocks = [self.clock]
        for host in list(self.hosts.values()):
            if isinstance(host, SlotHost):
                clocks += [host.clock, *(slot.clock for slot in host.every_host)]
            elif isinstance(getattr(host, "clock", None), PhaseClock):
                clocks.append(host.clock)
        return clocks

    def _learned(self, reports: list[ActorReport]) -> None:
        """Attach the call's phase times to its reports (the driver learns from them), and learn them here too."""
        clocks = self._clocks()
        phases = combined_times(clocks)
        for report in reports:
            report.phases = phases
        if reports:
            reports[0].part_s = combined_totals(clocks)
        with self._deadlines_lock:
            if self._deadlines is not None:
                self._deadlines.merge(phases)

    def _overrun(self) -> tuple[PhaseClock, Hang] | None:
        """A clock whose phase has run past its deadline, and where, or None."""
        from capsule_rollout.rollout.deadlines import PhaseDeadlines

        with self._deadlines_lock:
            deadlines = PhaseDeadlines(self._deadlines.settings)
            deadlines.merge(self._deadlines.snapshot())
        clocks = self._clocks()
        for clock in clocks:  # what this call measured so far counts at once
            deadlines.merge({phase: (t[0], t[1]) for phase, t in clock.peek_times().items()})
        now = time.perf_counter()
        for clock in clocks:
            phase, since, first = clock.now
            if phase is None:
                continue
            limit = deadlines.phase_s(phase, first)
            if now - since > limit:
                return clock, Hang(phase, int(clock.step()), now - since, limit, first)
        return None

    def _hung(self, items: list[WorkItem], clock: PhaseClock, hang: Hang) -> list[ActorReport]:
        """The reports of a call that hung: the items done, the hung ones, the rest unplayed (the play thread
        stays stuck; the driver kills this actor)."""
        done = {} if hang.phase == WRITE else dict(self._done)  # a shard write that hung: none of them is recorded
        hung = [k for k in self._hung_items(clock, len(items)) if k not in done]
        if not hung:  # no item to blame: every item not done is
            hung = [k for k in range(len(items)) if k not in done]
        reports = self._hang_reports(items, done, hung, hang)
        self._write_shard([r for r in reports if r.episode is not None])
        self._saved()  # the items done go back recorded: their capsules saved first
        self._learned(reports)
        return reports

    def _hang_reports(self, items: list[WorkItem], done: dict[int, ActorReport], hung: list[int],
                      hang: Hang) -> list[ActorReport]:
        """A call's reports when `hang` ended it: the items done as they are, the hung ones lost where they hung,
        the rest unplayed (handed out again)."""
        reports = []
        for k, item in enumerate(items):
            if k in hung:
                report = self._lost(item, str(hang))
                report.hang = hang
            elif k in done:
                report = done[k]
            else:
                report = self._lost(item, f"not played: the call ended when another item {hang}")
                report.unplayed = True
            reports.append(report)
        return reports

    def _hung_items(self, clock: PhaseClock, n: int) -> list[int]:
        """The indices in the call of the items a hung `clock` was playing (one item after another)."""
        current = self._current
        return [current] if current is not None else list(range(n))  # none: the shard write, all of them

    def _lost(self, item: WorkItem, error: str, frames: str = "") -> ActorReport:
        return ActorReport(None, "failed", 0.0, 0.0, error, os.getpid(), item, {}, self.index, node=self.node,
                           traceback=frames)

    def _play_each(self, items: list[WorkItem]) -> list[ActorReport]:
        reports = []
        for k, item in enumerate(items):
            self._current = k
            t0 = time.perf_counter()
            try:
                self.host = self._host_for(item)
            except Exception as exc:  # a host that cannot be built: this episode failed, the actor goes on
                report = self._lost(item, *describe(exc))
            else:
                report = self._play(item)
            report.busy_s = time.perf_counter() - t0
            report.step_limit = self.host.step_limit if self.host is not None else 0
            reports.append(report)
            self._done[k] = report
        return reports

    def _failed(self, item: WorkItem, exc: BaseException) -> ActorReport:
        if _is_cuda_fatal(exc):
            os._exit(3)  # the CUDA context is dead: Ray restarts the process, the driver re-runs the item
        return self._lost(item, *describe(exc))

    def _write_shard(self, reports: list[ActorReport]) -> None:
        recorded = [r for r in reports if r.episode is not None]
        if self.shard_root and recorded:
            if self._shard is None:
                from capsule_rollout.stores.sharded_store import ShardWriter  # zarr: only a sharded run's actors

                self._shard = ShardWriter(self.shard_root, prefix=f"a{self.index:03d}")
            t0 = time.perf_counter()
            self.clock.enter(WRITE)
            try:
                entries = self._shard.write_many([r.episode for r in recorded])
            finally:
                self.clock.enter(None)
            share = (time.perf_counter() - t0) / len(recorded)
            for report, entry in zip(recorded, entries, strict=True):
                episode = report.episode
                report.shard = entry
                report.busy_s += share
                report.episode = Episode({k: v for k, v in episode.steps.items()
                                          if not k.startswith(S.IMAGE_PREFIX)}, episode.meta, episode.extra)

    def _play(self, item: WorkItem) -> ActorReport:
        try:
            result = self.host.run_episode(item.seed, episode_id=item.episode_id, attempt=item.attempt,
                                           repeat=item.repeat)
        except Exception as exc:  # a reset that raised: this episode failed, the actor goes on
            return self._failed(item, exc)
        return self._report(item, result, self.host)

    def _report(self, item: WorkItem, result, host: RolloutHost) -> ActorReport:
        if _is_cuda_fatal(result.exception):
            os._exit(3)
        self._save_later(host, item.seed, result.initial_capsule)
        return ActorReport(episode=result.episode, reset_kind=result.reset_kind, reset_ms=result.reset_ms,
                           steps_per_s=result.steps_per_s, error=result.error, actor_pid=os.getpid(), item=item,
                           extra=result.extra, actor_index=self.index, node=self.node,
                           steps=result.episode.meta.length if result.episode is not None else 0,
                           traceback=user_frames(result.exception) if result.exception is not None else "")

    def _save_later(self, host: RolloutHost, seed: int, capsule) -> None:
        """The seed's initial capsule signed and saved in the run's directory (once) on the saver's thread: the
        serializing, signing and the file's fsync off the play's path. A capsule never changes once made (the store
        replaces, never edits, what it holds), so the thread may take it as it is. `_saved` waits for every save
        before a call's reports go back: an episode is never recorded without its capsule on disk."""
        if not self.spec.capsule_dir or not getattr(host.env, "restorable", True):
            return
        if capsule is None:
            capsule = host.initial_capsule  # the store may have dropped it already (a budget)
        if capsule is None:  # nothing to save (the thread must not read the host's capsule later: another seed's)
            return
        if self._saver is None:
            self._saver = ThreadPoolExecutor(1, thread_name_prefix="capsule-save")
        self._saving.append(self._saver.submit(save_initial_capsule, host, self.spec, seed, capsule,
                                               key=self.capsule_key))

    def _saved(self) -> None:
        """Wait for every capsule handed to the saver (its time waited counted as `capsule_save`); a save that
        failed raises here, failing the call as it would have where it was made."""
        t0 = time.perf_counter()
        saving, self._saving = self._saving, []
        try:
            for future in saving:
                future.result()
        finally:
            self.clock.add(CAPSULE_SAVE, time.perf_counter() - t0)

    def close_shard(self) -> None:
        """Close this process's shard writer (every episode it returned is committed to the shard already)."""
        if self._shard is not None:
            self._shard.close()
            self._shard = None

    def close(self) -> None:
        self.close_shard()
        if self._saver is not None:
            self._saved()
            self._saver.shutdown(wait=True)
            self._saver = None
        self._on_player(self._close_hosts)
        if self._player is not None:
            self._player.shutdown(wait=False)

    def _close_hosts(self) -> None:
        for host in self.hosts.values():
            host.close()

