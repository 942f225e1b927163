"""`CriticSteppable`: the critic runtime driven by random observations, for `verify_capsule`."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from capsule_rollout.capsules import Arena
from capsule_rollout.tabletop.critic_runtime import CriticRuntime
from capsule_rollout.tabletop.value_critic import ValueCritic


class CriticSteppable:
    SUBTASKS = ("pick up the red block", "place it on the yellow pad")

    def __init__(self, model: ValueCritic | None = None, *, device: str = "cpu") -> None:
        self.model = model or ValueCritic()
        self.runtime = CriticRuntime(self.model, device=device)
        self.name = f"critic/value[{torch.device(device).type}]"
        self.arena = Arena([self.runtime]).allocate()
        self.runtime.set_language(self.SUBTASKS[0])

    def sample_inputs(self, generator: torch.Generator) -> dict[str, torch.Tensor]:
        c = self.model.config
        out = {f"image_{cam}": torch.randint(0, 256, (c.image_size, c.image_size, 3), dtype=torch.uint8,
                                             generator=generator) for cam in c.cameras}
        out["state"] = torch.randn(c.state_dim, generator=generator)
        out["step"] = torch.randint(0, max(c.episode_limit, 1), (), generator=generator)
        out["switch"] = torch.rand((), generator=generator)
        return out

    def step(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if float(inputs["switch"]) < 0.3:
            self.runtime.set_language(self.SUBTASKS[int(float(inputs["switch"]) < 0.15)])
        value = self.runtime.evaluate(inputs, inputs["step"])
        return {"value": value, "logits": self.runtime.buffers["logits"]}

    def scramble(self, generator: torch.Generator) -> None:
        """Nothing to do: the subtask embedding lives in an arena buffer."""
