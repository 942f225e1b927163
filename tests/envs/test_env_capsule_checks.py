"""The env's own restore check: a capsule of another task family is refused before any byte is copied."""

import numpy as np
import pytest
import torch

from capsule_rollout.capsules import (
    Arena,
    Capsule,
    CapsuleMismatchError,
    Role,
    load_capsule,
    restore,
    save_capsule,
    snapshot,
)
from capsule_rollout.tabletop.tabletop_env import TabletopEnv
from capsule_rollout.tabletop.tasks import family_index


def _with_family(capsule: Capsule, family: str) -> Capsule:
    """The capsule with its task's family changed and its digests recomputed (a consistent, edited file)."""
    slabs = [(lay, slab.clone()) for lay, slab in capsule.slabs()]
    edited = Capsule(capsule.meta, slabs)
    edited.buffer("env/task")[0] = family_index(family)
    return edited


def test_a_capsule_of_another_family_is_refused_with_the_arena_untouched(tmp_path):
    env = TabletopEnv("pick_place", cameras=())
    arena = Arena([env]).allocate()
    env.reset(seed=3)
    capsule = snapshot(arena)
    path = save_capsule(_with_family(capsule, "stack"), tmp_path / "edited.capsule")
    edited = load_capsule(path)  # digests match: the file itself is consistent
    env.reset(seed=4)
    env.step(np.array([0.5, 0.0, 0.0, 0.0], np.float32))
    arena.before_snapshot()
    slabs = [slab.clone() for _, slab in arena.slabs(Role.STATE)]
    qpos, steps = env.data.qpos.copy(), env.steps
    with pytest.raises(CapsuleMismatchError, match="component 'env' refused the capsule: capsule holds a stack task, "
                                                   "this env runs pick_place"):
        restore(arena, edited)
    assert all(torch.equal(a, b) for a, b in zip(slabs, (s for _, s in arena.slabs(Role.STATE))))
    assert np.array_equal(env.data.qpos, qpos) and env.steps == steps and env.params.family == family_index("pick_place")
    restore(arena, load_capsule(save_capsule(capsule, tmp_path / "good.capsule")))  # the unedited one restores
    assert env.steps == 0
