"""`MujocoCapsuleSteppable`: a suite env driven by random actions, for `verify_capsule --env`.

Outputs per step: the state vector, the suite's flattened observation, reward,
terminated, each camera's image, and the whole captured MjData (its model-sized
buffer and time), so the harness compares the full simulator state as well.
`scramble` dirties everything the capsule must restore: MjData (integration
state and derived arrays), the declared model fields, every generator, the
declared attributes and the wrapper counters; with graph capture, it first plays
the env elsewhere (a reset to another seed and steps: the Python state moves on)
and perturbs model arrays the capture holds by value (masses, sizes, poses).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from capsule_rollout.capsules import Arena
from capsule_rollout.envs.mujoco_capsule import MujocoCapsuleEnv
from capsule_rollout.envs.mujoco_capture import buffer_bytes


class MujocoCapsuleSteppable:
    def __init__(self, env_id: str, *, cameras: tuple[str, ...] | None = None, image_size: int = 64,
                 seed: int = 0) -> None:
        from capsule_rollout.envs.suites import make_env

        self.env: MujocoCapsuleEnv = make_env(env_id, cameras=cameras, image_size=image_size)
        self.env.reset(seed=seed)
        self.name = f"env/{env_id}[{'+'.join(self.env.cameras) or 'state'}]"
        self.arena = Arena([self.env]).allocate()
        low, high = self.env.action_space.low, self.env.action_space.high
        self._low, self._span = torch.from_numpy(low.astype(np.float64)), torch.from_numpy((high - low).astype(np.float64))

    def sample_inputs(self, generator: torch.Generator) -> dict[str, torch.Tensor]:
        u = torch.rand(self._low.shape, generator=generator, dtype=torch.float64)
        return {"action": self._low + u * self._span}

    def step(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        obs, reward, terminated, _, _ = self.env.step(inputs["action"].numpy())
        out = {k: torch.from_numpy(np.asarray(v)) for k, v in obs.items()}
        out["reward"] = torch.tensor(reward, dtype=torch.float64)
        out["terminated"] = torch.tensor(terminated)
        d = self.env.data
        out["mjdata"] = torch.from_numpy(buffer_bytes(self.env._buffer_ptr, self.env._buffer_bytes))
        out["mjdata_time"] = torch.tensor(d.time, dtype=torch.float64)
        return out

    def scramble(self, generator: torch.Generator) -> None:
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
        rng = np.random.default_rng(seed)
        env = self.env
        if env._graph is not None:  # graph capture: the env played elsewhere (its Python state moves on, a suite
            # may rebuild its model) and the model's captured arrays perturbed
            env.reset(seed=int(rng.integers(1 << 30)))
            for _ in range(3):
                env.step(rng.uniform(self._low.numpy(), (self._low + self._span).numpy()).astype(env.action_space.dtype))
            for name in ("body_mass", "geom_size", "body_pos", "geom_rgba"):
                arr = getattr(env.model, name)
                arr[...] = arr + rng.normal(0, 0.01, arr.shape)
        d = env.data
        d.qpos[:] += rng.normal(0, 0.01, d.qpos.shape)
        d.qvel[:] = rng.normal(0, 0.1, d.qvel.shape)
        d.qacc_warmstart[:] = rng.normal(0, 1.0, d.qacc_warmstart.shape)
        d.xpos[:] = rng.normal(0, 1.0, d.xpos.shape)  # derived data an env may read before mj_step
        d.time = float(rng.uniform(0, 100))
        for _, arr in env._model_fields:
            arr[...] = arr + rng.normal(0, 0.01, arr.shape).astype(arr.dtype)
        for _, owner, name in env._generators:
            if getattr(owner, name, None) is not None:
                setattr(owner, name, np.random.default_rng(int(rng.integers(1 << 31))))
        for owner, name, _attr, _view, _ in env._attr_views:
            value = getattr(owner, name)
            if isinstance(value, np.ndarray) and value.dtype.kind == "f":
                setattr(owner, name, value + rng.normal(0, 0.1, value.shape))
            elif isinstance(value, bool):
                setattr(owner, name, not value)
            elif isinstance(value, int):
                setattr(owner, name, value + 7)
            elif isinstance(value, (list, set)):
                setattr(owner, name, type(value)())
        for c in env.cameras:
            env._images[c][...] = 0
        env._np["obs_state"][:] = np.nan
