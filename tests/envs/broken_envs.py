"""Envs built to break a capsule in one known way each (for the diagnostics of `envs.env_scenarios`)."""

from __future__ import annotations

import gymnasium as gym
import mujoco
import numpy as np

XML = """<mujoco><worldbody><geom type="plane" size="1 1 .1"/>
<body name="box" pos="0 0 .06"><freejoint/><geom type="box" size=".05 .05 .05"/></body>
<body name="puck" pos=".3 0 .05"><joint name="x" type="slide" axis="1 0 0"/><joint name="y" type="slide"
axis="0 1 0"/><geom type="sphere" size=".05"/></body></worldbody><actuator><motor joint="x" ctrlrange="-1 1"/>
<motor joint="y" ctrlrange="-1 1"/></actuator></mujoco>"""


class Boxes(gym.Env):
    """A box resting on the floor (contacts) and an actuated puck; everything in MjData."""

    def __init__(self):
        self.model = mujoco.MjModel.from_xml_string(XML)
        self.data = mujoco.MjData(self.model)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (self.model.nq + self.model.nv,), np.float64)

    def observe(self):
        return np.concatenate([self.data.qpos, self.data.qvel])

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        mujoco.mj_resetData(self.model, self.data)
        self.data.qpos[7:9] = self.np_random.uniform(-0.3, 0.3, 2)
        mujoco.mj_forward(self.model, self.data)
        return self.observe(), {}

    def physics_step(self):
        mujoco.mj_step(self.model, self.data, nstep=4)

    def step(self, action):
        self.data.ctrl[:] = action
        self.physics_step()
        return self.observe(), 0.0, False, False, {}


class KeepsACounter(Boxes):
    """Counts its steps in a Python attribute of its own and shows the count: state outside MjData."""

    def __init__(self):
        super().__init__()
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (self.model.nq + self.model.nv + 1,), np.float64)

    def reset(self, *, seed=None, options=None):
        self.count = 0
        obs, info = super().reset(seed=seed, options=options)
        return self.observe(), info

    def observe(self):
        return np.append(super().observe(), getattr(self, "count", 0))

    def step(self, action):
        self.count += 1
        return super().step(action)


class Step2First(Boxes):
    """Steps as dm_control does: `mj_step2` first (it reads the constraint data of the previous `mj_step1`,
    which lives in MjData's arena, outside the buffer a capsule holds), then `mj_step1` for the next step."""

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        mujoco.mj_step1(self.model, self.data)
        return obs, info

    def physics_step(self):
        for _ in range(4):
            mujoco.mj_step2(self.model, self.data)
            mujoco.mj_step1(self.model, self.data)


def make_boxes():
    return gym.wrappers.TimeLimit(Boxes(), max_episode_steps=100)


def make_counter():
    return gym.wrappers.TimeLimit(KeepsACounter(), max_episode_steps=100)


def make_step2_first():
    return gym.wrappers.TimeLimit(Step2First(), max_episode_steps=100)
