"""`RolloutSteppable`: the whole rollout boundary (env + policy + critic + hand-off) for `verify_capsule`."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from capsule_rollout.rollout.rollout_host import HostConfig, RolloutHost
from capsule_rollout.tabletop.critic_runtime import CriticRuntime
from capsule_rollout.tabletop.flow_policy import FlowPolicy
from capsule_rollout.tabletop.policy_runtime import PolicyRuntime
from capsule_rollout.tabletop.tabletop_env import TabletopEnv, image_key
from capsule_rollout.tabletop.value_critic import ValueCritic

COACHING = ("pick up the blue block", "slow down and lift it higher", "put it on the red pad")


class RolloutSteppable:
    """One control tick of a `RolloutHost` per step; now and then an operator coaches a new subtask.

    Outputs: the executed and proposed actions, the chunk's value, the observation's
    images and state, the hand-off's subtask version and text length.
    """

    def __init__(self, policy: FlowPolicy, critic: ValueCritic, *, family: str = "pick_place", seed: int = 0,
                 n_exec: int = 4, device: str = "cpu") -> None:
        """`device`: where policy and critic run (their buffers live there; the env's stay on the CPU)."""
        cameras = tuple(dict.fromkeys((*policy.config.cameras, *critic.config.cameras)))
        env = TabletopEnv(family, cameras=cameras, image_size=policy.config.image_size)
        self.host = RolloutHost(env=env, policy=PolicyRuntime(policy, device=device),
                                critic=CriticRuntime(critic, device=device), config=HostConfig(n_exec=n_exec))
        kind = torch.device(device).type
        self.name = f"rollout/{family}[env+policy+critic+handoff]" + ("" if kind == "cpu" else f"[{kind}]")
        self.arena = self.host.arena
        self.host.reset(seed)
        self.host._go(self.host.phase.RUNNING)

    def sample_inputs(self, generator: torch.Generator) -> dict[str, torch.Tensor]:
        return {"coach": torch.randint(0, 4 * len(COACHING), (1,), generator=generator)}

    def step(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        k = int(inputs["coach"])
        if k < len(COACHING):
            self.host.channel.coach(COACHING[k])
        # the observation is always taken from the env (nothing cached outside the arena)
        tick = self.host.tick(self.host.env.observe())
        obs = self.host.env.observe() if tick.obs is None else tick.obs
        sub = self.host.channel.read()
        out = {c: torch.from_numpy(obs[c]) for c in (image_key(c) for c in self.host.env.cameras)}
        nan = np.full(4, np.nan, np.float32)
        out["state"] = torch.from_numpy(obs["state"])
        out["action"] = torch.from_numpy(nan if tick.action is None else tick.action.astype(np.float32))
        out["proposed"] = torch.from_numpy(nan if tick.proposed is None else tick.proposed)
        out["value"] = torch.tensor(tick.value)
        out["subtask"] = torch.tensor([sub.index, len(sub.text), int(tick.new_chunk)])
        return out

    def scramble(self, generator: torch.Generator) -> None:
        """Dirty what lives outside the arena: the hand-off block and the host's view of it."""
        k = int(torch.randint(0, len(COACHING), (1,), generator=generator))
        self.host.channel.coach(COACHING[k] + " now")
        self.host._subtask_index = 99
        self.host._seen_version = -5
