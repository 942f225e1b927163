"""`ModelRuntime`: what the policy and the critic runtimes share as capsule components.

A runtime holds a model in eval mode on its device, its static buffers (declared by
the subclass), a fingerprint (kind, weights and config hashes, batch) that binds its
capsules to these weights, the language slot every model reads (`set_language`),
and the `GraphRunner` that runs its buffer-to-buffer function: one CUDA graph on a
GPU, the network traced to TorchScript (or eager) on the CPU.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar

import torch

from capsule_rollout.capsules import BufferComponent
from capsule_rollout.capsules.fingerprint import module_sha256
from capsule_rollout.models.graph_runner import GraphRunner, trace_on_cpu
from capsule_rollout.models.inputs import observation_keys, write_language


class ModelRuntime(BufferComponent):
    KIND: ClassVar[str] = "model"

    def __init__(self, model: torch.nn.Module, *, name: str, device: str, batch: int, capture: bool | None,
                 trace: bool | None, **fingerprint: str) -> None:
        """`trace`: run the network as TorchScript on the CPU (None: yes; see `trace_on_cpu`).
        `fingerprint`: extra entries that decide what capsules fit (e.g. whether guidance runs)."""
        super().__init__()
        self.name = name
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()  # runs under no_grad (GraphRunner)
        self.config = model.config
        self.batch, self._capture, self._trace = batch, capture, trace
        self._fingerprint = {
            "kind": self.KIND,
            "weights_sha256": module_sha256(self.model),
            "config_sha256": hashlib.sha256(json.dumps(self.config.to_json(), sort_keys=True).encode()).hexdigest()[:16],
            "batch": str(batch),
            **fingerprint,
        }
        self.runner: GraphRunner | None = None

    @property
    def observation_keys(self) -> tuple[str, ...]:
        return observation_keys(self.config.cameras)

    def fingerprint(self) -> Mapping[str, str]:
        return self._fingerprint

    def set_language(self, text: str) -> None:
        """Encode the subtask's language once into the language buffer (read by every later call)."""
        write_language(self.buffers["lang"], self.model, text)

    def _compile(self, core: torch.nn.Module, example: tuple, fn: Callable[[], None],
                 preserve: Sequence[torch.Tensor] = ()) -> torch.nn.Module:
        """Trace `core` on the CPU (restoring `preserve` after the trace ran it once) and make the runner
        of `fn`; returns the module `fn` must call."""
        saved = [t.clone() for t in preserve]
        traced = trace_on_cpu(core, example, self.device, self._trace)
        for tensor, value in zip(preserve, saved):
            tensor.copy_(value)
        self.runner = GraphRunner(fn, self.device, capture=self._capture, preserve=list(preserve))
        return traced
