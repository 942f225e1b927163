"""robosuite 1.5 (`make suites-venv`: the `robosuite` extra, then robosuite itself without its mink pin):
the single-arm manipulation tasks, a Panda with its default controller, in robosuite's own `GymWrapper`.

Nothing is declared: graph capture holds robosuite's state (a new MjModel / MjData compiled at every reset,
with object sizes and poses drawn into the model; controllers, grippers and observables rebuilt; the
placement sampler's generator, shared with the env). robosuite's `reset()` takes no seed (its `GymWrapper`
seeds only the global `np.random`): the seed function reseeds the env's generator in place (replacing it
would leave the sampler on the old one). robosuite renders nothing here (`has_offscreen_renderer=False`:
its GL context is freed by Python's garbage collector inside whatever context is current, so its images
depend on when the collector runs); images come from the framework's renderer, cameras from the model.
robosuite 1.5.2 fails on mujoco 4.0.0 (`get_joint_qpos_addr`): it runs on 3.3.0.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from capsule_rollout.envs.mujoco_capsule import Camera, CaptureSpec
from capsule_rollout.extras import install_command

MUJOCO_VERSIONS = ("3.3.0",)
TASKS = ("Lift", "Stack", "Door", "NutAssembly", "NutAssemblySingle", "NutAssemblySquare", "NutAssemblyRound",
         "PickPlace", "PickPlaceSingle", "PickPlaceMilk", "PickPlaceBread", "PickPlaceCereal", "PickPlaceCan",
         "Wipe", "ToolHang")
"""robosuite's single-arm manipulation tasks (the two-arm ones need two robots)."""
INSTRUCTIONS = {"Lift": "lift the cube", "Stack": "stack the red cube on the green cube", "Door": "open the door",
                "Wipe": "wipe the table", "ToolHang": "hang the tool on the stand"}
CAMERAS = ("agentview", "frontview", "birdview", "sideview", "robot0_robotview", "robot0_eye_in_hand")
HORIZON = 500


def check() -> None:
    from capsule_rollout.envs.suites.catalog import SuiteUnavailableError

    try:
        import mujoco
        import robosuite  # noqa: F401
    except ImportError as exc:
        raise SuiteUnavailableError(f"robosuite is not installed ({exc}): {install_command('robosuite')}, then "
                                    "pip install --no-deps robosuite==1.5.2 (a checkout: make suites-venv)") from None
    if mujoco.__version__ not in MUJOCO_VERSIONS:
        raise SuiteUnavailableError(f"robosuite 1.5.2 does not run on mujoco {mujoco.__version__} "
                                    f"(it needs {', '.join(MUJOCO_VERSIONS)}): make suites-venv")


def tasks() -> tuple[str, ...]:
    return TASKS


def instruction(task: str) -> str:
    if task in INSTRUCTIONS:
        return INSTRUCTIONS[task]
    if task.startswith("NutAssembly"):
        return "put the nut on its peg"
    return "put the object in its bin"  # PickPlace*


class Success(gym.Wrapper):
    """Adds robosuite's own success check to each step's info (`success`); keeps no state."""

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        info = dict(info, success=bool(self.env.unwrapped._check_success()))  # robosuite's env itself
        return obs, reward, terminated, truncated, info


def make_env(task: str, *, horizon: int = HORIZON) -> gym.Env:
    """robosuite's env as its users make it, in its `GymWrapper` (state observation: proprioception and
    object state)."""
    import robosuite
    from robosuite.wrappers import GymWrapper

    env = robosuite.make(task, robots="Panda", has_renderer=False, has_offscreen_renderer=False,
                         use_camera_obs=False, horizon=horizon)
    return Success(GymWrapper(env))


def _seed(env: gym.Env, seed: int) -> None:
    rng = env.unwrapped.rng  # robosuite's env (its wrappers unwrap to it); shared with the placement sampler
    rng.bit_generator.state = np.random.default_rng(seed).bit_generator.state


def make(task: str) -> tuple[gym.Env, CaptureSpec]:
    env = make_env(task)
    return env, CaptureSpec(task=f"robosuite:{task}", cameras={c: Camera(c, model_camera=c) for c in CAMERAS},
                            max_steps=HORIZON, instruction=instruction(task), seed=_seed,
                            success=lambda info: bool(info.get("success", False)), terminate_on_success=True)
