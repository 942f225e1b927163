"""`PhaseClock`: what a rollout host is doing now (a cold reset, a restore, a chunk, a step, its own loop) and
since when, for a watchdog on another thread; and the longest time each phase took, its first occurrence apart.

A host stamps its phases as it plays (`RolloutHost.clock`: resets, chunks, steps, the loop's own work between
them; a `SlotHost`'s clock: its batched calls; the actor's: building a host, writing a shard). A clock is idle
(`phase` None) while its host waits for someone else (a slot waiting for the batched call) or between items.
`RolloutActor` plays on a thread of its own and watches its clocks against the deadlines of `rollout.deadlines`;
the longest times go back to the driver with each call's reports (`ActorReport.phases`), which learns the
deadlines from them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

COLD_RESET = "cold_reset"
"""A reset that makes the seed's initial state (`env.reset(seed)`, the policy's and planner's resets): slow where
the scene is generated."""
RESTORE = "restore"
"""A reset that restores a kept initial capsule (or a branch's mid-episode one)."""
CHUNK = "chunk"
"""The policy's (and critic's) call for the next chunk: one slot's, or a slot host's batched call."""
STEP = "step"
"""One `env.step`."""
HOST = "host"
"""The loop's own work between those: observers, the planner, recording the episode, an observation after a
restore."""
BUILD = "build"
"""Building a host (an actor's first item of a task in a `suite:*` run)."""
WRITE = "write"
"""An actor writing a call's episodes to its shard."""
PHASES = (COLD_RESET, RESTORE, CHUNK, STEP, HOST, BUILD, WRITE)
CAPSULE = "capsule"
"""A part of a cold reset: the seed's initial capsule made and kept (the snapshot, the store holding it)."""
RECORD_STEP = "record_step"
"""A part of the host's loop: each step added to the episode being recorded."""
CAPSULE_SAVE = "capsule_save"
"""An actor waiting for its saver thread to sign and save the seeds' initial capsules in the run's directory (before
a call's reports go back: `RolloutActor._saved`)."""
PARTS = (CAPSULE, RECORD_STEP, CAPSULE_SAVE)
"""Parts timed apart (`PhaseClock.add`), in the totals beside the phases, never watched: `capsule` and
`record_step` within a phase (a cold reset's, the host loop's), `capsule_save` outside any."""
_WHERE = {COLD_RESET: "a cold reset", RESTORE: "a restore", CHUNK: "the policy's chunk at step {step}",
          STEP: "env step {step}", HOST: "the host's loop at step {step}", BUILD: "building the host",
          WRITE: "writing the shard"}

Times = dict[str, tuple[float, float]]
"""phase -> (longest first occurrence on a clock, longest later one), in seconds; NaN where none was seen."""


class PhaseClock:
    """One host's (or a slot host's, or an actor's) current phase and its longest times per phase.

    The host's thread writes; a watchdog thread reads `now` (one tuple, assigned at once, so a reader never pairs
    one phase with another's start)."""

    def __init__(self, step: Callable[[], int] | None = None) -> None:
        """`step`: the control step of the episode being played (where a hang is reported), if any."""
        self.now: tuple[str | None, float, bool] = (None, 0.0, False)  # (phase, since, its first occurrence here)
        self.step = step if step is not None else (lambda: 0)
        self._seen: set[str] = set()
        self._times: dict[str, list[float]] = {}
        self._totals: dict[str, float] = {}  # seconds in each phase (and part) since `take_totals`

    def enter(self, phase: str | None) -> None:
        """End the current phase (its time recorded) and start `phase` (None: idle, not watched)."""
        t = time.perf_counter()
        current, since, first = self.now
        if current is not None:
            self._record(current, first, t - since)
        if phase is None:
            self.now = (None, t, False)
            return
        first = phase not in self._seen
        self._seen.add(phase)
        self.now = (phase, t, first)

    def switch(self, phase: str) -> None:
        """Call the phase begun so far `phase` instead (a reset turns out cold: no capsule was kept)."""
        current, since, first = self.now
        if current is not None and first:
            self._seen.discard(current)  # it did not happen after all
        first = phase not in self._seen
        self._seen.add(phase)
        self.now = (phase, since, first)

    def add(self, part: str, seconds: float) -> None:
        """Count `seconds` of a part of the current phase (`PARTS`) in the totals."""
        self._totals[part] = self._totals.get(part, 0.0) + seconds

    def take_totals(self) -> dict[str, float]:
        """The seconds spent in each phase and part since the last call (then zeroed: each counted once)."""
        out, self._totals = self._totals, {}
        return out

    def _record(self, phase: str, first: bool, seconds: float) -> None:
        self._totals[phase] = self._totals.get(phase, 0.0) + seconds
        longest = self._times.setdefault(phase, [math.nan, math.nan])
        k = 0 if first else 1
        if not longest[k] >= seconds:  # NaN: none yet
            longest[k] = seconds

    def peek_times(self) -> dict[str, list[float]]:
        """The longest times so far (a copy of the table; another thread may be adding to it)."""
        return {phase: list(t) for phase, t in dict(self._times).items()}

    def take_times(self) -> Times:
        """The longest times since the last call (then forgotten: each goes back to the driver once)."""
        out = {phase: (t[0], t[1]) for phase, t in self._times.items()}
        self._times.clear()
        return out


def merge_times(into: dict[str, list[float]], times: Mapping[str, tuple[float, float]]) -> bool:
    """Keep the longest of each (first, later) time in `into`; True when anything grew."""
    grew = False
    for phase, pair in times.items():
        longest = into.setdefault(phase, [math.nan, math.nan])
        for k in (0, 1):
            if not math.isnan(pair[k]) and not longest[k] >= pair[k]:
                longest[k] = float(pair[k])
                grew = True
    return grew


def add_totals(into: dict[str, float], totals: Mapping[str, float]) -> dict[str, float]:
    """`into` plus `totals`, phase by phase (in place; returned)."""
    for phase, seconds in totals.items():
        into[phase] = into.get(phase, 0.0) + float(seconds)
    return into


def combined_totals(clocks: Iterable[PhaseClock]) -> dict[str, float]:
    """The seconds of several clocks in each phase and part (taken from each)."""
    into: dict[str, float] = {}
    for clock in clocks:
        add_totals(into, clock.take_totals())
    return into


def combined_times(clocks: Iterable[PhaseClock]) -> Times:
    """The longest times of several clocks (taken from each)."""
    into: dict[str, list[float]] = {}
    for clock in clocks:
        merge_times(into, clock.take_times())
    return {phase: (t[0], t[1]) for phase, t in into.items()}


@dataclass(frozen=True)
class Hang:
    """A phase that ran past its deadline: where (phase, control step of the episode) and for how long."""

    phase: str
    step: int
    seconds: float
    deadline_s: float
    first: bool  # the phase's first occurrence on its clock (its deadline: the first-call allowance or learned)

    def __str__(self) -> str:
        where = _WHERE.get(self.phase, self.phase).format(step=self.step)
        return (f"hung: {where} ran {self.seconds:.1f} s, past its {self.deadline_s:.1f} s deadline"
                + (" (its first in the process)" if self.first else ""))

    @property
    def place(self) -> tuple[str, int]:
        """Where it hung: the same place twice in an episode (which plays the same every time) is no accident."""
        return self.phase, self.step
