"""`Timeline`: a bounded history of one episode's committed boundaries (time-travel)."""

from __future__ import annotations

import bisect

from capsule_rollout.capsules.arena import Arena
from capsule_rollout.capsules.capsule import Capsule, restore


class Timeline:
    """Capsules of one episode in step order, at most `capacity` of them.

    When full, the oldest capsule is dropped, except the first one when
    `keep_first` (the episode start stays reachable). `rewind` restores an earlier
    boundary and forgets everything after it, so the episode continues from there.
    """

    def __init__(self, capacity: int, *, keep_first: bool = True) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        if keep_first and capacity < 2:
            raise ValueError("keep_first needs capacity >= 2 (the first capsule plus one more)")
        self.capacity = capacity
        self.keep_first = keep_first
        self._capsules: list[Capsule] = []
        self.dropped = 0  # capsules forgotten because the timeline was full

    def __len__(self) -> int:
        return len(self._capsules)

    @property
    def steps(self) -> list[int]:
        return [c.step for c in self._capsules]

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self._capsules)

    def record(self, capsule: Capsule) -> None:
        """Append the capsule of the newest committed boundary."""
        if self._capsules and capsule.step <= self._capsules[-1].step:
            raise ValueError(
                f"timeline steps must increase: got step {capsule.step} after {self._capsules[-1].step}; "
                "rewind() first to branch from an earlier boundary"
            )
        self._capsules.append(capsule)
        if len(self._capsules) > self.capacity:
            del self._capsules[1 if self.keep_first else 0]
            self.dropped += 1

    def latest(self) -> Capsule:
        if not self._capsules:
            raise LookupError("the timeline is empty; record() a capsule first")
        return self._capsules[-1]

    def at_or_before(self, step: int) -> Capsule:
        """The capsule of the latest boundary at or before `step`."""
        i = bisect.bisect_right(self.steps, step)
        if i == 0:
            raise LookupError(f"no boundary at or before step {step}; recorded steps: {self.steps}")
        return self._capsules[i - 1]

    def rewind(self, arena: Arena, *, to_step: int | None = None, back: int = 1) -> Capsule:
        """Restore an earlier boundary into `arena` and drop every later capsule.

        `to_step`: restore the latest boundary at or before that step. Otherwise go
        `back` boundaries before the latest one (`back=0` re-restores the latest).
        Returns the restored capsule, which stays in the timeline.
        """
        if to_step is not None:
            target = self.at_or_before(to_step)
        else:
            if back < 0 or back >= len(self._capsules):
                raise LookupError(f"cannot go back {back} boundaries: the timeline holds {len(self._capsules)}")
            target = self._capsules[-1 - back]
        restore(arena, target)
        del self._capsules[self._capsules.index(target) + 1 :]
        return target

    def clear(self) -> None:
        self._capsules.clear()
