"""gym-aloha (`pip install -e ".[aloha]"`): the bimanual ALOHA tasks ACT and LeRobot train on, on dm_control's
physics.

Nothing is declared: graph capture holds dm_control's `Physics` wrappers (its named indexers and GL
contexts taken from the env as they are, its view of `MjData.warning` re-linked), the task's generators and
the wrappers' state. dm_control steps `mj_step2` first: the adapter finds MjData left by `mj_step1` and
reruns it at each restore. The observation kept is the arms' joint positions (`agent_pos`); gym-aloha's own
480x640 image (fixed at that size whatever its size options say) is left out, and images come from the
framework's renderer with the model's cameras. dm_control needs `MUJOCO_GL` when it first renders: unset,
the suite sets it to the backend the framework's renderer would choose (EGL or OSMesa) before importing it.
"""

from __future__ import annotations

import os

import gymnasium as gym

from capsule_rollout.envs.mujoco_capsule import Camera, CaptureSpec
from capsule_rollout.extras import install_command

MUJOCO_VERSIONS = ("3.3.0",)
TASKS = ("AlohaInsertion-v0", "AlohaTransferCube-v0")
INSTRUCTIONS = {"AlohaInsertion-v0": "insert the peg into the socket",
                "AlohaTransferCube-v0": "pick up the cube and hand it to the other arm"}
CAMERAS = ("top", "angle", "front_close", "left_wrist", "right_wrist")


def check() -> None:
    from capsule_rollout.envs.suites.catalog import SuiteUnavailableError

    try:
        import importlib.util

        import mujoco
        if importlib.util.find_spec("gym_aloha") is None:
            raise ImportError("No module named 'gym_aloha'")
    except ImportError as exc:
        raise SuiteUnavailableError(f'gym-aloha is not installed ({exc}): {install_command("aloha")}') from None
    if mujoco.__version__ not in MUJOCO_VERSIONS:
        raise SuiteUnavailableError(f"gym-aloha runs here on mujoco {', '.join(MUJOCO_VERSIONS)} (dm-control "
                                    f"1.0.28), not {mujoco.__version__}: make suites-venv")


def tasks() -> tuple[str, ...]:
    return TASKS


def make_env(task: str) -> gym.Env:
    """gym-aloha's env as its users make it (`gymnasium.make`, default wrappers), joint positions observed."""
    if "MUJOCO_GL" not in os.environ:
        from capsule_rollout.envs.gl_backend import select_backend

        backend = select_backend()
        if backend is not None:
            os.environ["MUJOCO_GL"] = backend  # dm_control reads it once, at its first render
    import gym_aloha  # noqa: F401 - registers the ids

    return gym.make(f"gym_aloha/{task}", obs_type="pixels_agent_pos")


def make(task: str) -> tuple[gym.Env, CaptureSpec]:
    env = make_env(task)
    return env, CaptureSpec(task=f"aloha:{task}", cameras={c: Camera(c, model_camera=c) for c in CAMERAS},
                            max_steps=env.spec.max_episode_steps or 400, instruction=INSTRUCTIONS[task],
                            observation_keys=("agent_pos",), success=lambda info: bool(info.get("is_success")))
