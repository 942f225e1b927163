"""The env's own observation reaches the policy as the env gives it: a Dict observation's leaves under
`observation.<key>` with their shapes and dtypes (nested dicts intact when a policy reads `observation`), kept in
the capsule as they are, and renamed by a policy's `key_map` (LeRobot's and openpi's names)."""

from __future__ import annotations

import gymnasium as gym
import mujoco
import numpy as np

from capsule_rollout.capsules import Arena, restore, snapshot
from capsule_rollout.envs.suites import make_env
from capsule_rollout.rollout.host_factory import RunSpec, build_host, build_slots
from capsule_rollout.rollout.rollout_host import HostConfig
from capsule_rollout.rollout.slots.host import episode_job
from tests.envs.broken_envs import XML

ENV = f"{__name__}:make_dict_env"


class DictObservation(gym.Env):
    """A puck whose observation is a Dict: float32 position, a uint8 picture, a nested float64 goal."""

    def __init__(self):
        self.model = mujoco.MjModel.from_xml_string(XML)
        self.data = mujoco.MjData(self.model)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.observation_space = gym.spaces.Dict({
            "agent_pos": gym.spaces.Box(-10, 10, (2,), np.float32),
            "pixels": gym.spaces.Box(0, 255, (4, 5, 3), np.uint8),
            "extra": gym.spaces.Dict({"goal": gym.spaces.Box(-1, 1, (2,), np.float64)}),
        })

    def _obs(self):
        pos = self.data.qpos[7:9].astype(np.float32)
        pixels = np.full((4, 5, 3), int(abs(pos[0]) * 500) % 256, np.uint8)
        return {"agent_pos": pos, "pixels": pixels, "extra": {"goal": self.goal.copy()}}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        mujoco.mj_resetData(self.model, self.data)
        self.goal = self.np_random.uniform(-0.3, 0.3, 2)
        mujoco.mj_forward(self.model, self.data)
        return self._obs(), {}

    def step(self, action):
        self.data.ctrl[:] = action
        mujoco.mj_step(self.model, self.data, nstep=4)
        return self._obs(), 0.0, False, False, {}


def make_dict_env():
    return gym.wrappers.TimeLimit(DictObservation(), max_episode_steps=30)


class ReadsItsOwnKeys:
    """Reads the env's nested observation as it is, and LeRobot-style names through a key map."""

    chunk_length = 3
    deterministic = True
    key_map = {"observation.state": "observation.agent_pos", "observation.images.top": "observation.pixels",
               "env": "observation", "task": "prompt"}
    seen: list = []

    def infer(self, obs):
        ReadsItsOwnKeys.seen.append(obs)
        goal = obs["env"]["extra"]["goal"]
        return np.tile(np.clip(goal - obs["observation.state"], -1, 1), (3, 1)).astype(np.float32)

    def infer_batch(self, obs):
        ReadsItsOwnKeys.seen.append(obs)
        goal = obs["env"]["extra"]["goal"]
        return np.repeat(np.clip(goal - obs["observation.state"], -1, 1)[:, None], 3, axis=1).astype(np.float32)


def reads_its_own_keys():
    return ReadsItsOwnKeys()


def test_a_dict_observation_keeps_its_leaves_shapes_and_dtypes_and_restores_them():
    env = make_env(ENV, cameras=())
    spec = env.observation_spec.arrays
    assert {k: (s.shape, s.dtype) for k, s in spec.items() if k.startswith("observation")} == {
        "observation.agent_pos": ((2,), np.float32), "observation.pixels": ((4, 5, 3), np.uint8),
        "observation.extra.goal": ((2,), np.float64)}
    arena = Arena([env]).allocate()
    env.reset(seed=3)
    env.step(np.ones(2, np.float32))
    capsule, before = snapshot(arena), env.observe()
    assert before["observation.pixels"].dtype == np.uint8 and before["observation.agent_pos"].dtype == np.float32
    kept = [capsule.buffer(f"env/obs_native_{i}") for i in range(3)]
    assert [(tuple(t.shape), t.dtype.itemsize) for t in kept if t.dim() == 3] == [((4, 5, 3), 1)]  # uint8, once
    for _ in range(3):
        env.step(-np.ones(2, np.float32))
    restore(arena, capsule)
    after = env.observe()
    for key in before:
        assert before[key].dtype == after[key].dtype and np.array_equal(before[key], after[key]), key
    env.close()


def test_a_policy_reads_the_nested_observation_and_its_own_names():
    ReadsItsOwnKeys.seen = []
    host = build_host(RunSpec(env=ENV, policy=f"{__name__}:reads_its_own_keys", host=HostConfig(n_exec=3)))
    try:
        result = host.run_episode(1)
        assert result.error == ""
        first = ReadsItsOwnKeys.seen[0]
        assert set(first) == {"observation.state", "observation.images.top", "env"}  # no instruction: no `task`
        assert first["observation.images.top"].dtype == np.uint8 and first["observation.state"].dtype == np.float32
        assert set(first["env"]) == {"agent_pos", "pixels", "extra"} and first["env"]["extra"]["goal"].shape == (2,)
        assert not [k for k in host.env.observation_spec.arrays if k.startswith("image_")]  # nothing rendered
    finally:
        host.close()


def test_rows_of_a_batching_policy_stack_the_nested_observation():
    ReadsItsOwnKeys.seen = []
    slots = build_slots(RunSpec(env=ENV, policy=f"{__name__}:reads_its_own_keys", slots=3,
                                 host=HostConfig(n_exec=3, max_steps=9)))
    try:
        results = slots.run_items([episode_job(s) for s in range(3)])
        assert [r.value.error for r in results] == [""] * 3
        batch = ReadsItsOwnKeys.seen[-1]
        assert batch["env"]["extra"]["goal"].shape == (3, 2) and batch["observation.images.top"].shape == (3, 4, 5, 3)
        assert batch["task"] == [None, None, None]  # one prompt per row (none: the env gives no instruction)
    finally:
        slots.close()
