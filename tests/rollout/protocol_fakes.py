"""A 7-DoF reaching env and a greedy noisy policy written against the rollout protocols only.

Nothing here is the project's tabletop or flow policy: they show what a user brings.
`ReachEnv`: joint positions `q` (7,) move by `0.1 * action` per step; the action space is
asymmetric ([-0.5, 1.0] per joint) so clipping to its bounds is visible; success when every
joint is within 0.05 of the target drawn at reset. `GreedyPolicy`: a chunk of
`gain * (target - q)` plus counter-based noise (its state in a capsule buffer).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from capsule_rollout.capsules import BufferComponent, BufferSpec, Role
from capsule_rollout.envs.rollout_env import ObservationSpec
from capsule_rollout.models.counter_rng import normal_
from capsule_rollout.policies.rollout_policy import PolicySpec

DOF = 7


class ReachEnv(BufferComponent):
    restorable = True

    def __init__(self, *, max_steps: int = 30, instruction: str = "reach the target", subtasks=()) -> None:
        super().__init__()
        self.name = "env"
        self.max_steps = max_steps
        self.action_space = gym.spaces.Box(-0.5, 1.0, (DOF,), np.float32)
        self.observation_spec = ObservationSpec.of(state_dim=2 * DOF)
        self._instruction, self._subtasks = instruction, tuple(subtasks)
        self.rng = np.random.default_rng(0)
        self.q, self.target = np.zeros(DOF), np.zeros(DOF)
        self._steps = 0

    # -- protocol ------------------------------------------------------------------------
    task = "reach7"

    @property
    def steps(self) -> int:
        return self._steps

    @property
    def instruction(self) -> str:
        return self._instruction

    @property
    def subtask_texts(self) -> tuple[str, ...]:
        return self._subtasks

    @property
    def subtask_index(self) -> int:
        return 0 if not self._subtasks else min(int(np.abs(self.q - self.target).max() < 0.3), len(self._subtasks) - 1)

    def reset(self, *, seed: int | None = None):
        self.rng = np.random.default_rng(seed)
        self.q = self.rng.uniform(-0.2, 0.2, DOF)
        self.target = self.rng.uniform(0.2, 0.6, DOF)
        self._steps = 0
        return self.observe(), {"success": False}

    def step(self, action):
        a = np.asarray(action, np.float64)
        if a.shape != (DOF,) or np.any(a < -0.5) or np.any(a > 1.0):
            raise ValueError(f"action outside the space: {a}")
        self.q = self.q + 0.1 * a
        self._steps += 1
        success = bool(np.abs(self.q - self.target).max() < 0.05)
        return self.observe(), (0.0 if success else -1.0), success, False, {"success": success}

    def observe(self) -> dict:
        return {"state": np.concatenate([self.q, self.target]).astype(np.float32)}

    def success(self, info) -> bool:
        return bool(info["success"])

    def close(self) -> None:
        pass

    # -- capsule component -------------------------------------------------------------------
    def buffer_specs(self):
        return [BufferSpec("q", (DOF,), torch.float64), BufferSpec("target", (DOF,), torch.float64),
                BufferSpec("steps", (), torch.int64)]

    def before_snapshot(self) -> None:
        self.buffers["q"].numpy()[:] = self.q
        self.buffers["target"].numpy()[:] = self.target
        self.buffers["steps"].fill_(self._steps)

    def after_restore(self) -> None:
        self.q = self.buffers["q"].numpy().copy()
        self.target = self.buffers["target"].numpy().copy()
        self._steps = int(self.buffers["steps"])


class GreedyPolicy(BufferComponent):
    """A protocol policy without language or conditioning (the host calls neither)."""

    def __init__(self, *, chunk_length: int = 5, gain: float = 3.0, noise: float = 0.2) -> None:
        super().__init__()
        self.name = "policy"
        self.device = torch.device("cpu")
        self.spec = PolicySpec(chunk_length=chunk_length, action_dim=DOF, observation_keys=("state",))
        self.gain, self.noise = gain, noise
        self._index = torch.arange(chunk_length * DOF)

    def buffer_specs(self):
        t = self.spec.chunk_length
        return [BufferSpec("rng", (2,), torch.int64), BufferSpec("obs", (2 * DOF,), torch.float32, role=Role.IO),
                BufferSpec("chunk", (t, DOF), torch.float32, role=Role.IO),
                BufferSpec("eps", (t, DOF), torch.float32, role=Role.SCRATCH)]

    def reset(self, episode_seed: int) -> None:
        self.buffers["rng"].copy_(torch.tensor([episode_seed, 0]))

    def load_observation(self, obs) -> None:
        self.buffers["obs"].copy_(torch.as_tensor(obs["state"]))

    def act(self) -> torch.Tensor:
        b = self.buffers
        q, target = b["obs"][:DOF], b["obs"][DOF:]
        normal_(b["rng"], b["eps"], self._index)
        b["chunk"].copy_((self.gain * (target - q))[None, :] + self.noise * b["eps"])
        return b["chunk"]
