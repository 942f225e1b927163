"""`RayDriver`: the loop of `run_rollouts` on Ray actors: hand items to placed actors, record what comes back,
re-run what was not played, give up what cannot be, and say why.

Retries count episodes, not actor restarts. An item whose phase hung (the actor's watchdog says where: phase and
step) is handed out again; when it hangs at the same place a second time it is lost at once (an episode plays the
same every time, so it would hang again), else after `max_attempts` failed tries. The other items of that call
are handed out again without counting. An actor that dies on its own (a crash) charges each item of its call a
try and is restarted up to `max_restarts` times (a kill for a hang costs the actor nothing: Ray's own restart
count is unlimited and the driver keeps its own). An item lost gets a report saying why; the run goes on.

The run gives up when it cannot go on (no actor placed in `placement_timeout_s`, an actor that cannot start,
every actor out of restarts): `DriverStats.gave_up` says why, and every item not recorded (with the repeats
it would lead to) gets a lost report. Nothing here raises for what happens to actors.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

from capsule_rollout.capsules import signing_key
from capsule_rollout.rollout.deadlines import CallDeadlines, DeadlineSettings, FixedDeadlines
from capsule_rollout.rollout.host_factory import RunSpec
from capsule_rollout.rollout.rollout_actor import ActorReport, RolloutActor, StartFailure, WorkItem
from capsule_rollout.rollout.work_plan import (
    DriverStats,
    WorkPlan,
    lost_report,
    record_reports,
    succeeded,
    without_images,
)

ACTOR_ERRORS = (RayActorError, ActorDiedError, ActorUnavailableError)


@dataclass
class _Call:
    index: int  # the actor's
    items: list[WorkItem]
    deadline: float | None  # time.monotonic() past which the actor is killed (None: never)
    seconds: float | None
    generation: int = 0  # of the actor's process when handed out (a restart makes its other calls stale)


def calls_in_flight(spec: RunSpec, actor_cls: type[RolloutActor]) -> int:
    """Calls an actor holds at once: 2 for an actor of slots whose calls play side by side (the second call's
    items fill the slots the first call's last items leave free: `rollout.slots.calls`), else 1."""
    return 2 if spec.slots > 1 and actor_cls.side_by_side else 1


def _first_line(exc: BaseException, limit: int = 200) -> str:
    text = str(exc).strip().splitlines()
    line = f"{type(exc).__name__}: {text[0] if text else ''}"
    return line if len(line) <= limit else line[:limit - 3] + "..."


def place_actors(spec: RunSpec, actors: int, *, actor_cls: type[RolloutActor] = RolloutActor,
                 cpus_per_actor: float = 1.0, gpus_per_actor: float = 0.0, shard_root: str = "") -> list:
    """`actors` actor handles of `actor_cls` for `spec` (Ray places and builds them meanwhile)."""
    # SPREAD: on a cluster the actors go to as many nodes as can take them (the default packs the driver's
    # node first); on one node it changes nothing. Ray restarts an actor however often it dies: the driver
    # counts the crashes (`max_restarts`), a kill for a hang is no crash
    remote = ray.remote(actor_cls).options(num_cpus=cpus_per_actor, num_gpus=gpus_per_actor, max_restarts=-1,
                                           max_task_retries=0, scheduling_strategy="SPREAD",
                                           max_concurrency=calls_in_flight(spec, actor_cls))
    key = signing_key()  # the actors sign and check the run's capsules with the driver's key
    return [remote.remote(spec, i, shard_root=shard_root, capsule_key=key) for i in range(actors)]


class RayDriver:
    """One run of `run_rollouts` on `actors` Ray actors (what `run_rollouts` documents)."""

    def __init__(self, spec: RunSpec, plan: WorkPlan, *, actors: int, recorder, shard_root: str,
                 actor_cls: type[RolloutActor], cpus_per_actor: float, gpus_per_actor: float, max_restarts: int,
                 max_attempts: int, deadlines: CallDeadlines | FixedDeadlines, settings: DeadlineSettings,
                 placement_timeout_s: float, on_report: Callable[[ActorReport, DriverStats], None] | None,
                 episodes_per_call: int) -> None:
        self.spec, self.plan, self.recorder, self.on_report = spec, plan, recorder, on_report
        self.actors, self.max_restarts, self.max_attempts = actors, max_restarts, max_attempts
        self.deadlines, self.settings = deadlines, settings
        self.placement_timeout_s, self.per_call = placement_timeout_s, episodes_per_call
        self.cpus, self.gpus = cpus_per_actor, gpus_per_actor
        self.pool = place_actors(spec, actors, actor_cls=actor_cls, cpus_per_actor=cpus_per_actor,
                                 gpus_per_actor=gpus_per_actor, shard_root=shard_root)
        self.depth = calls_in_flight(spec, actor_cls)
        self.idle: deque[int] = deque()  # an actor's index once per call it can take now
        self.generation: Counter[int] = Counter()  # of each actor's process, as this driver knows it
        self.draining: dict[int, int] = {}  # actor whose call hung, waiting for its other calls -> its process id
        self.in_flight: dict = {}  # object ref -> _Call
        self.probes: dict = {actor.ready.remote(): i for i, actor in enumerate(self.pool)}  # placed and built?
        self.alive = set(range(actors))
        self.placed: set[int] = set()
        self.warm: set[int] = set()  # actors that finished a call since they were placed or restarted
        self.crashes: Counter[int] = Counter()
        self.killed: dict[int, int] = {}  # actor killed for a hang, not yet seen restarted -> its old process id
        self.failures: Counter[str] = Counter()  # episode id -> tries that failed (hung, or its actor died)
        self.hung_at: dict[str, list[tuple[str, int]]] = {}  # episode id -> where it hung (phase, step)
        self.timed_out: set = set()
        self.stats = DriverStats()
        self.reports: list[ActorReport] = []
        self.started = time.monotonic()

    def run(self) -> tuple[list[ActorReport], DriverStats]:
        try:
            while (self.plan or self.in_flight) and not self.stats.gave_up:
                self._hand_out()
                if not self.in_flight and not self.probes:
                    self._give_up("every rollout actor is gone")
                    break
                done, _ = ray.wait([*self.in_flight, *self.probes], num_returns=1, timeout=self._wait())
                if not done:
                    self._expire()
                elif done[0] in self.probes:
                    self._probed(done[0])
                else:
                    self._returned(done[0])
            if self.stats.gave_up:
                self._lose_the_rest()
        finally:
            for actor in self.pool:
                ray.kill(actor, no_restart=True)
        if self.deadlines.phases is not None:
            self.stats.phase_deadlines = self.deadlines.phases.table()
        return self.reports, self.stats

    # -- handing out ---------------------------------------------------------------------
    def _hand_out(self) -> None:
        plan, spec = self.plan, self.spec
        skipped = []  # actors whose second call would take what an actor without a call should get
        while plan and self.idle:
            index = self.idle.popleft()
            # slots: share what is left among the actors' calls rather than fill one call with all of it
            share = max(spec.slots, -(-len(plan) // (self.actors * self.depth))) if spec.slots > 1 else self.per_call
            size = min(self.per_call, share, len(plan))
            if self._holds(index):  # a second call: what is left once each actor without a call has one
                waiting = [i for i in self.alive if i != index and not self._holds(i)]
                size = min(size, len(plan) - min(self.per_call, share) * len(waiting))
                if size <= 0:
                    skipped.append(index)
                    continue
            batch = [plan.take(index) for _ in range(size)]
            # a call behind another on the same actor ends after both: its deadline counts the items ahead of it
            ahead = [item for call in self.in_flight.values() if call.index == index for item in call.items]
            seconds = self.deadlines.call_s(ahead + batch, first_call=index not in self.warm)
            self.stats.episode_deadline_s = None if seconds is None else seconds / len(batch)
            # the phase deadlines go with the call: a call of their own could run after it (two at once, no order)
            watch = (self.settings, self.deadlines.phases.snapshot()) if self.deadlines.watches_phases else None
            deadline = None if seconds is None else time.monotonic() + seconds
            ref = self.pool[index].run_batch.remote(batch, watch)
            self.in_flight[ref] = _Call(index, batch, deadline, seconds, self.generation[index])
        self.idle.extend(skipped)

    def _holds(self, index: int) -> bool:
        """Whether actor `index` holds a call now."""
        return any(call.index == index for call in self.in_flight.values())

    def _wait(self) -> float | None:
        """Seconds until the next deadline (a call's, or placement's while no actor is placed)."""
        now = time.monotonic()
        # a call killed at its deadline is waited for as it fails (not spun on: its deadline has passed)
        waits = [call.deadline - now for ref, call in self.in_flight.items()
                 if call.deadline is not None and ref not in self.timed_out]
        if not (self.placed & self.alive) and self.probes:
            waits.append(self.started + self.placement_timeout_s - now)
        return max(0.0, min(waits)) if waits else None

    def _expire(self) -> None:
        now = time.monotonic()
        if not (self.placed & self.alive) and self.probes and now >= self.started + self.placement_timeout_s:
            self._give_up(f"no rollout actor was placed within {self.placement_timeout_s:.0f} s: each asks for "
                          f"{self.cpus} CPU and {self.gpus} GPU; the cluster has {ray.available_resources()} free. "
                          "Ask for less (--cpus_per_actor, --gpus_per_actor) or fewer --actors")
            return
        for ref, call in list(self.in_flight.items()):
            if call.deadline is not None and now >= call.deadline and ref not in self.timed_out:
                # every call it holds fails with it, each told as killed at a deadline (not a crash)
                self.timed_out.update(r for r, c in self.in_flight.items() if c.index == call.index)
                self.stats.timeouts += 1
                ray.kill(self.pool[call.index], no_restart=False)  # Ray restarts it; the pending calls then fail

    # -- what comes back ---------------------------------------------------------------------
    def _probed(self, ref) -> None:
        """An actor placed (or restarted): to work; still restarting; or gone."""
        index = self.probes.pop(ref)
        try:
            pid = ray.get(ref)
        except ActorUnavailableError:
            time.sleep(0.2)
            self.probes[self.pool[index].ready.remote()] = index
            return
        except (RayActorError, ActorDiedError) as exc:
            if getattr(exc, "actor_init_failed", False) or index not in self.placed:
                self._give_up(f"a rollout actor could not start: {_first_line(exc)}")
                return
            if index in self.killed:  # the probe reached the process killed for a hang: ask the new one
                self.killed.pop(index)
            else:
                self.crashes[index] += 1
            if self.crashes[index] > self.max_restarts:
                self._drop(index, f"it died restarting: {_first_line(exc)}")
            else:
                time.sleep(0.2)
                self.probes[self.pool[index].ready.remote()] = index
            return
        if isinstance(pid, StartFailure):  # its host could not be built: another try would not build it either
            self._give_up(f"a rollout actor could not start: {pid.error}")
            self.stats.gave_up_traceback = pid.traceback
            return
        if self.killed.get(index) == pid:  # the process killed for a hang answered before it was gone
            time.sleep(0.2)
            self.probes[self.pool[index].ready.remote()] = index
            return
        self.killed.pop(index, None)
        if self.stats.ready_at is None:
            self.stats.ready_at = time.monotonic()
        self.placed.add(index)
        self.stats.actors_placed = len(self.placed)
        self._not_idle(index)
        self.idle.extend([index] * self.depth)

    def _returned(self, ref) -> None:
        call = self.in_flight.pop(ref)
        try:
            got = ray.get(ref)
        except ACTOR_ERRORS as exc:
            if getattr(exc, "actor_init_failed", False):  # the host could not be built: retrying will not help
                self._give_up(f"a rollout actor could not start: {_first_line(exc)}")
                return
            self._died(call, exc, killed=ref in self.timed_out)
            return
        hung = any(r.hang is not None for r in got)
        current = call.generation == self.generation[call.index]  # else its process was given up on since
        self.deadlines.learn(got, rate=call.index in self.warm and not hung)
        if hung and current:  # its play thread is stuck: a fresh process (Ray restarts it; no crash), once the
            self.stats.timeouts += 1  # other calls it holds are back (each returns at once: it sees the hang too)
            self.stats.actor_failures += 1
            self.generation[call.index] += 1
            self._not_idle(call.index)
            self.draining[call.index] = got[0].actor_pid
        elif current:
            self.idle.append(call.index)
            self.warm.add(call.index)
        played = [r for r in got if r.hang is None and not r.unplayed]
        record_reports(played, self.recorder, self.stats)
        again = []
        for item, report in zip(call.items, got, strict=True):
            if report.unplayed:
                again.append(item)
            elif report.hang is not None:
                self.stats.hangs += 1
                if self._failed(item, str(report.hang), report.hang.place):
                    again.append(item)
            else:
                self.stats.follow_ups += self.plan.follow(item, succeeded(report), call.index)
                self._report(report)
        self._again(again)
        self._drained(call.index)

    def _drained(self, index: int) -> None:
        """An actor whose call hung: killed and restarted once it holds no other call."""
        if index in self.draining and not any(c.index == index for c in self.in_flight.values()):
            self._restart(index, kill=self.draining.pop(index))

    def _not_idle(self, index: int) -> None:
        self.idle = deque(i for i in self.idle if i != index)

    def _died(self, call: _Call, exc: BaseException, killed: bool) -> None:
        """An actor died holding `call`: each of its items charged a try (which one did it is not known). The
        other calls it held fail too: their items are charged, the death counted once."""
        current = call.generation == self.generation[call.index]
        if killed:
            why = f"no answer within the call's {call.seconds:.0f} s deadline (the actor was killed)"
        else:
            why = f"its actor died: {_first_line(exc)}"
        self._again([item for item in call.items if self._failed(item, why)])
        if not current:  # its death (or hang) was handled with an earlier call's
            if call.index in self.draining:  # it died before it was killed for its hang: restart it as it is
                self.draining.pop(call.index)
                self._restart(call.index)
            return
        self.stats.actor_failures += 1
        if not killed:
            self.crashes[call.index] += 1
        self.generation[call.index] += 1
        self._not_idle(call.index)
        if self.crashes[call.index] > self.max_restarts:
            self._drop(call.index, why)
        else:
            self._restart(call.index)

    def _restart(self, index: int, kill: int | None = None) -> None:
        """Probe actor `index` until Ray has restarted it; `kill`: the process id to kill first (a hung one)."""
        self._not_idle(index)
        self.warm.discard(index)
        if kill is not None:
            self.killed[index] = kill
            ray.kill(self.pool[index], no_restart=False)
        self.probes[self.pool[index].ready.remote()] = index  # Ray restarts it meanwhile

    def _drop(self, index: int, why: str) -> None:
        """An actor out of restarts: gone for this run."""
        ray.kill(self.pool[index], no_restart=True)
        self._not_idle(index)
        self.alive.discard(index)
        self.warm.discard(index)
        if not self.alive:
            self._give_up(f"every rollout actor crashed more than {self.max_restarts} times (--max_restarts); "
                          f"the last: {why}")

    # -- retries and losses --------------------------------------------------------------------
    def _again(self, items: list[WorkItem]) -> None:
        """Hand `items` out again first, in their order, on the next actors that are ready."""
        self.stats.resubmitted += len(items)
        for item in reversed(items):
            self.plan.retry(item)

    def _failed(self, item: WorkItem, why: str, place: tuple[str, int] | None = None) -> bool:
        """A try of `item` failed: True to hand it out again, else it is lost."""
        self.failures[item.episode_id] += 1
        tries = self.failures[item.episode_id]
        places = self.hung_at.setdefault(item.episode_id, [])
        same_place = place is not None and place in places
        if place is not None:
            places.append(place)
        if same_place:
            self._lose(item, f"{why}; it hung at the same place on an earlier try (an episode plays the same every "
                             "time: it would hang again)")
        elif tries >= self.max_attempts:
            self._lose(item, f"failed {tries} times; the last: {why}")
        else:
            return True
        return False

    def _lose(self, item: WorkItem, why: str) -> None:
        self.stats.lost += 1
        self._report(lost_report(item, why))
        self.stats.follow_ups += self.plan.follow(item, False, None)

    def _report(self, report: ActorReport) -> None:
        self.reports.append(report)
        if self.on_report is not None:
            self.on_report(report, self.stats)
        if self.recorder is not None:
            without_images(report)  # recorded: the store has them

    def _give_up(self, why: str) -> None:
        self.stats.gave_up = why

    def _lose_the_rest(self) -> None:
        """After giving up: every item in flight or left (and the repeats each would lead to) is lost."""
        why = f"not played: the run gave up ({self.stats.gave_up})"
        items = [it for call in self.in_flight.values() for it in call.items]
        self.in_flight.clear()
        for item in items:
            for lost in (item, *self.plan.unplayed_repeats(item)):
                self.stats.lost += 1
                self._report(lost_report(lost, why))
        for item in self.plan.drain():
            self.stats.lost += 1
            self._report(lost_report(item, why))
