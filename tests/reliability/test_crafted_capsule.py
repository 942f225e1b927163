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
    save_capsule(big, tmp_path / "crafted.capsule", key=None)  # unsigned, or signed by someone without the key
    with pytest.raises(CapsuleSignatureError, match="not signed"):
        load_capsule(tmp_path / "crafted.capsule", key=KEY)
    save_capsule(big, tmp_path / "crafted.capsule", key="the-forger-s-own-key-000000")
    with pytest.raises(CapsuleSignatureError, match="does not match this key"):
        load_capsule(tmp_path / "crafted.capsule", key=KEY)
    env.close()


def test_a_capsule_whose_python_state_runs_a_command_runs_nothing(tmp_path, report):
    """The graph capture's Python state crafted three ways that ran a shell command through the previous
    reader (a pickle through `getattr`, through torch's storage loader, a plain reduce), in each of its three
    parts, digests recomputed, read with `load_capsule` and restored: refused, nothing runs, the env as it was."""
    from tests.envs.test_object_graph import _forge_python, _with_part, exploits

    env = make_env("tests.envs.broken_envs:make_counter", cameras=())
    arena = Arena([env]).allocate()
    env.reset(seed=1)
    honest = snapshot(arena)
    blob = bytes(honest.buffer("env/python")[: int(honest.buffer("env/python_len")[0])].numpy())
    before = _state(arena)
    marker = tmp_path / "pwned"
    tried = refused = 0
    for name, payload in exploits(marker).items():
        for part in (0, 1, 2):
            path = save_capsule(_forge_python(honest, _with_part(blob, part, payload)), tmp_path / "c.capsule")
            tried += 1
            with pytest.raises(CapsuleMismatchError, match="not Python state in this project's format"):
                restore(arena, load_capsule(path))
            refused += 1
            assert not marker.exists(), name
            assert _state(arena) == before
    report.add("crafted capsule: Python state that runs a command", tried=tried, refused=refused,
               commands_run=int(marker.exists()))
    env.close()


def test_a_capsule_whose_python_state_amplifies_is_refused_within_its_bound(tmp_path, report):
    """The slab (1 MiB) filled with the reader's worst amplifiers (empty deques, sets, instances): refused once
    what it would make passes 64 bytes per byte of state plus 1 MiB, the restore holding copies of the state
    itself besides (instances, 37 bytes each to write, stay
    under it and are refused for their shape); the most the restore allocated on the way is measured (the
    previous reader let a 1 MiB capsule allocate 1.4 GB)."""
    import tracemalloc

    from capsule_rollout.capsules import state_codec as sc
    from tests.envs.test_object_graph import _forge_python, _with_part

    env = make_env("tests.envs.broken_envs:make_counter", cameras=())
    arena = Arena([env]).allocate()
    env.reset(seed=1)
    honest = snapshot(arena)
    blob = bytes(honest.buffer("env/python")[: int(honest.buffer("env/python_len")[0])].numpy())
    room = honest.buffer("env/python").numel() - len(blob) - 64
    before = _state(arena)
    module, cls = b"tests.envs.broken_envs", b"KeepsACounter"  # a class the env's graph holds
    name = bytes([sc.GLOBAL]) + sc._varint(len(module)) + module + sc._varint(len(cls)) + cls
    for kind, item in (("deque", bytes([sc.DEQUE, sc.NONE, 0])), ("set", bytes([sc.SET, 0])),
                       ("object", bytes([sc.OBJECT]) + name + bytes([sc.DICT, 0, sc.DICT, 0, sc.NONE]))):
        n = room // len(item)
        body = sc.MAGIC + bytes([sc.LIST]) + sc._varint(n) + item * n
        capsule = _forge_python(honest, _with_part(blob, 2, body))
        tracemalloc.start()
        try:
            # refused as an amplifier once past the bound, or (what stays under it) for its shape afterwards
            with pytest.raises(CapsuleMismatchError, match="in memory: refused|states are malformed"):
                restore(arena, capsule)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        # what the reader makes is charged against the bound; the restore also holds copies of the state itself
        bound = sc.MEMORY_PER_BYTE * len(body) + (1 << 20) + 3 * len(body)
        assert peak < bound, (kind, peak, bound)
        assert _state(arena) == before
        report.peak("crafted capsule: Python state that amplifies", state_mib=len(body) / 2**20,
                    bound_mib=bound / 2**20, **{f"peak_mib_{kind}": peak / 2**20})
    env.close()
