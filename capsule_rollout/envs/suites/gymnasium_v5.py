"""gymnasium's MuJoCo v5 envs: nothing to declare beyond what the adapter finds.

The hidden-state scan finds no Python state in these envs that changes across
reset and step (their goals live in qpos; Ant, Humanoid and the other runners
compute their forward reward from body positions read before `mj_step`, which
the captured MjData reproduces), so
the declarations are the camera and the episode limit gymnasium registers.
"""

from __future__ import annotations

import gymnasium as gym

from capsule_rollout.envs.mujoco_capsule import CaptureSpec

TASKS = ("Ant-v5", "HalfCheetah-v5", "Hopper-v5", "Humanoid-v5", "HumanoidStandup-v5", "InvertedDoublePendulum-v5",
         "InvertedPendulum-v5", "Pusher-v5", "Reacher-v5", "Swimmer-v5", "Walker2d-v5")


def check() -> None:
    """Always available: gymnasium and mujoco are the project's own dependencies."""


def tasks() -> tuple[str, ...]:
    return TASKS


def make(task: str) -> tuple[gym.Env, CaptureSpec]:
    from capsule_rollout.envs.suites.registry import default_camera

    env = gym.make(task, disable_env_checker=True)
    return env, CaptureSpec(task=f"gymnasium:{task}", cameras={"free": default_camera(env.unwrapped.model)},
                            max_steps=env.spec.max_episode_steps or 1000, graph=False)
