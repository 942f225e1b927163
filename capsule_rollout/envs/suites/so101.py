"""The SO-101 pick-cube env (`pip install -e ".[so101]"`, lerobot-env-so101): LeRobot's low-cost arm.

Nothing is declared: graph capture holds its Python state (the target end-effector position, the cube's
initial height set at reset, its numpy `Generator` and legacy `RandomState`). The cube is placed from the
seed (`random_block_position=True`: the package's default puts it at one place whatever the seed).
"""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np

from capsule_rollout.envs.mujoco_capsule import Camera, CaptureSpec
from capsule_rollout.extras import install_command

TASKS = ("SO101PickCube-v0",)


def check() -> None:
    import importlib.util

    from capsule_rollout.envs.suites.catalog import SuiteUnavailableError

    if importlib.util.find_spec("lerobot_env_so101") is None:
        raise SuiteUnavailableError(f'lerobot-env-so101 is not installed: {install_command("so101")}')


def tasks() -> tuple[str, ...]:
    return TASKS


def make_env(task: str) -> gym.Env:
    import lerobot_env_so101  # noqa: F401 - registers the id

    return gym.make(f"lerobot_env_so101/{task}", random_block_position=True)


def make(task: str) -> tuple[gym.Env, CaptureSpec]:
    env = make_env(task)
    return env, CaptureSpec(task=f"so101:{task}", cameras={"front": Camera("front", model_camera="front")},
                            max_steps=env.spec.max_episode_steps or 100, instruction="pick up the cube",
                            success=lambda info: bool(info.get("succeed")), terminate_on_success=True)


def expert(env) -> Callable[[], np.ndarray]:
    """The package's own scripted controller for this task (`scripted_reach_close`: reaches the cube and closes
    the gripper on it; the package's labeller for behaviour cloning, which never lifts the cube, so its
    episodes do not count as successes), acting on the boundary observation (`agent_pos`, then
    `environment_state`, as it expects)."""
    from lerobot_env_so101.scripted import scripted_reach_close

    def act() -> np.ndarray:
        return scripted_reach_close(env.flat_observation())

    return act
