"""Envs whose observation is an image they render themselves (gymnasium's `AddRenderObservation`, a user's
wrapper rendering each step) held bit for bit, the framework's camera on too: in every scenario, in two envs
stepped in one thread, and a divergence in an image named by its pixel (`verify_capsule --env`)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from capsule_rollout.capsules import Arena, restore, snapshot
from capsule_rollout.cli.run import main
from capsule_rollout.envs.env_scenarios import SCENARIOS, verify_scenarios
from capsule_rollout.envs.suites import make_env

USER = "tests.envs.user_factories"


@pytest.mark.parametrize("factory", ["pendulum_pixels", "reacher_pixels_and_state", "pendulum_frames_lazily"])
def test_an_env_rendering_its_own_observation_holds_in_every_scenario(factory):
    """The env's viewer (made when the wrapper is built, at an unseeded reset, or at the first reset) aims its
    camera at the geometry it is made at: the camera is capsule state, and a fresh process whose env has not made
    its viewer yet makes it at the restore."""
    report = verify_scenarios(f"{USER}:{factory}", steps=4, restores=2)  # the framework's camera on as well
    assert report.ok and set(report.checks) == set(SCENARIOS), report.failures()


def test_two_envs_render_their_own_frames_in_one_thread():
    """An actor's slots: each env's viewer renders in its own GL context (which it never makes current again),
    whichever env was made or stepped last."""
    a = make_env(f"{USER}:pendulum_pixels")
    arena = Arena([a]).allocate()
    a.reset(seed=0)
    capsule = snapshot(arena, step=0)
    actions = np.random.default_rng(0).uniform(-1, 1, (3, 1)).astype(np.float32)
    alone = [a.step(x)[0]["observation"] for x in actions]
    b = make_env(f"{USER}:reacher_pixels_and_state")  # another scene, its viewer made after a's
    b.reset(seed=1)
    restore(arena, capsule)
    interleaved = []
    for x in actions:
        interleaved.append(a.step(x)[0]["observation"])
        b.step(np.repeat(x, 2))
    assert all(np.array_equal(x, y) for x, y in zip(alone, interleaved))
    assert alone[0].std() > 0  # a picture, not an empty frame
    a.close()
    b.close()


def test_a_divergence_in_an_image_is_named_by_its_pixel(tmp_path):
    out = tmp_path / "v.json"
    assert main(["verify_capsule", "--env", "tests.envs.broken_envs:make_camera_not_captured", "--steps", "3",
                 "--json", str(out)]) == 1
    summary = json.loads(out.read_text())
    fork = next(f for f in summary["components"][0]["failures"] if f.startswith("check failed: fork_branch_exact"))
    assert "step 0 observation[" in fork and "of 4,096 pixels differ" in fork, fork
    scenarios = summary["scenarios"]
    assert scenarios["checks"]["after_reset"] and not scenarios["checks"]["fresh_process"]
    why = scenarios["divergences"]["fresh_process"]
    assert why.startswith("step 0 obs.observation[") and "of 4,096 pixels differ" in why, why
    assert why.endswith("(MjData identical: state kept outside MjData)")
