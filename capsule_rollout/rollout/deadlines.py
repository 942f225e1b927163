"""How long a phase of an actor's work, and a whole call, may run before the actor is taken for hung.

Phases (`rollout.phase_clock`): a cold reset, a restore, a chunk (the policy's and critic's call), a step, the
loop's own work between them, building a host, writing a shard. Each call's reports bring back, per phase, the
longest first occurrence on a clock (a compile, a GL context, the first scene) and the longest later one; the
driver keeps the longest of each it has seen (`PhaseDeadlines`) and hands them to every actor, which adds its own
as it measures them. A phase's deadline is then

    later occurrence: max(floor, margin x the longest later time (the longest first one if none yet))
    first occurrence: min(first-call allowance, max(floor, margin x the longest first time))

and a phase never measured gets the first-call allowance. So a slow cold reset (a generated scene) has a deadline
of its own, learned from the first one (an actor's first call included), and never borrows a restore's; a hang is
told apart from it by where it is. The actor watches its clocks on another thread than the one that plays
(`RolloutActor`), so a hang is found within the phase's deadline.

The driver keeps a deadline of the whole call too (`CallDeadlines`), for a hang that also stops the watching
thread (native code holding the GIL): the items' expected time (step limit x plays x the seconds per step
measured over every call but an actor's first, plus the longest reset) times the margin, plus the longest phase
deadline, plus the allowance in an actor's first call. `episode_timeout_s` (a number) replaces both with a fixed
deadline per item; 0 turns deadlines off.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from capsule_rollout.rollout.phase_clock import COLD_RESET, PHASES, RESTORE, Times, merge_times
from capsule_rollout.rollout.rollout_actor import ActorReport, WorkItem

MARGIN = 3.0
"""How many times the longest time measured a phase may take."""
FLOOR_S = 30.0
"""The shortest deadline of a phase (a GC pause, a slow disk or a loaded machine is no hang)."""
FIRST_CALL_S = 600.0
"""The first-call allowance: the deadline of a phase never measured, and the most a first occurrence in a process
(a first compile) may be given, whatever was measured."""


@dataclass(frozen=True)
class DeadlineSettings:
    """The constants of the derived deadlines (`run_rollouts(deadlines=...)`; `sim_rollout --first_call_s`,
    `--deadline_floor_s`)."""

    margin: float = MARGIN
    floor_s: float = FLOOR_S
    first_call_s: float = FIRST_CALL_S

    def __post_init__(self) -> None:
        for name in ("margin", "floor_s", "first_call_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value}")
        if self.floor_s > self.first_call_s:
            raise ValueError(f"the deadline floor ({self.floor_s} s) exceeds the first-call allowance "
                             f"({self.first_call_s} s): lower the floor or raise the allowance")


class PhaseDeadlines:
    """Deadlines per phase from the longest times measured (the module docstring says how)."""

    def __init__(self, settings: DeadlineSettings = DeadlineSettings()) -> None:
        self.settings = settings
        self.times: dict[str, list[float]] = {}  # phase -> [longest first occurrence, longest later one]
        self._known: dict[str, tuple[float, float]] = {}  # the deadlines as of the last change

    def merge(self, times: Mapping[str, tuple[float, float]]) -> bool:
        """Learn from `times` (`phase_clock.Times`); True when a deadline changed (most stay at the floor)."""
        if not merge_times(self.times, times):
            return False
        known, self._known = self._known, self._deadlines()
        return self._known != known

    def _deadlines(self) -> dict[str, tuple[float, float]]:
        return {phase: (self.phase_s(phase, True), self.phase_s(phase, False)) for phase in self.times}

    def snapshot(self) -> Times:
        return {phase: (t[0], t[1]) for phase, t in self.times.items()}

    def phase_s(self, phase: str, first: bool) -> float:
        s = self.settings
        first_s, later_s = self.times.get(phase, (math.nan, math.nan))
        base = first_s if first else (later_s if not math.isnan(later_s) else first_s)
        if math.isnan(base):
            return s.first_call_s
        deadline = max(s.floor_s, s.margin * base)
        return min(s.first_call_s, deadline) if first else deadline

    def longest_s(self) -> float:
        """The longest deadline any phase has now (a hang is found within it)."""
        return max([self.settings.first_call_s, *(self.phase_s(p, False) for p in self.times)])

    def table(self) -> dict[str, dict[str, float | None]]:
        """Per phase measured: the longest times and the deadlines (for a run's summary)."""
        out = {}
        for phase in sorted(self.times, key=lambda p: PHASES.index(p) if p in PHASES else len(PHASES)):
            first_s, later_s = self.times[phase]
            out[phase] = {"longest_first_s": None if math.isnan(first_s) else first_s,
                          "longest_later_s": None if math.isnan(later_s) else later_s,
                          "deadline_first_s": self.phase_s(phase, True), "deadline_s": self.phase_s(phase, False)}
        return out


class CallDeadlines:
    """The driver's deadline of a whole call (the module docstring says how), and the phase deadlines it hands
    the actors."""

    watches_phases = True

    def __init__(self, settings: DeadlineSettings = DeadlineSettings()) -> None:
        self.settings = settings
        self.phases = PhaseDeadlines(settings)
        self.steps = 0
        self.busy_s = 0.0
        self.step_limit = 0

    def learn(self, reports: Iterable[ActorReport], rate: bool) -> bool:
        """Learn the phase times of a call's reports (and, `rate`: not an actor's first call, its seconds per
        step); True when a phase deadline changed."""
        grew, merged = False, set()
        for report in reports:
            if id(report.phases) not in merged:  # a call's reports carry one table
                merged.add(id(report.phases))
                grew |= self.phases.merge(report.phases)
            if rate:
                self.steps += report.steps
                self.busy_s += report.busy_s
            self.step_limit = max(self.step_limit, report.step_limit)
        return grew

    @property
    def seconds_per_step(self) -> float:
        return self.busy_s / self.steps if self.steps else 0.0

    @property
    def measured(self) -> bool:
        return self.steps > 0 and self.step_limit > 0

    def item_s(self, item: WorkItem) -> float:
        """What `item` is expected to take at worst, without a hang: margin x (its steps at the measured rate +
        the longest reset)."""
        reset_s = max([0.0, *(t for p in (COLD_RESET, RESTORE) for t in self.phases.times.get(p, ())
                              if not math.isnan(t))])
        return self.settings.margin * (self.step_limit * item.plays * self.seconds_per_step + reset_s)

    def call_s(self, items: Sequence[WorkItem], first_call: bool) -> float:
        """The deadline of a call of `items` in seconds; `first_call`: the actor's first since placed."""
        if not self.measured:
            return self.settings.first_call_s * max(1, len(items))
        total = sum(self.item_s(item) for item in items) + self.phases.longest_s()
        return total + (self.settings.first_call_s if first_call else 0.0)


class FixedDeadlines:
    """A set deadline per item (None: no deadline); what the actors report changes nothing and no phase is
    watched."""

    watches_phases = False

    def __init__(self, item_s: float | None) -> None:
        self.item_s = item_s
        self.phases = None

    def learn(self, reports: Iterable[ActorReport], rate: bool) -> bool:
        return False

    def call_s(self, items: Sequence[WorkItem], first_call: bool) -> float | None:
        return None if self.item_s is None else self.item_s * len(items)


def call_deadlines(episode_timeout_s: float | None,
                   settings: DeadlineSettings = DeadlineSettings()) -> CallDeadlines | FixedDeadlines:
    """`run_rollouts`'s `episode_timeout_s`: None, derived deadlines; 0, none; else that many seconds per item."""
    if episode_timeout_s is None:
        return CallDeadlines(settings)
    return FixedDeadlines(episode_timeout_s or None)
