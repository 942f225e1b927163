"""gymnasium's MuJoCo v5 envs: nothing to declare beyond what the adapter finds.

The hidden-state scan finds no Python state in these envs that changes across
reset and step (their goals live in qpos; Ant, Humanoid and the other runners
compute their forward reward from body positions read before `mj_step`, which
the captured MjData reproduces), so
the declarations are the camera and the episode limit gymnasium registers.

Any other id in gymnasium's registry is accepted too, as the user's package registered it: `gymnasium:MyEnv-v0`
(registered when the package was imported), or `gymnasium:mylab.envs:MyEnv-v0` (gymnasium's own
`module:id` form: the module is imported first, registering its ids). Nothing is declared for those: the adapter
captures the env's whole object graph, success is its step info's `success` (or `is_success`), and the model's
own cameras are there by name beside `free`.
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


def accepts(task: str) -> bool:
    """Whether `task` is an id gymnasium knows (importing the module of a `module:id` first)."""
    if task in TASKS:
        return True
    module, sep, name = task.rpartition(":")
    if sep:
        import importlib

        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ValueError(f"gymnasium:{task}: module {module!r} does not import ({exc})") from None
    return (name if sep else task) in gym.registry


def make(task: str) -> tuple[gym.Env, CaptureSpec]:
    from capsule_rollout.envs.mujoco_capsule import find_physics
    from capsule_rollout.envs.suites.catalog import default_camera, info_success, model_cameras

    if task not in TASKS:  # a user's own registered id: nothing declared (the whole object graph)
        env = gym.make(task, disable_env_checker=True)
        model = find_physics(env)[0]
        return env, CaptureSpec(task=f"gymnasium:{task}", cameras={"free": default_camera(model),
                                                                   **model_cameras(model)},
                                max_steps=env.spec.max_episode_steps or 1000, success=info_success)
    env = gym.make(task, disable_env_checker=True)
    return env, CaptureSpec(task=f"gymnasium:{task}", cameras={"free": default_camera(env.unwrapped.model)},
                            max_steps=env.spec.max_episode_steps or 1000, graph=False)
