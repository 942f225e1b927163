"""Planners: the low-rate side of the hand-off; they publish subtasks into a `SubtaskChannel`."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Protocol

from capsule_rollout.rollout.handoff import SubtaskChannel

CANONICAL = "canonical"  # a subtask said in the env's own words


class Planner(Protocol):
    """Decides the current subtask; the actor reads it from the channel every tick."""

    def reset(self, env) -> None:
        """A new episode begins on `env`: publish its current subtask."""

    def update(self, env) -> None:
        """Called at the planner's rate (the host calls it every `planner_every` control steps)."""


class ScriptedPlanner:
    """Follows the env's own decomposition (`env.subtask_texts`, `env.subtask_index`): the env
    decides when a subtask is done, and the next subtask's text is published. An env without
    subtasks has its instruction published once as the one subtask (nothing when it has none).

    `phrasing`: each subtask said the env's own way ("canonical"), or in another style the env knows:
    `words(text, phrasing, index)` (the env's `phrase` method, e.g. the tabletop's "train" / "heldout"
    paraphrases) with `index` chosen by the text (crc32), so a subtask is worded the same every time it is
    published, after a restore too."""

    def __init__(self, channel: SubtaskChannel, phrasing: str = CANONICAL,
                 words: Callable[[str, str, int], str] | None = None) -> None:
        self.channel = channel
        self.phrasing, self.words = phrasing, words
        if words is not None:
            words("", phrasing, 0)  # refuses an unknown phrasing here, not at the first publish
        elif phrasing != CANONICAL:
            raise ValueError(f"phrasing {phrasing!r}: this env words its subtasks one way only (it has no phrase())")
        self.published: int | None = None  # subtask index last published

    def reset(self, env) -> None:
        self.published = None
        self.update(env)

    def update(self, env) -> None:
        texts = env.subtask_texts or ((env.instruction,) if env.instruction else ())
        if not texts:
            return
        index = min(env.subtask_index, len(texts) - 1) if env.subtask_texts else 0
        if index != self.published:
            text = texts[index]
            if self.words is not None and self.phrasing != CANONICAL:
                text = self.words(text, self.phrasing, zlib.crc32(text.encode()))
            self.channel.publish(text, index)
            self.published = index
