"""`SlotHost`: N env slots in one process, their policy and critic calls batched into one per round.

Each slot is a `RolloutHost` of its own: its env, its arena (env, the slot's policy and critic rows, the
host's queue and hand-off block), its subtask channel, planner, operator, observers and episode. What
the slots share: the policy and critic of N rows (`rows`: `act_rows(active)` / `evaluate_rows(active)`,
e.g. `PolicyRuntime.batched(N)`, or `LoopRows` over N instances of a policy that does not batch), the
capsule store (a seed's initial capsule is made once and restores into any slot), the recorder and one
execution context for the lanes.

The loop is the one `RolloutHost` runs: each slot plays a work item through the host's own generator
(`episode_steps`, `branch_steps`), which yields where it needs a chunk. A round advances every busy slot
to its next request; the slots that asked are then served by one batched policy call and one batched
critic call (on the two lanes), and each goes on. A slot whose episode ends takes the next item at once
(a restore of that item's initial capsule into the slot) and joins the same round's call, so slots out of
phase never wait for each other. An error in one slot's episode is recorded in that slot's episode; an
error of the batched call is recorded in each slot that asked for it. A host of one slot is a
`RolloutHost` driving itself (`RolloutHost._drive`): the same loop.

`env_threads` W > 1 advances the slots between calls on W threads (slot i always on thread i mod W, so a
slot's GL context stays on one thread): an env whose stepping releases the GIL (MuJoCo's `mj_step`, its
rendering) then steps its slots in parallel. The store and the recorder are shared under a lock. Which slot
plays which item then depends on timing; what each item plays does not.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from capsule_rollout.capsules import Capsule, fork
from capsule_rollout.policies.execution_context import TwoLaneContext
from capsule_rollout.rollout.host_config import EpisodeResult, two_lanes
from capsule_rollout.rollout.observer import EpisodeObserver
from capsule_rollout.rollout.phase_clock import CHUNK, PhaseClock
from capsule_rollout.rollout.rollout_host import RolloutHost
from capsule_rollout.rollout.slots.work import Ahead, Feed, Job, episode_job

ROWS_REPORT = "slots"
"""The key of a slot host's record in every episode result's `extra` it plays (it travels back from a Ray actor in
the report): `slots`, `policy_instances` and `critic_instances` (models behind the rows: 1 for rows that batch, one
per slot for `LoopRows`), how the policy's rows are called (`policy_calls`: the rows' `mode`, e.g. a LeRobot
policy's), the process and the host (`instances_by_actor` sums them per actor)."""


class LoopRows:
    """N instances of a policy (or critic) that takes one observation per call, as rows: each slot acts through
    its own instance, one after another (what a row computes is then the same for any N)."""

    def __init__(self, parts: Sequence[Any]) -> None:
        if not parts:
            raise ValueError("LoopRows needs at least one instance")
        self.parts = list(parts)
        self.rows = len(self.parts)

    @property
    def instances(self) -> int:
        """Policy (or critic) instances behind the rows: one per slot."""
        return len(self.parts)

    def slot(self, i: int) -> Any:
        return self.parts[i]

    def act_rows(self, active: Sequence[int]) -> list:
        out: list = [None] * self.rows
        for i in active:
            out[i] = self.parts[i].act()
        return out

    def evaluate_rows(self, active: Sequence[int]) -> list:
        out: list = [None] * self.rows
        for i in active:
            out[i] = self.parts[i].evaluate()
        return out


def instances(rows: Any) -> int:
    """The model instances behind a host's rows: their `instances` (`LoopRows`: one per slot), else 1 (one batched
    model serves every row)."""
    return int(getattr(rows, "instances", 1))


def instances_by_actor(reports: Iterable[Any]) -> dict[str, dict[str, int]]:
    """Per actor (its index, or its process): the policy and critic instances of the slot hosts that played its
    reports (summed over its hosts: a run over several tasks builds one per task); {} when no report came from a
    slot host."""
    hosts: dict[str, dict[str, dict]] = {}
    for report in reports:
        record = getattr(report, "extra", {}).get(ROWS_REPORT)
        if record is not None:
            actor = str(report.actor_index if report.actor_index >= 0 else record["pid"])
            hosts.setdefault(actor, {})[record["host"]] = record
    return {actor: {"policy": sum(r["policy_instances"] for r in mine.values()),
                    "critic": sum(r["critic_instances"] for r in mine.values()), "slots": max(
                        r["slots"] for r in mine.values())}
            for actor, mine in sorted(hosts.items())}


def rows_filled(reports: Iterable[Any]) -> dict[str, float | int] | None:
    """How full the batched calls of the slot hosts that played `reports` were, over every host (each report
    carries its host's tallies so far; the latest of each host counts): calls, the share of their rows that
    served a slot, and the same for the calls made while an item waited for a slot. None: no slot host."""
    hosts: dict[str, dict] = {}
    for report in reports:
        record = getattr(report, "extra", {}).get(ROWS_REPORT)
        if record is not None and "calls" in record and record["calls"] >= hosts.get(record["host"], {}).get(
                "calls", -1):
            hosts[record["host"]] = record
    if not hosts:
        return None
    total = lambda key: sum(r[key] for r in hosts.values())  # noqa: E731
    rows = lambda key: sum(r[key] * r["slots"] for r in hosts.values())  # noqa: E731
    return {"hosts": len(hosts), "calls": total("calls"), "call_s": total("call_s"),
            "rows_filled": total("rows_served") / rows("calls") if total("calls") else 0.0,
            "calls_with_work_left": total("calls_with_work_left"),
            "rows_filled_with_work_left": total("rows_with_work_left") / rows("calls_with_work_left")
            if total("calls_with_work_left") else 0.0}


def rows_of(part: Any, n: int, make: Callable[[], Any]) -> Any:
    """`part` for `n` slots: its own `batched(n)` when it has one (and does not say `batches = False`), else
    `LoopRows` over `part` and `n - 1` more
    instances from `make()`."""
    if callable(getattr(part, "batched", None)) and getattr(part, "batches", True):
        return part.batched(n)
    return LoopRows([part, *(make() for _ in range(n - 1))])


@dataclass
class SlotResult:
    """One finished work item: its index in the work list, the slot that played it, the slot's host that played
    it (its task's) and what it gave (the generator's return value, or the exception it raised)."""

    index: int
    slot: int
    value: Any = None
    error: BaseException | None = None
    host: RolloutHost | None = None
    busy_s: float = 0.0  # its share of the wall time of the rounds it was played in (split among the works of each)


class SlotHost:
    """N slots (`RolloutHost`s built over the rows' slot components) and the rounds that play work on them."""

    def __init__(self, hosts: Sequence[RolloutHost], policy_rows: Any, critic_rows: Any = None,
                 lanes: TwoLaneContext | None = None, env_threads: int = 1,
                 make_slot: Callable[[int, str], RolloutHost] | None = None, task: str = "") -> None:
        """`hosts`: slot i's host over row i of the rows. `make_slot(i, task)`: a host for another task over row i
        (a run over several tasks: a slot plays any task's item, each task's host in a slot made once, when the
        slot first plays that task, and kept; over `policy_rows.slot(i)`, or for `LoopRows` an instance of its
        own); None: every job plays the slots' own task. `task`: the name the jobs give the hosts' task (default:
        their `task`)."""
        if not hosts:
            raise ValueError("a slot host needs at least one slot")
        if policy_rows.rows != len(hosts) or (critic_rows is not None and critic_rows.rows != len(hosts)):
            raise ValueError(f"{len(hosts)} slots need rows for as many; the policy has {policy_rows.rows}"
                             + (f", the critic {critic_rows.rows}" if critic_rows is not None else ""))
        for i, host in enumerate(hosts):
            if host.policy is not policy_rows.slot(i) or (critic_rows is not None and host.critic is not
                                                          critic_rows.slot(i)):
                raise ValueError(f"slot {i}'s host must act through row {i} of the rows (policy_rows.slot({i}))")
        if env_threads < 1:
            raise ValueError(f"env_threads must be >= 1, got {env_threads}")
        self.hosts = list(hosts)  # what each slot plays now
        self.by_task: list[dict[str, RolloutHost]] = [{task or host.task: host} for host in self.hosts]  # each slot's
        self.playing_task = [task or host.task for host in self.hosts]  # what each slot's host now plays
        self.make_slot = make_slot
        self.prepare: Callable[[RolloutHost], None] | None = None  # called on each host `make_slot` makes
        self.policy_rows, self.critic_rows = policy_rows, critic_rows
        self._lock = threading.RLock()
        threads = min(env_threads, len(self.hosts))
        self._workers = None if threads == 1 else [
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"slots-{w}") for w in range(threads)]
        if self._workers is not None:
            for host in self.hosts:
                host.shared = self._lock
        self.lanes = lanes if lanes is not None or critic_rows is None else TwoLaneContext(hosts[0].policy.device)
        self.config = hosts[0].config
        self.store = hosts[0].store
        self.calls = 0  # batched calls made
        self.rows_served = 0  # slots served by them (the batch's fill: rows_served / calls / slots)
        self.calls_with_work_left = 0  # calls made while an item waited for a slot (none had begun it yet)
        self.rows_with_work_left = 0  # the slots those calls served (full rows: `slots` each)
        self.call_s = 0.0  # seconds in the batched calls (the policy's and critic's share of the host's time)
        self.on_call: Callable[[list[int]], None] | None = None  # told the active slots of each call (tests)
        self.clock = PhaseClock()  # the batched calls' phase (each slot's host has its own), for a watchdog
        self.playing: dict[int, int] = {}  # slot -> the index of the work it plays now (in `play`'s jobs)
        self._chunks: Any = None
        self._values: Any = None
        self.report = {"slots": len(self.hosts), "policy_instances": instances(policy_rows),
                       "critic_instances": 0 if critic_rows is None else instances(critic_rows),
                       "policy_calls": str(getattr(policy_rows, "mode", "one instance per slot" if isinstance(
                           policy_rows, LoopRows) else "batched")),
                       "pid": os.getpid(), "host": f"{os.getpid()}-{id(self)}"}
        """What every result this host plays carries in `extra[ROWS_REPORT]`."""

    @property
    def slots(self) -> int:
        return len(self.hosts)

    @property
    def task(self) -> str:
        return self.hosts[0].task

    @property
    def env(self):
        return self.hosts[0].env

    @property
    def step_limit(self) -> int:
        return self.hosts[0].step_limit

    @property
    def env_threads(self) -> int:
        return 1 if self._workers is None else len(self._workers)

    @property
    def every_host(self) -> list[RolloutHost]:
        """Every host of every slot (one per task the slot has played), the slots' current ones first."""
        return [*self.hosts, *(host for i, mine in enumerate(self.by_task) for host in mine.values()
                               if host is not self.hosts[i])]

    @property
    def tasks(self) -> list[str]:
        """The tasks some slot has a host for."""
        return sorted({task for mine in self.by_task for task in mine})

    def rows_filled(self) -> dict[str, int]:
        """The batched calls' tallies: calls and the rows they served, and the same for the calls made while an
        item waited for a slot (before the last items began); `rows_filled` sums them over hosts."""
        return {"calls": self.calls, "rows_served": self.rows_served, "call_s": self.call_s,
                "calls_with_work_left": self.calls_with_work_left, "rows_with_work_left": self.rows_with_work_left}

    def _host_in(self, slot: int, task: str) -> RolloutHost:
        """Slot `slot`'s host for `task` (made on first use, kept)."""
        mine = self.by_task[slot]
        host = mine.get(task)
        if host is None:
            if self.make_slot is None:
                raise ValueError(f"this slot host plays {self.task!r}; an item of task {task!r} needs a host made "
                                 "over several tasks (build_slots of a `suite:*` spec)")
            host = self.make_slot(slot, task)
            if self._workers is not None:
                host.shared = self._lock
            if self.prepare is not None:
                self.prepare(host)
            mine[task] = host
        return host

    def _switch(self, slot: int, task: str) -> None:
        """Slot `slot` plays `task` from now on: its host for it, the slot's rows serving that host (a row's slot
        component bound to the host's arena; rows of an instance per slot: the host's own instance)."""
        host = self._host_in(slot, task)
        for rows, part in ((self.policy_rows, host.policy), (self.critic_rows, host.critic)):
            if rows is None:
                continue
            if isinstance(rows, LoopRows):
                rows.parts[slot] = part
            else:
                host.arena.rebind(part.name)
        self.hosts[slot] = host
        self.playing_task[slot] = task

    def close(self) -> None:
        """Close every slot's hosts (on the slot's own thread: a GL context is freed where it is current), then
        the lanes."""
        if self._workers is None:
            for host in self.every_host:
                host.close()
        else:
            closing = [self._workers[i % len(self._workers)].submit(host.close)
                       for i, mine in enumerate(self.by_task) for host in mine.values()]
            for done in closing:
                done.result()
            for worker in self._workers:
                worker.shutdown()
        if self.lanes is not None:
            self.lanes.close()

    # -- capsules per slot ----------------------------------------------------------------
    def snapshot(self, slot: int, label: str = "") -> Capsule:
        """A capsule of one slot (a one-slot capsule: it restores into any slot, or a host of one slot)."""
        return self.hosts[slot].snapshot(label)

    def fork_into(self, capsule: Capsule, slots: Sequence[int]) -> None:
        """Restore `capsule` into each of `slots` (its own arena each; the other slots' state is not touched)."""
        fork(capsule, [self.hosts[i].arena for i in slots])

    def branch(self, slot: int, capsule: Capsule, *, seed: int, noise_seed: int | None = None) -> EpisodeResult:
        """Play on in `slot` from `capsule` (one slot's, taken at a chunk start of an episode of `seed`, in any slot:
        `snapshot`, `BoundaryCapsules`) to the episode's end, alone (`RolloutHost.branch`; None: the episode's own
        noise, an exact replay). `branch_job` plays several side by side (`run_items`)."""
        self._check_slot(slot)
        return self.hosts[slot].branch(capsule, seed=seed, noise_seed=noise_seed)

    def observe(self, observer: EpisodeObserver, slots: Sequence[int] | None = None) -> None:
        """Attach `observer` (an `EpisodeObserver`, e.g. `BoundaryCapsules`) to the hosts of `slots` (None: every
        slot): it sees their episodes from the next one on."""
        for slot in range(self.slots) if slots is None else slots:
            self._check_slot(slot)
            self.hosts[slot].observers.append(observer)

    def _check_slot(self, slot: int) -> None:
        if not (isinstance(slot, int) and 0 <= slot < self.slots):
            raise IndexError(f"slot {slot!r}: this host has slots 0..{self.slots - 1}")

    # -- rounds ---------------------------------------------------------------------------
    def _call(self, active: list[int], work_left: bool = False) -> None:
        if self.on_call is not None:
            self.on_call(list(active))
        self.calls += 1
        self.rows_served += len(active)
        if work_left:
            self.calls_with_work_left += 1
            self.rows_with_work_left += len(active)
        policy, critic = self.policy_rows, self.critic_rows

        def policy_lane() -> None:
            self._chunks = policy.act_rows(active)

        def critic_lane() -> None:
            self._values = critic.evaluate_rows(active)

        self.clock.enter(CHUNK)
        t0 = time.perf_counter()
        try:
            if critic is None:
                policy_lane()
            elif two_lanes(self.config, self.hosts[0].policy.device):
                self.lanes.run(policy_lane, critic_lane)
            else:
                self.lanes.serial(policy_lane, critic_lane)
        finally:
            self.call_s += time.perf_counter() - t0
            self.clock.enter(None)

    def play(self, jobs: Iterable[Job] | Feed) -> Iterator[SlotResult]:
        """Play `jobs` on the slots (each a free slot's next work, in order); yields each as it finishes. A job
        with a `task` (`episode_job(..., task=)`) plays on the slot's host for that task. A `Feed` may be given
        more work while it plays: a slot left free takes it at the next round, and the play ends once every slot
        is free and the feed is empty (`Feed.finish`)."""
        play = _Play(self, jobs if isinstance(jobs, Feed) else Ahead(enumerate(jobs)))
        play.advance_all(play.idle(), first=True)
        yield from play.results()
        queue = play.queue
        while True:
            if queue.has_more() and len(play.running) < self.slots:  # work came (a feed): free slots join this round
                play.advance_all(play.idle(), first=True)
            if not play.waiting:
                if play.running or not queue.finish():  # more work came meanwhile: start it
                    continue
                break
            active = sorted(play.waiting)
            play.waiting.clear()
            play.touched.update(play.running[slot][0] for slot in active)
            try:
                self._call(active, work_left=queue.has_more())
                error = None
            except Exception as exc:  # the batched call failed: each slot that asked records it
                error = exc
            for slot in active:
                host = self.hosts[slot]
                if error is None:
                    host._chunk_out = self._chunks[slot]
                    values = self._values  # a tensor of all rows (batched), or one per slot (LoopRows)
                    host._value_out = None if values is None else (
                        values[slot] if isinstance(values, list) else values[slot: slot + 1])
            play.advance_all([(slot, error) for slot in active])
            yield from play.results()

    def run_items(self, jobs: Iterable[Job]) -> list[SlotResult]:
        """`play` to the end; the results in the order of `jobs`."""
        return sorted(self.play(jobs), key=lambda r: r.index)

    # -- one-slot-host conveniences -------------------------------------------------------
    def run_episode(self, seed: int, *, episode_id: str | None = None, attempt: int = 0,
                    repeat: int = 0) -> EpisodeResult:
        """One episode, in the first slot (the others idle)."""
        [result] = self.run_items([episode_job(seed, episode_id=episode_id, attempt=attempt, repeat=repeat)])
        if result.error is not None:
            raise result.error
        return result.value

    def run(self, seeds: Iterable[int]) -> list[EpisodeResult]:
        results = self.run_items(episode_job(seed) for seed in seeds)
        for result in results:
            if result.error is not None:
                raise result.error
        return [result.value for result in results]


class _Play:
    """One `SlotHost.play`: the work each slot runs (a generator that yields where it needs a batched call), the
    slots waiting for the next call, the work finished this round, and each work's share of the rounds' time.
    The slots advance on the host's env threads (`advance_all`), so what they share is changed under the lock."""

    def __init__(self, host: SlotHost, queue) -> None:
        self.host, self.queue = host, queue
        self.running: dict[int, tuple[int, Generator]] = {}
        self.waiting: list[int] = []
        self.finished: list[SlotResult] = []
        self.lock = host._lock
        self.busy: dict[int, float] = {}  # each work's share of the rounds' wall time so far
        self.touched: set[int] = set()  # the works a slot held during this round
        self.clock = time.perf_counter()

    def advance(self, slot: int, exc: BaseException | None = None, first: bool = False) -> None:
        """Run the slot's generator to its next request; when its work ends, start the slot's next. `first`:
        start the slot's first work (on the slot's own thread: a task's env is made there)."""
        host, lock = self.host, self.lock
        if first and not self.start(slot):
            return
        while True:
            index, steps = self.running[slot]
            try:
                steps.throw(exc) if exc is not None else next(steps)
            except StopIteration as done:
                result = SlotResult(index, slot, value=done.value, host=host.hosts[slot])
                if isinstance(getattr(done.value, "extra", None), dict):
                    done.value.extra[ROWS_REPORT] = {**host.report, **host.rows_filled()}
            except Exception as error:  # the work failed (a reset that raised): this item, not the others
                result = SlotResult(index, slot, error=error, host=host.hosts[slot])
            else:
                with lock:
                    self.waiting.append(slot)
                return
            exc = None
            with lock:
                self.finished.append(result)
                del self.running[slot]
                host.playing.pop(slot, None)
                if not self.start(slot):
                    return

    def start(self, slot: int) -> bool:
        """Give `slot` the queue's next work (on the host for its task); False when there is none."""
        host = self.host
        with self.lock:
            item = next(self.queue, None)
            if item is None:
                return False
            index, job = item
            task = getattr(job, "task", "")
            if task and task != host.playing_task[slot]:
                try:
                    host._switch(slot, task)
                except Exception as error:  # the task's env cannot be made: this item fails, the slot goes on
                    self.finished.append(SlotResult(index, slot, error=error, host=host.hosts[slot]))
                    return self.start(slot)
            self.running[slot] = (index, job(host.hosts[slot]))
            host.playing[slot] = index
            return True

    def advance_all(self, todo: list[tuple[int, BaseException | None]], first: bool = False) -> None:
        workers = self.host._workers
        if workers is None:
            for slot, exc in todo:
                self.advance(slot, exc, first)
            return
        pending = [workers[slot % len(workers)].submit(self.advance, slot, exc, first) for slot, exc in todo]
        for future in pending:
            future.result()

    def results(self) -> list[SlotResult]:
        """The round's finished work, each with its share of the rounds' wall time (split among the works the
        slots held in each round)."""
        now = time.perf_counter()
        self.touched.update(index for index, _ in self.running.values())
        self.touched.update(r.index for r in self.finished)
        for index in self.touched:
            self.busy[index] = self.busy.get(index, 0.0) + (now - self.clock) / len(self.touched)
        self.clock = now
        self.touched.clear()
        done = sorted(self.finished, key=lambda r: r.index)
        self.finished.clear()
        for result in done:
            result.busy_s = self.busy.pop(result.index, 0.0)
        return done

    def idle(self) -> list[tuple[int, None]]:
        return [(slot, None) for slot in range(self.host.slots) if slot not in self.running]
