import os

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

from capsule_rollout import tabletop
from capsule_rollout.capsules import Arena, restore, snapshot, verify_steppable
from capsule_rollout.envs.gl_backend import RenderingUnavailableError
from capsule_rollout.tabletop.env_steppable import TabletopSteppable
from capsule_rollout.tabletop.scripted_expert import ScriptedExpert
from capsule_rollout.tabletop.tabletop_env import STATE_DIM, TabletopEnv
from capsule_rollout.tabletop.tasks import FAMILY_NAMES


@pytest.mark.parametrize("env_id", sorted(tabletop.ENV_IDS))
def test_registered_envs_pass_check_env(env_id):
    assert env_id in tabletop.register_envs()
    env = gymnasium.make(env_id)
    check_env(env.unwrapped, skip_render_check=False)
    obs, info = env.reset(seed=1)
    assert obs["image_front"].shape == (64, 64, 3) and obs["image_front"].dtype == np.uint8
    assert obs["state"].shape == (STATE_DIM,) and obs["state"].dtype == np.float32
    assert isinstance(obs["instruction"], str) and obs["instruction"]
    assert set(info) >= {"success", "subtask_id", "subtask", "subtask_progress"}
    env.close()


def test_seeded_reset_is_deterministic_and_seeds_differ():
    a, b = TabletopEnv(cameras=("front", "top")), TabletopEnv(cameras=("front", "top"))
    oa, _ = a.reset(seed=42)
    ob, _ = b.reset(seed=42)
    for k in oa:
        assert np.array_equal(oa[k], ob[k]) if k != "instruction" else oa[k] == ob[k]
    layouts = set()
    for seed in range(8):
        a.reset(seed=seed)
        layouts.add((a.instruction, tuple(np.round(a.world().blocks["red"], 4))))
    assert len(layouts) == 8


def test_state_only_mode_renders_nothing():
    env = TabletopEnv(cameras=())
    obs, _ = env.reset(seed=0)
    env.step(np.zeros(4))
    assert set(obs) == {"state", "privileged", "instruction"} and env._renderers == {}


def test_env_capsule_restore_is_bit_exact_with_images_after_dirtying():
    env = TabletopEnv(cameras=("front", "top"))
    arena = Arena([env]).allocate()
    env.reset(seed=5)
    expert = ScriptedExpert(env)
    for _ in range(10):
        env.step(expert.act())
    capsule = snapshot(arena, step=10)
    rng = np.random.default_rng(0)
    actions = [rng.uniform(-1, 1, 4).astype(np.float32) for _ in range(15)]

    def rollout():
        return [env.step(a) for a in actions]

    ref = rollout()
    arena.fill_random_(torch.Generator().manual_seed(1))
    env.reset(seed=99)  # a different episode entirely
    for a in actions[:5]:
        env.step(a[::-1].copy())
    restore(arena, capsule)
    again = rollout()
    for (o1, r1, t1, u1, i1), (o2, r2, t2, u2, i2) in zip(ref, again):
        assert np.array_equal(o1["image_front"], o2["image_front"])
        assert np.array_equal(o1["image_top"], o2["image_top"])
        assert np.array_equal(o1["state"], o2["state"]) and o1["instruction"] == o2["instruction"]
        assert (r1, t1, u1, i1) == (r2, t2, u2, i2)


def test_env_passes_the_verify_harness():
    report = verify_steppable(TabletopSteppable, steps=6)
    assert report.bit_exact, report.failures


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_expert_solves_every_family(family):
    env = TabletopEnv(family, cameras=())
    wins = 0
    for seed in range(10):
        env.reset(seed=seed)
        expert = ScriptedExpert(env)
        subtask_ids = []
        while True:
            _, reward, terminated, truncated, info = env.step(expert.act())
            subtask_ids.append(info["subtask_id"])
            if terminated or truncated:
                break
        wins += info["success"]
        if info["success"]:
            assert reward == 0.0 and subtask_ids == sorted(subtask_ids)
            assert subtask_ids[-1] == len(env.subtasks) - 1
    assert wins == 10


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_expert_succeeds_95_percent_over_100_seeds(family):
    env = TabletopEnv(family, cameras=())
    wins = 0
    for seed in range(1000, 1100):
        env.reset(seed=seed)
        expert = ScriptedExpert(env)
        while True:
            _, _, terminated, truncated, info = env.step(expert.act())
            if terminated or truncated:
                break
        wins += info["success"]
    assert wins >= 95


def test_noise_degrades_the_expert():
    env = TabletopEnv(cameras=())

    def success_rate(noise):
        wins = 0
        for seed in range(12):
            env.reset(seed=seed)
            expert = ScriptedExpert(env, noise=noise, seed=seed)
            while True:
                _, _, terminated, truncated, info = env.step(expert.act())
                if terminated or truncated:
                    break
            wins += info["success"]
        return wins

    assert success_rate(0.0) == 12
    assert success_rate(1.0) < 10


def test_rewards_and_truncation():
    env = TabletopEnv(cameras=(), max_steps=3)
    env.reset(seed=0)
    results = [env.step(np.zeros(4)) for _ in range(3)]
    assert [r[1] for r in results] == [-1.0, -1.0, -1.0]
    assert [r[3] for r in results] == [False, False, True] and not any(r[2] for r in results)


def test_subtask_progress_rises_under_the_expert():
    env = TabletopEnv(cameras=())
    env.reset(seed=3)
    expert = ScriptedExpert(env)
    start = env.subtask_progress()
    for _ in range(20):
        env.step(expert.act())
    assert env.subtask_progress()[0] > start[0]


def test_bad_inputs_get_clear_errors():
    with pytest.raises(ValueError, match="did you mean 'stack'"):
        TabletopEnv("stak")
    with pytest.raises(ValueError, match="unknown camera"):
        TabletopEnv(cameras=("wrist",))
    with pytest.raises(ValueError, match="image_size"):
        TabletopEnv(image_size=4)
    env = TabletopEnv(cameras=())
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.zeros(4))
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        env.step(np.zeros(3))
    with pytest.raises(ValueError, match="non-finite"):
        env.step(np.array([0, np.nan, 0, 0]))
    with pytest.raises(ValueError, match="options"):
        env.reset(seed=0, options={"task": 1})


def test_rendering_failure_says_what_to_install(monkeypatch):
    from capsule_rollout.envs import gl_backend, offscreen_renderer

    class Broken:
        def __init__(self, *args):
            raise RuntimeError("cannot open display")

    monkeypatch.setattr(offscreen_renderer, "context_class", lambda backend: Broken)
    env = TabletopEnv()
    with pytest.raises(RenderingUnavailableError, match="apt-get install"):
        env.reset(seed=0)
    monkeypatch.delenv("MUJOCO_GL", raising=False)
    monkeypatch.setattr(gl_backend, "_have", lambda *libs: False)
    env = TabletopEnv()
    with pytest.raises(RenderingUnavailableError, match="apt-get install"):
        env.reset(seed=0)


def test_rendering_works_whatever_module_is_imported_first(tmp_path):
    """mujoco imported first with MUJOCO_GL unset (so it picked glfw, which needs a display): the renderer
    still makes its own EGL/OSMesa context, and nothing set MUJOCO_GL on the way."""
    import os
    import subprocess
    import sys

    script = (
        "import os, mujoco\n"
        "import capsule_rollout.tabletop.env_steppable as s\n"
        "step = s.TabletopSteppable('pick_place')\n"
        "print(step.env.observe()['image_front'].std() > 0, os.environ.get('MUJOCO_GL'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "PYOPENGL_PLATFORM")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "True None"


def test_backend_selection(monkeypatch):
    from capsule_rollout.envs import gl_backend

    monkeypatch.delenv("MUJOCO_GL", raising=False)
    monkeypatch.setattr(gl_backend, "_have", lambda *libs: libs == ("OSMesa",))
    assert gl_backend.select_backend() == "osmesa"
    assert "MUJOCO_GL" not in os.environ  # chosen, never written
    monkeypatch.setattr(gl_backend, "_have", lambda *libs: False)
    assert gl_backend.select_backend() is None
    monkeypatch.setenv("MUJOCO_GL", "EGL ")
    assert gl_backend.select_backend() == "egl"
    with pytest.raises(RenderingUnavailableError, match="not an offscreen backend"):
        gl_backend.context_class("wgl")


def test_the_observation_after_a_step_equals_the_one_after_restoring_there():
    """Observations see the current state (no pose or contact one substep stale)."""
    from capsule_rollout.capsules import Arena, restore, snapshot

    env = TabletopEnv("pick_place", cameras=("front",))
    arena = Arena([env]).allocate()
    env.reset(seed=4)
    for _ in range(6):
        obs, *_ = env.step(np.array([0.6, -0.4, -1.0, 1.0], np.float32))
    capsule = snapshot(arena, step=6)
    restore(arena, capsule)
    again = env.observe()
    assert np.array_equal(obs["image_front"], again["image_front"])
    assert np.array_equal(obs["state"], again["state"])
    env.close()
