"""Envs built to break a capsule in one known way each: state the declared capture misses, which the graph
capture (`CaptureSpec.graph`, the default for an import path) must find with nothing declared, and which the
diagnostics of `envs.env_scenarios` must name when it is missed (the `*_declared` factories: the same envs
under the declared fast path, nothing declared)."""

from __future__ import annotations

import os

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


class Sampler:
    """Draws placements from a generator it shares with its env (as robosuite's placement sampler does)."""

    def __init__(self, rng):
        self.rng = rng

    def sample(self):
        return self.rng.uniform(-0.3, 0.3, 2)


class ReseedsInPlace(Boxes):
    """A legacy `RandomState` made once, shared with a sampler and reseeded in place at every reset (robosuite's
    way); it jitters every action: state the declared capture (PCG64 generators only) misses."""

    def __init__(self):
        super().__init__()
        self.rng = np.random.RandomState(0)
        self.sampler = Sampler(self.rng)

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        self.rng.seed(0 if seed is None else seed)
        self.data.qpos[7:9] = self.sampler.sample()
        mujoco.mj_forward(self.model, self.data)
        return self.observe(), info

    def step(self, action):
        return super().step(np.asarray(action) + self.sampler.rng.normal(0.0, 0.2, 2))


class Controller:
    """A goal and an integral error (a robosuite controller's goal pose and interpolator, in small)."""

    def __init__(self, goal):
        self.goal = goal
        self.integral = np.zeros(2)
        self.history = []

    def command(self, pos, action):
        error = self.goal - pos
        self.integral += error
        self.history.append(float(error[0]))
        return np.clip(action + 2.0 * error + 0.1 * self.integral, -1, 1)


class RebuildsAtReset(Boxes):
    """Builds a new controller at every reset (goal drawn from the seed) whose integral grows each step and whose
    history list grows; the observation shows the integral."""

    def __init__(self):
        super().__init__()
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (self.model.nq + self.model.nv + 2,), np.float64)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        self.controller = Controller(self.np_random.uniform(-0.2, 0.2, 2))
        return self.observe(), {}

    def observe(self):
        c = getattr(self, "controller", None)
        return np.concatenate([super().observe(), c.integral if c is not None else np.zeros(2)])

    def step(self, action):
        return super().step(self.controller.command(self.data.qpos[7:9], action))


class AliasIntoMjData(Boxes):
    """Keeps a view of MjData's qpos made at construction and acts through it: a restore must re-link it to the
    env's MjData (a copy would freeze the puck's position as the env sees it)."""

    def __init__(self):
        super().__init__()
        self.puck = self.data.qpos[7:9]

    def step(self, action):
        return super().step(np.asarray(action) - 0.5 * self.puck)


def make_boxes():
    return gym.wrappers.TimeLimit(Boxes(), max_episode_steps=100)


def make_counter():
    return gym.wrappers.TimeLimit(KeepsACounter(), max_episode_steps=100)


def make_step2_first():
    return gym.wrappers.TimeLimit(Step2First(), max_episode_steps=100)


def make_reseeds_in_place():
    return gym.wrappers.TimeLimit(ReseedsInPlace(), max_episode_steps=100)


def make_rebuilds_at_reset():
    return gym.wrappers.TimeLimit(RebuildsAtReset(), max_episode_steps=100)


def make_alias():
    return gym.wrappers.TimeLimit(AliasIntoMjData(), max_episode_steps=100)


def make_user_style():
    """`gymnasium.make` as users call it, default wrappers (PassiveEnvChecker, OrderEnforcing) included."""
    return gym.make("Reacher-v5")


def _declared(make, task):
    from capsule_rollout.envs.mujoco_capsule import CaptureSpec, MujocoCapsuleEnv

    return MujocoCapsuleEnv(make(), CaptureSpec(task=task, graph=False))


def make_counter_declared():
    return _declared(make_counter, "counter (declared)")


def make_reseeds_in_place_declared():
    return _declared(make_reseeds_in_place, "reseeds in place (declared)")


def make_rebuilds_at_reset_declared():
    return _declared(make_rebuilds_at_reset, "rebuilds at reset (declared)")


def make_step2_first_declared():
    return _declared(make_step2_first, "step2 first (declared)")


class SeedOutOfSight(Boxes):
    """The seed places the puck, which the observation does not show (gym-aloha's box pose, in small)."""

    def __init__(self):
        super().__init__()
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (7,), np.float64)

    def observe(self):
        return self.data.qpos[:7].copy()


def make_seed_out_of_sight():
    return gym.wrappers.TimeLimit(SeedOutOfSight(), max_episode_steps=100)


class ImageOfItsOwnSize(Boxes):
    """Says its observation is a 32x32 image, returns 48x48 (gym-aloha's 480x640 whatever its size options say)."""

    def __init__(self):
        super().__init__()
        self.observation_space = gym.spaces.Dict({"pixels": gym.spaces.Box(0, 255, (32, 32, 3), np.uint8)})

    def observe(self):
        return {"pixels": np.zeros((48, 48, 3), np.uint8)}


def make_image_of_its_own_size():
    return gym.wrappers.TimeLimit(ImageOfItsOwnSize(), max_episode_steps=100)


class RebuildsModel(gym.Env):
    """Compiles a new model at every reset with the box's size drawn from the seed, keeping it in an object of
    its own (`sim_model` / `sim_data`, not `model` / `data`), as robosuite does."""

    def __init__(self):
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (18,), np.float64)
        self._build(0.05)

    def _build(self, half):
        self.sim_model = mujoco.MjModel.from_xml_string(XML.replace('size=".05 .05 .05"', f'size="{half} {half} {half}"'))
        self.sim_data = mujoco.MjData(self.sim_model)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._build(float(self.np_random.uniform(0.03, 0.07)))
        self.sim_data.qpos[7:9] = self.np_random.uniform(-0.3, 0.3, 2)
        mujoco.mj_forward(self.sim_model, self.sim_data)
        return self.observe(), {}

    def observe(self):
        return np.concatenate([self.sim_data.qpos, self.sim_data.qvel, [self.sim_model.geom_size[1, 0]]])

    def step(self, action):
        self.sim_data.ctrl[:] = action
        mujoco.mj_step(self.sim_model, self.sim_data, nstep=4)
        return self.observe(), 0.0, False, False, {}


def make_rebuilds_model():
    return gym.wrappers.TimeLimit(RebuildsModel(), max_episode_steps=100)


def make_camera_not_captured():
    """gymnasium's `AddRenderObservation` around InvertedPendulum with the viewer's camera left out of the
    capture (`CaptureSpec.exclude`): the viewer aims it at the geometry of the unseeded reset the wrapper makes
    when built, so an env built in another process renders its frames from elsewhere."""
    from capsule_rollout.envs.mujoco_capsule import CaptureSpec, MujocoCapsuleEnv
    from capsule_rollout.envs.suites.catalog import default_camera, find_physics
    from tests.envs.user_factories import pendulum_pixels

    env = pendulum_pixels()
    # Two unseeded resets land within a pixel of each other about one build in twenty, and then the missed
    # camera would go unseen. Each build therefore also moves the camera along by a count that a fresh process
    # inherits from this one's environment, so no two builds ever aim it alike.
    builds = int(os.environ.get("CAPSULE_ROLLOUT_TEST_CAMERA_BUILDS", "0"))
    os.environ["CAPSULE_ROLLOUT_TEST_CAMERA_BUILDS"] = str(builds + 1)
    env.unwrapped.mujoco_renderer._get_viewer("rgb_array").cam.lookat[0] += 0.04 * builds
    capture = CaptureSpec(task="camera not captured", exclude=("cam",),
                          cameras={"free": default_camera(find_physics(env)[0])}, max_steps=1000)
    return MujocoCapsuleEnv(env, capture, cameras=("free",))
