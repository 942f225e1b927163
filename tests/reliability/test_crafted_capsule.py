"""A capsule file crafted by someone who can write it: physics set to NaN, infinity or 1e6 with every digest
recomputed. Without a key only the env's own check stands between it and the simulation (non-finite physics
is refused whatever the file says); with a key, the file is refused before anything is built."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from capsule_rollout.capsules import (
    Arena,
    Capsule,
    CapsuleMismatchError,
    CapsuleSignatureError,
    load_capsule,
    restore,
    save_capsule,
    snapshot,
)
from capsule_rollout.envs.suites import make_env
from capsule_rollout.tabletop.tabletop_env import TabletopEnv

KEY = "a-key-both-machines-hold-0123456789"


def _forge(capsule: Capsule, key: str, fill) -> Capsule:
    """The capsule with buffer `key` edited by `fill(tensor)`, its digests recomputed (a consistent file)."""
    slabs = [(layout, slab.clone()) for layout, slab in capsule.slabs()]
    forged = Capsule(capsule.meta, slabs)
    fill(forged.buffer(key))
    return forged


def _state(arena: Arena) -> list[bytes]:
    return [bytes(t.numpy().tobytes()) for t in snapshot(arena).tensors().values()]


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_tabletop_physics_is_refused_whatever_the_file_says(tmp_path, value):
    env = TabletopEnv("pick_place", cameras=())
    arena = Arena([env]).allocate()
    env.reset(seed=3)
    forged = _forge(snapshot(arena), "env/physics", lambda t: t.view(-1)[:5].fill_(value))
    path = save_capsule(forged, tmp_path / "forged.capsule")
    loaded = load_capsule(path)  # digests consistent: the file itself reads
    before = _state(arena)
    with pytest.raises(CapsuleMismatchError, match="non-finite physics"):
        restore(arena, loaded)
    assert _state(arena) == before  # untouched
    env.close()


def test_non_finite_physics_of_a_third_party_env_is_refused():
    env = make_env("gymnasium:Reacher-v5", cameras=())
    arena = Arena([env]).allocate()
    env.reset(seed=1)
    capsule = snapshot(arena)
    qvel = env.data.qvel
    offset = qvel.ctypes.data - env.data.qpos.ctypes.data

    def poison(raw: torch.Tensor) -> None:
        raw[offset : offset + 8].view(torch.float64).fill_(float("nan"))

    with pytest.raises(CapsuleMismatchError, match="non-finite physics state \\(qvel\\)"):
        restore(arena, _forge(capsule, "env/mjdata", poison))
    restore(arena, capsule)  # the honest one still restores
    env.close()


def test_with_a_key_a_crafted_file_is_refused_before_anything_is_built(tmp_path):
    env = TabletopEnv("pick_place", cameras=())
    arena = Arena([env]).allocate()
    env.reset(seed=3)
    honest = snapshot(arena)
    save_capsule(honest, tmp_path / "honest.capsule", key=KEY)
    assert np.array_equal(load_capsule(tmp_path / "honest.capsule", key=KEY).buffer("env/physics").numpy(),
                          honest.buffer("env/physics").numpy())
    big = _forge(honest, "env/physics", lambda t: t.view(-1)[:3].fill_(1e6))  # finite: only the key can tell
    save_capsule(big, tmp_path / "crafted.capsule")  # unsigned, or signed by someone without the key
    with pytest.raises(CapsuleSignatureError, match="not signed"):
        load_capsule(tmp_path / "crafted.capsule", key=KEY)
    save_capsule(big, tmp_path / "crafted.capsule", key="the-forger-s-own-key-000000")
    with pytest.raises(CapsuleSignatureError, match="does not match this key"):
        load_capsule(tmp_path / "crafted.capsule", key=KEY)
    env.close()
