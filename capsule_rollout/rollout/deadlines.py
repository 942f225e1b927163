"""How long the Ray driver lets an actor's call run before it kills the actor (`run_rollouts`'s deadlines).

By default the deadline is derived from what the actors report: each report carries the control steps its
item played, the actor's seconds on it and the host's step limit. Over the items of every call but an
actor's first, the driver keeps the seconds per step (total seconds over total steps) and the largest time
an item took beyond its steps at the rate known before it (a cold reset, a host built, a shard write). An
item's deadline is then

    max(FLOOR_S, MARGIN x (step limit x plays x seconds per step + that largest extra time))

(`plays`: the episodes of at most the step limit the item plays, 1; a branch item more), and a call's
deadline is the sum over its items. An actor's first call since it was placed or restarted gets at least
`FIRST_CALL_S` (its first compile), and so does every call until such an item has played a step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from capsule_rollout.rollout.rollout_actor import ActorReport, WorkItem

MARGIN = 3.0
"""How many times the expected worst case an item may take."""
FLOOR_S = 30.0
"""The shortest deadline of an item (short episodes: a GC pause or a slow disk is no hang)."""
FIRST_CALL_S = 600.0
"""The least deadline of an actor's first call, and of every call before a measurement exists."""


class DerivedDeadlines:
    """Deadlines of calls from the timing the actors report (the module docstring says how)."""

    def __init__(self, margin: float = MARGIN, floor_s: float = FLOOR_S, first_call_s: float = FIRST_CALL_S) -> None:
        self.margin, self.floor_s, self.first_call_s = margin, floor_s, first_call_s
        self.steps = 0
        self.busy_s = 0.0
        self.step_limit = 0
        self.extra_s = 0.0  # the most seconds an item took beyond its steps at the rate known before it

    def observe(self, reports: Iterable[ActorReport]) -> None:
        for report in reports:
            if self.steps:
                self.extra_s = max(self.extra_s, report.busy_s - report.steps * self.seconds_per_step)
            self.steps += report.steps
            self.busy_s += report.busy_s
            self.step_limit = max(self.step_limit, report.step_limit)

    @property
    def seconds_per_step(self) -> float:
        return self.busy_s / self.steps if self.steps else 0.0

    @property
    def measured(self) -> bool:
        return self.steps > 0 and self.step_limit > 0

    def item_s(self, item: WorkItem) -> float | None:
        """The deadline of one item in seconds (None: nothing measured yet)."""
        if not self.measured:
            return None
        expected = self.step_limit * item.plays * self.seconds_per_step + self.extra_s
        return max(self.floor_s, self.margin * expected)

    def call_s(self, items: Sequence[WorkItem], first_call: bool) -> float | None:
        """The deadline of a call of `items` in seconds; `first_call`: the actor's first since placed."""
        per_item = [self.item_s(item) for item in items]
        if any(s is None for s in per_item):
            return self.first_call_s
        total = sum(per_item)
        return max(total, self.first_call_s) if first_call else total


class FixedDeadlines:
    """A set deadline per item (None: no deadline); what the actors report changes nothing."""

    def __init__(self, item_s: float | None) -> None:
        self.item_s = item_s

    def observe(self, reports: Iterable[ActorReport]) -> None:
        pass

    def call_s(self, items: Sequence[WorkItem], first_call: bool) -> float | None:
        return None if self.item_s is None else self.item_s * len(items)


def call_deadlines(episode_timeout_s: float | None) -> DerivedDeadlines | FixedDeadlines:
    """`run_rollouts`'s `episode_timeout_s`: None, derived deadlines; 0, none; else that many seconds per item."""
    if episode_timeout_s is None:
        return DerivedDeadlines()
    return FixedDeadlines(episode_timeout_s or None)
