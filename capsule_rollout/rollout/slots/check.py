"""Whether a run's episodes depend on its slot count: one work item played on a host of one slot and in the last
slot of a host of N (the other slots busy with other seeds), its first chunks compared bit for bit.

The project's flow policy and value critic are batch-invariant (`models.runtime`), so their episodes are the
same at any slot count (tested). A user's policy or critic that batches may not be: a
batch of N rows can round differently from a batch of 1. This check names the first difference (which step,
which recorded key, which element); such a run keeps the fixed-slot guarantee (an episode is the same in any slot
of an N-slot host; it resumes and replays with the slots it was made with).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from capsule_rollout.rollout.host_factory import RunSpec, build_host, build_slots, env_for_task
from capsule_rollout.rollout.slots.host import episode_job
from capsule_rollout.stores import episode_schema as S

__all__ = ["SlotCheck", "check_slots", "require_slots"]

COMPARED = (S.ACTION, S.STATE, S.VALUE, S.REWARD)


@dataclass(frozen=True)
class SlotCheck:
    """`difference`: None when the item played the same at 1 and at `slots` slots, else the first difference
    (`step 3 action[1]: 0.1234567 vs 0.1234568`)."""

    slots: int
    slot: int  # the slot (from 0) the item played in beside the others
    seed: int
    steps: int
    difference: str | None

    @property
    def same(self) -> bool:
        return self.difference is None

    def summary(self) -> dict:
        return {"same": self.same, "slots": self.slots, "seed": self.seed, "steps": self.steps,
                "difference": self.difference}

    def line(self) -> str:
        if self.same:
            return (f"slots: seed {self.seed} played the same {self.steps} steps at 1 slot and in slot {self.slot} "
                    f"of {self.slots} (from 0): the episodes do not depend on --slots")
        return (f"slots: seed {self.seed} played differently at 1 slot and in slot {self.slot} of {self.slots} (from 0) "
                f"({self.difference}): the policy or critic rounds by batch size, so this run's episodes depend on "
                f"--slots (each is the same in any of its {self.slots} slots; resume and replay it with "
                f"--slots {self.slots})")


def require_slots(slots: int, option: str = "--slots") -> None:
    """The slot check compares 1 slot with several: ValueError naming `option` for fewer than 2."""
    if slots < 2:
        raise ValueError(f"the slot check compares 1 slot with several: give {option} 2 or more (got {slots})")


def check_slots(spec: RunSpec, slots: int, *, seed: int, task: str = "", chunks: int = 3) -> SlotCheck:
    """Play `seed` (of `task` in a `suite:*` run) for `chunks` chunks on a host of one slot and in the last slot
    of a host of `slots` (seeds after it in the others), built from `spec` here (no capsule files, no observers,
    images not recorded); compare actions, states, values and rewards."""
    require_slots(slots)
    host = dataclasses.replace(spec.host, max_steps=chunks * spec.host.n_exec, record_images=False)
    probe = dataclasses.replace(spec, env=env_for_task(spec.env, task), capsule_dir="", observers=(), slots=1,
                                env_threads=1, host=host)
    one = build_host(probe)
    try:
        alone = one.run_episode(seed).episode
    finally:
        one.close()
    many = build_slots(dataclasses.replace(probe, slots=slots))
    try:
        played = many.run_items([episode_job(seed + k) for k in range(1, slots)] + [episode_job(seed)])
    finally:
        many.close()
    last = played[-1]
    if last.error is not None:
        raise last.error
    beside = last.value.episode
    return SlotCheck(slots, last.slot, seed, alone.meta.length, _first_difference(alone, beside))


def _first_difference(a, b) -> str | None:
    if a.meta.length != b.meta.length:
        return f"{a.meta.length} vs {b.meta.length} steps"
    for t in range(a.meta.length):
        for key in COMPARED:
            x, y = np.asarray(a.steps[key][t]), np.asarray(b.steps[key][t])
            differs = ~((x == y) | (np.isnan(x) & np.isnan(y)) if x.dtype.kind == "f" else x == y)
            if differs.any():
                i = int(np.flatnonzero(differs.reshape(-1))[0])
                where = f"[{i}]" if x.size > 1 else ""
                return f"step {t} {key}{where}: {x.reshape(-1)[i]!r} vs {y.reshape(-1)[i]!r}"
    return None
