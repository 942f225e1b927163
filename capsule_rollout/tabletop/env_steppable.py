"""`TabletopSteppable`: the tabletop env driven by random actions, for `verify_capsule`."""

from __future__ import annotations

from collections.abc import Mapping

import mujoco
import numpy as np
import torch

from capsule_rollout.capsules import Arena
from capsule_rollout.tabletop.tabletop_env import ACTION_DIM, TabletopEnv, image_key


class TabletopSteppable:
    """Env in its own arena; outputs are every camera image, proprio state, reward and subtask."""

    def __init__(self, family: str = "pick_place", cameras: tuple[str, ...] = ("front", "top"), seed: int = 0) -> None:
        self.env = TabletopEnv(family, cameras=cameras)
        self.env.reset(seed=seed)
        self.name = f"env/{family}[{'+'.join(cameras) or 'state'}]"
        self.arena = Arena([self.env]).allocate()

    def sample_inputs(self, generator: torch.Generator) -> dict[str, torch.Tensor]:
        action = torch.rand(ACTION_DIM, generator=generator, dtype=torch.float64) * 2 - 1
        return {"action": action}

    def step(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        obs, reward, terminated, truncated, info = self.env.step(inputs["action"].numpy())
        out = {k: torch.from_numpy(obs[image_key(c)]) for c in self.env.cameras for k in [image_key(c)]}
        out["state"] = torch.from_numpy(obs["state"])
        out["reward"] = torch.tensor(reward)
        out["subtask_id"] = torch.tensor(info["subtask_id"])
        return out

    def scramble(self, generator: torch.Generator) -> None:
        """Perturb the live simulator and the env RNG (state that lives outside the arena)."""
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
        rng = np.random.default_rng(seed)
        d = self.env.data
        d.qpos[:] += rng.normal(0, 0.01, d.qpos.shape)
        d.qvel[:] = rng.normal(0, 0.1, d.qvel.shape)
        d.qacc_warmstart[:] = rng.normal(0, 1.0, d.qacc_warmstart.shape)
        mujoco.mj_forward(self.env.model, d)
        self.env.np_random = np.random.default_rng(seed)
        self.env.steps, self.env.subtask_index = 999, 1
