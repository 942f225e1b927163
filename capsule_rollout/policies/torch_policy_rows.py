"""`TorchPolicy` for a host of N slots: one call of the user's module over N rows (a module that `batches`).

Buffers of N rows (its own arena, never snapshotted): a noise generator per row (`normal_rows_`: row r draws what
`normal_` draws for its (seed, counter); only rows that act advance), the inputs `(N, ...)`, the noise `(N, T, A)`
and the chunks. Each slot is a `models.rows.RowSlot` with the one-row policy's state buffers and fingerprint (its
capsules are one-slot capsules). What a row gets depends on the module: rows are independent of each other only
if the module treats them so (the `batches` promise); bit for bit, a batch of N may round differently from a batch
of 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from capsule_rollout.capsules import Arena, BufferComponent, BufferSpec, Role
from capsule_rollout.models.counter_rng import normal_rows_
from capsule_rollout.models.rows import RowSlot, set_active
from capsule_rollout.policies.torch_policy import TorchPolicy, check_inputs


class _Rows(BufferComponent):
    def __init__(self, template: TorchPolicy, n: int) -> None:
        super().__init__()
        self.name, self.n, self.template = template.name, n, template

    def buffer_specs(self) -> list[BufferSpec]:
        t, dev, spec = self.template, str(self.template.device), self.template.spec
        specs = [BufferSpec("rng", (self.n, 2), torch.int64, dev),
                 BufferSpec("active", (self.n,), torch.int64, dev, Role.IO),
                 BufferSpec("chunk", (self.n, spec.chunk_length, spec.action_dim), torch.float32, dev, Role.IO),
                 BufferSpec("noise", (self.n, spec.chunk_length, spec.action_dim), torch.float32, dev, Role.SCRATCH)]
        specs += [BufferSpec(f"in_{k}", (self.n, *shape), dtype, dev, Role.IO) for k, (shape, dtype) in t.shapes.items()]
        return specs

    def bind(self, buffers) -> None:
        super().bind(buffers)
        self.buffers["rng"].copy_(torch.tensor([self.template.seed, 0]).expand(self.n, 2))


class TorchPolicyRows:
    """N slots of one `TorchPolicy` (`TorchPolicy.batched`)."""

    def __init__(self, template: TorchPolicy, n: int) -> None:
        if n < 1:
            raise ValueError(f"a batched policy has at least one row, got {n}")
        self.template, self.rows, self.spec, self.device = template, n, template.spec, template.device
        self._rows = _Rows(template, n)
        self.arena = Arena([self._rows]).allocate()
        self.buffers = self._rows.buffers
        self._index = torch.arange(template.spec.chunk_length * template.spec.action_dim, device=template.device)
        one_row = [s for s in template.buffer_specs() if s.role == Role.STATE]
        self.slots = [TorchPolicySlot(self, i, one_row) for i in range(n)]

    def slot(self, i: int) -> TorchPolicySlot:
        return self.slots[i]

    def act_rows(self, active: Sequence[int]) -> torch.Tensor:
        b = self.buffers
        set_active(b["active"], active)
        normal_rows_(b["rng"], b["noise"].view(self.rows, -1), self._index, b["active"])
        inputs = {k: b[f"in_{k}"] for k in self.template.shapes}
        with torch.no_grad():
            out = self.template.module(inputs, b["noise"])
        b["chunk"].copy_(out.reshape(b["chunk"].shape))
        return b["chunk"]


class TorchPolicySlot(RowSlot):
    """Slot i of a `TorchPolicyRows`: the rollout protocol's policy, acting through the shared rows."""

    def __init__(self, owner: TorchPolicyRows, index: int, specs) -> None:
        super().__init__(owner.template.name, owner.buffers, index, specs, owner.template.fingerprint())
        self.owner, self.spec, self.device = owner, owner.spec, owner.device
        self._inputs = {k: self.row(f"in_{k}") for k in owner.template.shapes}

    def reset(self, episode_seed: int) -> None:
        self.row("rng").copy_(torch.tensor([[int(episode_seed), 0]]))

    def load_observation(self, obs) -> None:
        for key, value in check_inputs(self._inputs, obs).items():
            self._inputs[key].copy_(value)

    def act(self) -> torch.Tensor:
        return self.owner.act_rows([self.index])[self.index]
