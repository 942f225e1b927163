"""gymnasium-robotics (`pip install -e ".[robotics]"`): Fetch and Franka Kitchen.

gymnasium-robotics 1.4.2 allows any mujoco >= 2.2 but does not build its envs on
mujoco 4.0.0 (`mujoco_utils.set_joint_qpos` fails its joint-type assertion for
Fetch's slide joints and Kitchen's joints); on mujoco 3.3.0 they run, so the
extra pins mujoco 3.3.0, the version Meta-World needs too.

Declarations (from `scan_env`):
- Fetch: the goal (`goal`) is Python state drawn at reset; actions move a mocap
  body from the gripper's current `xpos` / `xquat` (derived MjData read before
  `mj_step`, reproduced by the captured MjData buffer).
- Franka Kitchen: the set of tasks still to complete and the completion lists;
  the robot's last noisy joint reading (`robot_env._last_robot_qpos`), from which
  the next control is built; observation noise is drawn every step from the
  nested robot env's generator (found automatically).
"""

from __future__ import annotations

import gymnasium as gym

from capsule_rollout.envs.mujoco_capsule import Attr, Camera, CaptureSpec
from capsule_rollout.extras import install_command

MUJOCO_VERSIONS = ("3.3.0",)
FETCH = ("FetchReach-v4", "FetchPush-v4", "FetchSlide-v4", "FetchPickAndPlace-v4")
KITCHEN = ("FrankaKitchen-v1",)
KITCHEN_TASKS = ("microwave", "kettle", "light switch", "top burner", "bottom burner", "slide cabinet",
                 "hinge cabinet")


def check() -> None:
    from capsule_rollout.envs.suites.catalog import SuiteUnavailableError

    try:
        import gymnasium_robotics  # noqa: F401
        import mujoco
    except ImportError as exc:
        raise SuiteUnavailableError(f'gymnasium-robotics is not installed ({exc}): {install_command("robotics")}') \
            from None
    if mujoco.__version__ not in MUJOCO_VERSIONS:
        raise SuiteUnavailableError(
            f"gymnasium-robotics 1.4.2 builds its envs on mujoco {' or '.join(MUJOCO_VERSIONS)} (this environment has "
            f'{mujoco.__version__}, where Fetch and Kitchen fail at construction): {install_command("robotics")} in '
            "its own venv")


def tasks() -> tuple[str, ...]:
    return FETCH + KITCHEN


def make(task: str) -> tuple[gym.Env, CaptureSpec]:
    import gymnasium_robotics

    from capsule_rollout.envs.suites.catalog import default_camera

    gym.register_envs(gymnasium_robotics)
    env = gym.make(task, disable_env_checker=True)
    model = env.unwrapped.model
    if task in KITCHEN:
        attributes = (
            Attr("tasks_to_complete", "set", universe=KITCHEN_TASKS),
            Attr("step_task_completions", "list", universe=KITCHEN_TASKS),
            Attr("episode_task_completions", "list", universe=KITCHEN_TASKS),
            Attr("robot_env._last_robot_qpos", "array", (9,)),
        )
        cameras = {"free": default_camera(model, elevation=-35.0)}
        success = _kitchen_success
    else:
        attributes = (Attr("goal", "array", (3,)),)
        cameras = {"free": Camera("free", lookat=(1.3, 0.75, 0.55), distance=1.6, azimuth=180.0, elevation=-25.0),
                   "head": Camera("head", model_camera="head_camera_rgb")}
        success = _fetch_success
    return env, CaptureSpec(task=f"robotics:{task}", attributes=attributes, cameras=cameras,
                            max_steps=env.spec.max_episode_steps or 1000, success=success,
                            instruction=_instruction(task), graph=False)


def _fetch_success(info) -> bool:
    return float(info.get("is_success", 0.0)) > 0.0


def _kitchen_success(info) -> bool:
    return not info.get("tasks_to_complete", [None])


def _instruction(task: str) -> str:
    words = {
        "FetchReach-v4": "reach the target",
        "FetchPush-v4": "push the block to the target",
        "FetchSlide-v4": "slide the puck to the target",
        "FetchPickAndPlace-v4": "pick up the block and place it at the target",
        "FrankaKitchen-v1": "open the microwave, move the kettle, switch on the light and burners, open the cabinets",
    }
    return words[task]
