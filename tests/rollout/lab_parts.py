"""What a new lab brings, and how it goes wrong (issue 51): the example's env and policy, a torch module with a
chunk shorter than the default `n_exec`, critics that answer against the contract or raise, an env that breaks
at step 3, an env without a `success` key, factories that raise. Named by import path
`tests.rollout.lab_parts:<name>`, on Ray actors too."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from examples.own_env_and_policy import PuckToGoal


class Chunk4(torch.nn.Module):
    """A torch module planning 4 actions per call (the default n_exec is 8)."""

    chunk_length = 4

    def __init__(self) -> None:
        super().__init__()
        self.gain = torch.nn.Parameter(torch.tensor(3.0), requires_grad=False)

    def forward(self, inputs, noise):
        s = inputs["state"].float().reshape(-1)
        step = (self.gain * (s[4:6] - s[0:2])).clamp(-1, 1)
        return step.expand(4, 2) + 0.0 * noise.reshape(4, 2)


def make_chunk4() -> Chunk4:
    return Chunk4()


class DistanceCritic:
    """Answers a (1,) array where a float is asked for."""

    def value(self, obs):
        s = obs["state"]
        return -np.linalg.norm(s[0:2] - s[4:6], keepdims=True)


def make_distance_critic() -> DistanceCritic:
    return DistanceCritic()


class WrongKeyCritic:
    def value(self, obs):
        return float(obs["obs"][0])  # the lab's own name for it: not what the env gives


def make_wrong_key_critic() -> WrongKeyCritic:
    return WrongKeyCritic()


class LateFailingCritic:
    """Fine at the first chunk (what the preflight probes), raises from step 8 on: in the episodes only."""

    def value(self, obs):
        if obs["step"] >= 8:
            return self.lookup_table[obs["step"]]
        return 0.0


def make_late_failing_critic() -> LateFailingCritic:
    return LateFailingCritic()


class StringPolicy:
    deterministic = True
    chunk_length = 2

    def infer(self, obs):
        return {"actions": [["left", "right"], ["up", "down"]]}


def make_string_policy() -> StringPolicy:
    return StringPolicy()


def raising_env():
    raise RuntimeError("the lab's env could not find its assets")


class ShrinkingObservation(PuckToGoal):
    """Its step returns a 4-value observation from step 3 on, where its space says 6."""

    def reset(self, **kwargs):
        self.count = 0
        return super().reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        self.count += 1
        return (obs[:4] if self.count >= 3 else obs), reward, terminated, truncated, info


def shrinking_env():
    return gym.wrappers.TimeLimit(ShrinkingObservation(), max_episode_steps=40)


class NoSuccessKey(PuckToGoal):
    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated, truncated, {}


def no_success_env():
    return gym.wrappers.TimeLimit(NoSuccessKey(), max_episode_steps=40)


CAMERA_XML = """<mujoco><worldbody><light pos="0 0 2"/><geom type="plane" size="1 1 .1"/>
<camera name="top" pos="0 0 1.5" xyaxes="1 0 0 0 1 0"/>
<body name="puck" pos="0 0 .05"><joint name="x" type="slide" axis="1 0 0"/><joint name="y" type="slide"
axis="0 1 0"/><geom type="sphere" size=".05"/></body><body name="goal" mocap="true"><geom type="cylinder"
size=".06 .005" contype="0" conaffinity="0" rgba="0 1 0 1"/></body></worldbody><actuator><motor joint="x"
ctrlrange="-1 1"/><motor joint="y" ctrlrange="-1 1"/></actuator></mujoco>"""


class SizedPuck(PuckToGoal):
    """The example's env with a camera of its own (`top`), a goal range and a control rate it tells (`dt`)."""

    def __init__(self, goal_range: float = 0.4) -> None:
        import mujoco

        super().__init__()
        self.model = mujoco.MjModel.from_xml_string(CAMERA_XML)
        self.data = mujoco.MjData(self.model)
        self.goal_range = goal_range

    @property
    def dt(self) -> float:
        return 5 * self.model.opt.timestep  # 5 physics steps of 2 ms per control step: 100 Hz

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        self.data.mocap_pos[0, :2] *= self.goal_range / 0.4
        import mujoco

        mujoco.mj_forward(self.model, self.data)
        return self.observe(), info


def sized_env(goal_range: float = 0.4, steps: int = 150):
    """A factory with keyword arguments (`tests.rollout.lab_parts:sized_env={"goal_range": 0.1}`)."""
    return gym.wrappers.TimeLimit(SizedPuck(goal_range), max_episode_steps=steps)


class GainPolicy:
    """A policy factory's object with a keyword argument (its gain)."""

    chunk_length = 4

    def __init__(self, gain: float = 3.0) -> None:
        self.gain = gain

    def infer(self, obs, *, noise):
        s = obs["state"]
        return {"actions": np.clip(self.gain * (s[4:6] - s[0:2]) + 0.0 * noise, -1.0, 1.0)}


gymnasium_id = "LabSizedPuck-v0"  # the lab's own id, registered when its module is imported
if gymnasium_id not in gym.registry:
    gym.register(gymnasium_id, entry_point=f"{__name__}:SizedPuck", max_episode_steps=60)


class RatelessPuck(PuckToGoal):
    metadata = {}  # tells no control rate: no `dt`, `control_hz` or render_fps


def rateless_env():
    return gym.wrappers.TimeLimit(RatelessPuck(), max_episode_steps=40)


class NanModule(Chunk4):
    def forward(self, inputs, noise):
        return super().forward(inputs, noise) * float("nan")


def make_nan_module() -> NanModule:
    return NanModule()


class _Push:
    """The example's policy, as a base for the broken members below."""

    chunk_length = 8

    def infer(self, obs, *, noise):
        s = obs["state"]
        return np.clip(3.0 * (s[4:6] - s[0:2]) + 0.2 * noise, -1.0, 1.0)


class NoInfer:
    chunk_length = 8

    def act(self, obs):  # named otherwise
        return np.zeros((8, 2))


class InferNotCallable(_Push):
    infer = "yes"


class ResetWithSeed(_Push):
    def reset(self, seed):  # the internal protocol's shape, not a user's
        self.seed = seed


class ChunkLengthFloat(_Push):
    chunk_length = 8.0


class ChunkLengthZero(_Push):
    chunk_length = 0


class KeysAString(_Push):
    observation_keys = "state"


class KeyMapList(_Push):
    key_map = ["state"]


class DeterministicString(_Push):
    deterministic = "yes"


class GetStateOnly(_Push):
    def get_state(self):
        return {}


class InferBatchNotCallable(_Push):
    infer_batch = 4


class NoValue:
    def values(self, obs):
        return 0.0


class CriticResetWithSeed:
    def value(self, obs):
        return 0.0

    def reset(self, seed):
        pass


BROKEN_POLICIES = {
    NoInfer: "NoInfer.infer is missing: a policy answers infer(obs, *, noise) -> action chunk (T, A)",
    InferNotCallable: "InferNotCallable.infer is not callable",
    ResetWithSeed: "ResetWithSeed.reset takes arguments: reset() is called with none at every episode start",
    ChunkLengthFloat: "ChunkLengthFloat.chunk_length is 8.0: give the number of actions each infer answers",
    ChunkLengthZero: "ChunkLengthZero.chunk_length is 0: give the number of actions each infer answers",
    KeysAString: "KeysAString.observation_keys is 'state': give a list or tuple of the env's observation keys",
    KeyMapList: "KeyMapList.key_map is ['state']: give a dict",
    DeterministicString: "DeterministicString.deterministic is 'yes': give True or False",
    GetStateOnly: "GetStateOnly.set_state is missing: give get_state() and set_state(state) together",
    InferBatchNotCallable: "InferBatchNotCallable.infer_batch is a int: make it a method",
}
BROKEN_CRITICS = {
    NoValue: "NoValue.value is missing: a critic answers value(obs) -> float",
    CriticResetWithSeed: "CriticResetWithSeed.reset takes arguments",
}


def make_broken_policy(name: str):
    return next(c for c in BROKEN_POLICIES if c.__name__ == name)()


def make_broken_critic(name: str):
    return next(c for c in BROKEN_CRITICS if c.__name__ == name)()
