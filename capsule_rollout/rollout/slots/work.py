"""What a `SlotHost` plays: work items (`Job`: given a slot's host, the generator that plays it; `episode_job`,
`branch_job`) and where they come from (a list read ahead, `Ahead`, or a `Feed` given more while it plays)."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass

from capsule_rollout.capsules import Capsule
from capsule_rollout.rollout.rollout_host import RolloutHost

Job = Callable[[RolloutHost], Generator]
"""A work item for a slot: given the slot's host, the generator that plays it (`host.episode_steps(...)`)."""


class Ahead:
    """An iterator that can tell whether it has more without losing it (the next item is read ahead)."""

    _NONE = object()

    def __init__(self, it: Iterator) -> None:
        self._it, self._next = it, self._NONE

    def has_more(self) -> bool:
        if self._next is self._NONE:
            self._next = next(self._it, None)
        return self._next is not None

    def finish(self) -> bool:
        return not self.has_more()

    def __iter__(self) -> Ahead:
        return self

    def __next__(self):
        if not self.has_more():
            raise StopIteration
        item, self._next = self._next, self._NONE
        return item


class Feed:
    """Work handed to a `SlotHost.play` while it plays: `put` adds (index, job)s, which slots take as they come
    free. The play ends when every slot is free and the feed is empty; from then on `put` refuses (returns False)
    and the caller starts another play. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: collections.deque[tuple[int, Job]] = collections.deque()
        self.closed = False
        self.numbers: set[int] = set()  # every index put (its caller's record of what this play was given)

    def put(self, works: Iterable[tuple[int, Job]]) -> bool:
        """Add `works` (index, job) for the play to take; False (nothing added) once the play has ended."""
        with self._lock:
            if self.closed:
                return False
            self._items.extend(works)
            return True

    def has_more(self) -> bool:
        with self._lock:
            return bool(self._items)

    def __next__(self) -> tuple[int, Job]:
        with self._lock:
            if not self._items:
                raise StopIteration
            return self._items.popleft()

    def __iter__(self) -> Feed:
        return self

    def finish(self) -> bool:
        """End the play if nothing is left: True (and `put` refuses from now on), else False."""
        with self._lock:
            if self._items:
                return False
            self.closed = True
            return True


@dataclass(frozen=True)
class EpisodeJob:
    """The work of one episode (`RolloutHost.episode_steps`); `task`: the task it plays in a host over several
    (empty: the slot's own)."""

    seed: int
    episode_id: str | None = None
    attempt: int = 0
    repeat: int = 0
    task: str = ""

    def __call__(self, host: RolloutHost) -> Generator:
        return host.episode_steps(self.seed, episode_id=self.episode_id, attempt=self.attempt, repeat=self.repeat)


def episode_job(seed: int, *, episode_id: str | None = None, attempt: int = 0, repeat: int = 0,
                task: str = "") -> Job:
    """The work of one episode (`RolloutHost.episode_steps`), on the slot's host for `task` when given."""
    return EpisodeJob(seed, episode_id, attempt, repeat, task)


def branch_job(capsule: Capsule, *, seed: int, noise_seed: int | None = None, episode_id: str = "",
               max_steps: int | None = None) -> Job:
    """The work of one branch from a capsule (`RolloutHost.branch_steps`)."""
    return lambda host: host.branch_steps(capsule, seed=seed, noise_seed=noise_seed, episode_id=episode_id,
                                          max_steps=max_steps)

