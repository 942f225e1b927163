"""`PolicySteppable`: the policy runtime driven by random observations, for `verify_capsule`."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from capsule_rollout.capsules import Arena
from capsule_rollout.tabletop.flow_policy import FlowPolicy
from capsule_rollout.tabletop.policy_runtime import PolicyRuntime


class PolicySteppable:
    """Each step: a new observation -> one action chunk; every few steps a new subtask text."""

    SUBTASKS = ("pick up the red block", "place it on the yellow pad", "put it left of the blue block")

    def __init__(self, model: FlowPolicy | None = None, *, device: str = "cpu", guidance: bool = True) -> None:
        self.model = model or FlowPolicy()
        self.runtime = PolicyRuntime(self.model, device=device, seed=11, guidance=guidance)
        self.name = f"policy/flow[{torch.device(device).type}]"
        self.arena = Arena([self.runtime]).allocate()
        self.runtime.set_language(self.SUBTASKS[0])
        self.runtime.set_conditioning(1, beta=1.5 if guidance else None)
        self._t = 0

    def sample_inputs(self, generator: torch.Generator) -> dict[str, torch.Tensor]:
        c = self.model.config
        out = {f"image_{cam}": torch.randint(0, 256, (c.image_size, c.image_size, 3), dtype=torch.uint8,
                                             generator=generator) for cam in c.cameras}
        out["state"] = torch.randn(c.state_dim, generator=generator)
        out["subtask"] = torch.randint(0, len(self.SUBTASKS), (1,), generator=generator)
        return out

    def step(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if int(inputs["subtask"]) == 0:  # sometimes the planner changes the subtask
            self.runtime.set_language(self.SUBTASKS[int(inputs["state"][0] > 0) + 1])
        chunk = self.runtime.act(inputs)
        return {"chunk": chunk}

    def scramble(self, generator: torch.Generator) -> None:
        """Nothing to do: the noise generator and the subtask embedding live in arena buffers."""
