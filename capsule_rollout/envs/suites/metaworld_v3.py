"""Meta-World v3 (`pip install -e ".[metaworld]"`): 50 Sawyer manipulation tasks and their scripted policies.

Meta-World 3.1.1 pins mujoco 3.3.0 and does not run on mujoco 4.0.0 (its
`reset_mocap_welds` writes 11 numbers into `eq_data`, which MuJoCo 4 widened to
12): the extra installs mujoco 3.3.0 (see docs/how-to/own-env.md).

Declarations (from `scan_env`): its `reset` ignores the seed, and task positions
come from `_last_rand_vec`, frozen per task; the seed function switches on
Meta-World's own seeded mode (`seeded_rand_vec`, `seed()`), so `reset(seed)`
draws the object and goal positions from the seed. Python state: the frame stack
(`_prev_obs`), the last clipped observation, the path length, the task's random
vector, target and initial positions; the goal site moves per task
(`MjModel.site_pos`). `init_left_pad` / `init_right_pad` are live views into
MjData's `xpos` and are not declared.
"""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np

from capsule_rollout.envs.mujoco_capsule import Attr, Camera, CaptureSpec, MujocoCapsuleEnv
from capsule_rollout.extras import install_command

MUJOCO_VERSIONS = ("3.3.0",)
MAX_STEPS = 500  # Meta-World's max_path_length
CAMERAS = ("corner2", "corner", "corner3", "topview", "behindGripper")


def check() -> None:
    from capsule_rollout.envs.suites.catalog import SuiteUnavailableError

    try:
        import metaworld  # noqa: F401
        import mujoco
    except ImportError as exc:
        raise SuiteUnavailableError(f'Meta-World is not installed ({exc}): {install_command("metaworld")}') from None
    if mujoco.__version__ not in MUJOCO_VERSIONS:
        raise SuiteUnavailableError(
            f"Meta-World 3.1.1 needs mujoco {' or '.join(MUJOCO_VERSIONS)}, this environment has {mujoco.__version__} "
            '(it fails on mujoco 4: eq_data widened from 11 to 12): install the extra in its own venv, '
            f'{install_command("metaworld")}')


def tasks() -> list[str]:
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS

    return sorted(ALL_V3_ENVIRONMENTS)


def instruction(task: str) -> str:
    """`pick-place-v3` -> "pick place"."""
    return task.removesuffix("-v3").replace("-", " ")


def _seed(env: gym.Env, seed: int) -> None:
    """Meta-World's own seeded mode: the task's random vector is drawn from `np_random` at each reset."""
    u = env.unwrapped
    u._freeze_rand_vec = False
    u.seeded_rand_vec = True
    u.seed(seed)


GRAPH_TASKS = frozenset({
    "basketball-v3", "bin-picking-v3", "door-lock-v3", "door-unlock-v3",  # a declared position is a view of MjData
    "dial-turn-v3", "lever-pull-v3", "stick-pull-v3", "stick-push-v3", "window-close-v3", "window-open-v3",
})  # state the declarations miss (the task's own initial positions)
"""Tasks the declarations below do not cover (found by running the rollout scenarios on all 50 tasks): captured
with nothing declared (graph capture) instead."""


def make(task: str) -> tuple[gym.Env, CaptureSpec]:
    env = gym.make("Meta-World/goal_observable", env_name=task, seed=0, disable_env_checker=True)
    u = env.unwrapped
    common = dict(cameras={c: Camera(c, model_camera=c) for c in CAMERAS}, max_steps=MAX_STEPS,
                  instruction=instruction(task), success=lambda info: float(info.get("success", 0.0)) > 0.0,
                  terminate_on_success=True, seed=_seed)
    if task in GRAPH_TASKS:
        return env, CaptureSpec(task=f"metaworld:{task}", **common)
    rand = u._random_reset_space.low.size if u._random_reset_space is not None else 0
    attributes = (
        Attr("curr_path_length", "int"),
        Attr("_prev_obs", "array", (18,)),
        Attr("_last_stable_obs", "array", (39,)),
        Attr("_last_rand_vec", "array", (rand,)),
        Attr("_target_pos", "array", (3,)),
        Attr("obj_init_pos", "array", tuple(np.shape(u.obj_init_pos)) if u.obj_init_pos is not None else (3,)),
        Attr("init_tcp", "array", (3,)),
        Attr("_did_see_sim_exception", "bool"),
        Attr("_freeze_rand_vec", "bool"),
        Attr("seeded_rand_vec", "bool"),
        *_task_attributes(u),
    )
    capture = CaptureSpec(task=f"metaworld:{task}", attributes=attributes, model_fields=("site_pos", "body_pos"),
                          graph=False, **common)
    return env, capture


_TASK_ARRAYS = ("obj_init_angle", "handle_init_pos", "lever_init_pos", "peg_head_pos_init", "_handle_init_pos",
                "_target_to_obj_init", "_state_goal", "maxPlacingDist", "maxPushDist", "maxPullDist", "maxDist",
                "liftThresh", "heightTarget", "target_reward")
"""Task-specific positions and distances some Meta-World tasks set per reset (declared when the task has
them; `scan_env` lists what a task changes)."""


def _task_attributes(u) -> tuple[Attr, ...]:
    out = []
    for name in _TASK_ARRAYS:
        value = getattr(u, name, None)
        if isinstance(value, np.ndarray):
            out.append(Attr(name, "array", value.shape, value.dtype.name))
        elif isinstance(value, float):
            out.append(Attr(name, "float"))
    return tuple(out)


def expert(env: MujocoCapsuleEnv) -> Callable[[], np.ndarray]:
    """Meta-World's scripted policy for the task, acting on the boundary observation."""
    from metaworld.policies import ENV_POLICY_MAP

    policy = ENV_POLICY_MAP[env.task.split(":", 1)[1]]()

    def act() -> np.ndarray:
        return np.asarray(policy.get_action(env.observe()["observation"]), np.float32)

    return act
