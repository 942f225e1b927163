"""Third-party envs as their users make them (`gymnasium.make` with its default wrappers, nothing declared),
given to the framework as `tests.envs.user_factories:<name>` (the suites' venv: `make suites-venv`)."""

from __future__ import annotations

import os

import gymnasium
import numpy as np


def so101():
    import lerobot_env_so101  # noqa: F401 - registers its ids (its README)

    return gymnasium.make("lerobot_env_so101/SO101PickCube-v0")


def so101_random_block():
    import lerobot_env_so101  # noqa: F401

    return gymnasium.make("lerobot_env_so101/SO101PickCube-v0", random_block_position=True)


def _dm_control(domain: str, task: str):
    import shimmy  # noqa: F401 - registers dm_control/* with gymnasium (its README)

    gymnasium.register_envs(shimmy)
    return gymnasium.make(f"dm_control/{domain}-{task}-v0")


def dm_control_finger():
    return _dm_control("finger", "spin")


def dm_control_humanoid():
    return _dm_control("humanoid", "walk")


def _robotics(env_id: str):
    import gymnasium_robotics

    gymnasium.register_envs(gymnasium_robotics)  # its README
    return gymnasium.make(env_id)


def point_maze():
    return _robotics("PointMaze_UMaze-v3")


def ant_maze():
    return _robotics("AntMaze_UMaze-v5")


def adroit_door():
    return _robotics("AdroitHandDoor-v1")


def myo_elbow():
    """MyoSuite's elbow (its own venv: its wheel pins gymnasium 1.2.3 and mujoco 4, which the suites' venv
    cannot hold beside the others)."""
    import myosuite  # noqa: F401 - registers its ids with gymnasium (its README)

    return gymnasium.make("myoElbowPose1D6MRandom-v0")


def _headless_gl() -> None:
    """Suites read `MUJOCO_GL` once (robosuite when imported, dm_control and gymnasium's viewer at their first
    render); unset, they try GLFW, which needs a display: their users set it."""
    from capsule_rollout.envs.gl_backend import select_backend

    os.environ.setdefault("MUJOCO_GL", select_backend() or "egl")


def _aloha(task: str):
    _headless_gl()  # dm_control renders every observation
    import gym_aloha  # noqa: F401 - registers its ids

    return gymnasium.make(f"gym_aloha/Aloha{task}-v0")


def aloha_insertion():
    return _aloha("Insertion")


def aloha_transfer_cube():
    return _aloha("TransferCube")


def _robosuite(task: str):
    _headless_gl()  # before robosuite is first imported (its camera factory below renders)
    import robosuite
    from robosuite.wrappers import GymWrapper

    # robosuite's own env class with its default controller, in robosuite's gymnasium wrapper; no renderer of
    # its own (images come from the framework's renderer)
    env = robosuite.make(task, robots="Panda", has_renderer=False, has_offscreen_renderer=False,
                         use_camera_obs=False)
    return GymWrapper(env)


def robosuite_lift():
    return _robosuite("Lift")


def robosuite_stack():
    return _robosuite("Stack")


def robosuite_door():
    return _robosuite("Door")


def robosuite_lift_camera():
    """Lift as image policies see it (robomimic, LIBERO): robosuite renders its own camera observation."""
    _headless_gl()
    import robosuite
    from robosuite.wrappers import GymWrapper

    env = robosuite.make("Lift", robots="Panda", has_renderer=False, has_offscreen_renderer=True,
                         use_camera_obs=True, camera_names="agentview", camera_heights=64, camera_widths=64)
    return GymWrapper(env)


def _rendering_gymnasium(name: str):
    """gymnasium's MuJoCo env rendering 64x64 frames."""
    _headless_gl()
    return gymnasium.make(name, render_mode="rgb_array", width=64, height=64)


def pendulum_pixels():
    """gymnasium's `AddRenderObservation` around a MuJoCo env: the rendered frame is the observation."""
    return gymnasium.wrappers.AddRenderObservation(_rendering_gymnasium("InvertedPendulum-v5"), render_only=True)


def reacher_pixels_and_state():
    """`AddRenderObservation` keeping the state beside the frame (a dict observation)."""
    return gymnasium.wrappers.AddRenderObservation(_rendering_gymnasium("Reacher-v5"), render_only=False)


class FrameAsObservation(gymnasium.ObservationWrapper):
    """A user's own wrapper whose observation is the env's frame: unlike `AddRenderObservation` it renders
    nothing when built, so the env's viewer (and the camera it aims at the geometry then) is made at the first
    reset, and in a fresh process at the first render after a restore."""

    def __init__(self, env):
        super().__init__(env)
        self.observation_space = gymnasium.spaces.Box(0, 255, (env.unwrapped.height, env.unwrapped.width, 3),
                                                      np.uint8)

    def observation(self, observation):
        return self.env.render()


def pendulum_frames_lazily():
    return FrameAsObservation(_rendering_gymnasium("InvertedPendulum-v5"))


class NoisePolicy:
    """Any env's actions from the noise it is handed (a capsule holds that noise, so replays hold): a policy
    a foreign env runs with, for the entry points' tests."""

    chunk_length = 8

    def infer(self, obs, *, noise):
        return {"actions": (0.3 * noise).clip(-1.0, 1.0)}


make_noise_policy = NoisePolicy
