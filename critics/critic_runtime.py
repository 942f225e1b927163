"""`CriticRuntime`: the value critic as a rollout-host component with static buffers.

Buffers: `state` = the subtask language embedding; `io` = observation slots and
the outputs (value `(B,)` and logits `(B, bins)`). `evaluate()` runs one
buffer-to-buffer function through a `GraphRunner`, so it can run on lane C of a
`TwoLaneContext` while the policy runs on lane P.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

import numpy as np
import torch

from capsules import BufferComponent, BufferSpec, Role
from capsules.fingerprint import module_sha256
from critics.value_critic import ValueCritic
from policies.common.graph_runner import GraphRunner
from policies.common.inputs import load_observation


class CriticRuntime(BufferComponent):
    def __init__(self, model: ValueCritic, *, name: str = "critic", device: str = "cpu", batch: int = 1,
                 capture: bool | None = None) -> None:
        super().__init__()
        self.name = name
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()  # evaluates under no_grad (GraphRunner)
        self.config = model.config
        self.batch, self._capture = batch, capture
        self._fingerprint = {
            "kind": "value_critic",
            "weights_sha256": module_sha256(self.model),
            "config_sha256": hashlib.sha256(json.dumps(self.config.to_json(), sort_keys=True).encode()).hexdigest()[:16],
            "batch": str(batch),
        }
        self.runner: GraphRunner | None = None

    def buffer_specs(self) -> list[BufferSpec]:
        c, b, dev = self.config, self.batch, str(self.device)
        specs = [
            BufferSpec("lang", (b, c.lang_dim), torch.float32, dev, doc="subtask embedding"),
            BufferSpec("state", (b, c.state_dim), torch.float32, dev, Role.IO),
            BufferSpec("value", (b,), torch.float32, dev, Role.IO),
            BufferSpec("logits", (b, c.bins), torch.float32, dev, Role.IO),
        ]
        specs += [BufferSpec(f"image_{cam}", (b, c.image_size, c.image_size, 3), torch.uint8, dev, Role.IO)
                  for cam in c.cameras]
        return specs

    def bind(self, buffers: Mapping[str, torch.Tensor]) -> None:
        super().bind(buffers)
        self.runner = GraphRunner(self._evaluate, self.device, capture=self._capture)

    def fingerprint(self) -> Mapping[str, str]:
        return self._fingerprint

    def set_subtask(self, text: str) -> None:
        tokens = torch.from_numpy(self.model.tokenizer.encode(text))[None].to(self.device)
        with torch.no_grad():
            self.buffers["lang"].copy_(self.model.embed_language(tokens).expand(self.batch, -1))

    def load_observation(self, images: Mapping[str, np.ndarray | torch.Tensor], state) -> None:
        """Validate an observation and copy it into the io slots (batch dim optional when batch=1)."""
        load_observation(self.buffers, images, state, cameras=self.config.cameras, who="critic")

    def evaluate(self, images: Mapping[str, np.ndarray | torch.Tensor] | None = None, state=None) -> torch.Tensor:
        """Values `(B,)` (a view of the output buffer)."""
        if images is not None:
            self.load_observation(images, state)
        self.runner()
        return self.buffers["value"]

    def _evaluate(self) -> None:
        b = self.buffers
        logits = self.model.logits({cam: b[f"image_{cam}"] for cam in self.config.cameras}, b["state"], b["lang"])
        b["logits"].copy_(logits)
        b["value"].copy_(self.model.value(logits))
