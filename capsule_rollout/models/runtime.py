"""`ModelRuntime`: what the policy and the critic runtimes share as capsule components.

A runtime holds a model in eval mode on its device, its static buffers (declared by
the subclass), a fingerprint (kind, weights and config hashes, batch) that binds its
capsules to these weights, the language slot every model reads (`set_language`),
and the `GraphRunner` that runs its buffer-to-buffer function: one CUDA graph on a
GPU, the network traced to TorchScript (or eager) on the CPU.

Row blocks: the network runs over blocks of exactly `row_block` rows (`in_row_blocks`), whatever the batch (a
batch of 1 is one block, its other rows zeros; 16 rows are two blocks). A matrix product's kernel is chosen by
its shape, and kernels for other shapes round differently (on this project's CPU, 1, 2-3 and 5-7 rows each
round differently from 4, 8 or 16), while within one shape a row's result does not depend on its position or
on the other rows (tested). With every call the same shape, a row's result is the same in a host of any number
of slots, so an episode is a function of its work item alone.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import ClassVar

import torch

from capsule_rollout.capsules import BufferComponent
from capsule_rollout.capsules.fingerprint import module_sha256
from capsule_rollout.models.graph_runner import GraphRunner, trace_on_cpu
from capsule_rollout.models.inputs import observation_keys, write_language

ROW_BLOCK = 8  # rows per network call: an 8-slot host's calls are one block, as before blocks
_default_row_block = [ROW_BLOCK]


@contextmanager
def row_blocks(block: int) -> Iterator[None]:
    """Runtimes made inside take `block` rows per network call unless told (0: the batch as is; for benchmarks and
    checks that compare with it)."""
    _default_row_block.append(block)
    try:
        yield
    finally:
        _default_row_block.pop()


def in_row_blocks(fn: Callable[..., torch.Tensor | tuple[torch.Tensor, ...]], rows: Sequence[torch.Tensor],
                  block: int) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """`fn(*rows)` computed over blocks of exactly `block` rows (the last block padded with zero rows) and put
    back together: `rows` all have the same first dimension N, so does every output. `block` 0: one call as is."""
    n = rows[0].shape[0]
    if block <= 0 or n == block:
        return fn(*rows)
    outs = []
    for start in range(0, n, block):
        part = [r[start: start + block] for r in rows]
        short = block - part[0].shape[0]
        if short:
            part = [torch.cat([p, p.new_zeros((short, *p.shape[1:]))]) for p in part]
        outs.append(fn(*part))
    if isinstance(outs[0], tuple):
        return tuple(torch.cat([o[i] for o in outs])[:n] for i in range(len(outs[0])))
    return torch.cat(outs)[:n]


class ModelRuntime(BufferComponent):
    KIND: ClassVar[str] = "model"

    def __init__(self, model: torch.nn.Module, *, name: str, device: str, batch: int, capture: bool | None,
                 trace: bool | None, row_block: int | None = None, **fingerprint: str) -> None:
        """`trace`: run the network as TorchScript on the CPU (None: yes; see `trace_on_cpu`).
        `row_block`: rows per network call (`in_row_blocks`; 0: the batch as it is, which rounds by its size;
        None: `ROW_BLOCK`, or what `row_blocks` sets).
        `fingerprint`: extra entries that decide what capsules fit (e.g. whether guidance runs)."""
        super().__init__()
        self.name = name
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()  # runs under no_grad (GraphRunner)
        self.config = model.config
        row_block = _default_row_block[-1] if row_block is None else row_block
        if row_block < 0:
            raise ValueError(f"row_block is rows per network call (0: the batch as is), got {row_block}")
        self.batch, self._capture, self._trace, self.row_block = batch, capture, trace, row_block
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
