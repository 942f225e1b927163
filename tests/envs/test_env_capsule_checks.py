"""The env's own restore check: a capsule of another task family is refused before any byte is copied; a capsule
restored as data never sets MuJoCo's structure."""

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
from capsule_rollout.capsules.trust import Trust
from capsule_rollout.envs.suites import make_env
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


def _forged(capsule: Capsule, trust: str, edit) -> Capsule:
    """The capsule with `edit(buffer(key) as numpy)` applied to a copy, its digests recomputed, read at `trust`."""
    slabs = [(lay, slab.clone()) for lay, slab in capsule.slabs()]
    edited = Capsule(capsule.meta, slabs)
    edit(edited)
    return Capsule(edited.meta, list(edited.slabs()), trust=Trust(trust))


def _field_bytes(env, field: str) -> tuple[int, int]:
    """Where MjModel.`field` lies in the capsule's `model` runs: (offset, bytes)."""
    arr = getattr(env.model, field)
    for offset, address, _n, name in env._model_ints:
        if name == field and address == arr.ctypes.data:
            return offset, arr.nbytes
    raise AssertionError(f"{field} is not in the runs")


def test_a_capsule_restored_as_data_never_sets_mujocos_structure():
    """MuJoCo reads MjModel's integer arrays (addresses, ids, types) as positions in its own arrays, unchecked: a
    capsule whose `jnt_qposadr` points far away crashes the process (measured: at the restore's `mj_step1`, or at the
    next step). Restored as data it is refused, naming the array, with the env as it was; the same capsule without the
    edit restores as data bit-exact."""
    env = make_env("tests.envs.broken_envs:make_counter", cameras=())
    other = make_env("tests.envs.broken_envs:make_counter", cameras=())
    arena, other_arena = Arena([env]).allocate(), Arena([other]).allocate()
    env.reset(seed=0)
    other.reset(seed=0)
    for _ in range(3):
        env.step(env.action_space.sample())
    capsule = snapshot(arena)
    offset, n = _field_bytes(env, "jnt_qposadr")

    def far_address(c: Capsule) -> None:
        c.buffer("env/model").numpy()[offset: offset + n] = np.full(n // 4, 10**8, np.int32).view(np.uint8)

    before = other.data.qpos.copy()
    with pytest.raises(CapsuleMismatchError, match=r"MjModel\.jnt_qposadr .*never its structure"):
        restore(other_arena, _forged(capsule, "data", far_address))
    assert np.array_equal(other.data.qpos, before)
    restore(other_arena, _forged(capsule, "data", lambda c: None))  # the same values: bit-exact
    action = env.action_space.sample()
    assert np.array_equal(other.step(action)[0]["state"], env.step(action)[0]["state"])
    assert np.array_equal(other.data.qpos, env.data.qpos) and np.array_equal(other.data.qvel, env.data.qvel)
