"""Planners: the low-rate side of the hand-off; they publish subtasks into a `SubtaskChannel`."""

from __future__ import annotations

from typing import Protocol

from rollout.handoff import SubtaskChannel


class Planner(Protocol):
    """Decides the current subtask; the actor reads it from the channel every tick."""

    def reset(self, env) -> None:
        """A new episode (or a restored boundary) begins on `env`: publish its current subtask."""

    def update(self, env) -> None:
        """Called at the planner's rate (the host calls it every `planner_every` control steps)."""


class ScriptedPlanner:
    """Follows the sim task's own decomposition: the env's progress predicates decide
    when a subtask is done, and the next subtask's text is published."""

    def __init__(self, channel: SubtaskChannel) -> None:
        self.channel = channel
        self.published: int | None = None  # subtask index last published

    def _current(self, env) -> int:
        return min(env.subtask_index, len(env.subtasks) - 1)

    def reset(self, env) -> None:
        self.published = None
        self.update(env)

    def update(self, env) -> None:
        index = self._current(env)
        if index != self.published:
            self.channel.publish(env.subtasks[index].text, index)
            self.published = index
