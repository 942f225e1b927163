"""A third-party suite as a package registers one (entry-point group `capsule_rollout.suites`): its declarations
module, with one task whose env tells its control rate (`dt`, 25 Hz) and whose actuators are named."""

from __future__ import annotations

import gymnasium as gym

from capsule_rollout.envs import CaptureSpec
from tests.rollout.lab_parts import SizedPuck

TASKS = ("puck-v1",)


class SlowPuck(SizedPuck):
    @property
    def dt(self) -> float:
        return 0.04


def check() -> None:
    """Nothing to install."""


def tasks() -> tuple[str, ...]:
    return TASKS


def make(task: str) -> tuple[gym.Env, CaptureSpec]:
    from capsule_rollout.envs.suites.catalog import default_camera, info_success

    env = gym.wrappers.TimeLimit(SlowPuck(), max_episode_steps=30)
    return env, CaptureSpec(task=f"labsuite:{task}", cameras={"free": default_camera(env.unwrapped.model)},
                            max_steps=30, success=info_success)
