"""Slots of a batched model runtime: row i of N, as a capsule component of its own.

A batched runtime (`rows=N`) keeps N rows of everything an episode changes (the noise generator's
(seed, counter), the language embedding, the RECAP conditioning) and runs the network once over all N
(one CUDA graph of N rows on a GPU). Each slot of a batched host owns one row through a `RowSlot`: a
component whose state buffers are exactly those of the one-row runtime (same names, shapes and
fingerprint), so a slot's capsule is a one-row host's capsule, restores into any slot and into a host of
one slot. The row is the live state (like MjData for an env); the hooks mirror it: `before_snapshot`
copies row i into the slot's buffers, `after_restore` copies them back into row i. A restore into slot i
writes slot i's buffers and row i, nothing of another slot.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from capsule_rollout.capsules import Arena, BufferComponent, BufferSpec, Role
from capsule_rollout.models.inputs import load_observation, stack_rows


def set_active(buffer: torch.Tensor, active: Sequence[int]) -> None:
    """Write the row mask `(N,)` int64 of a call: 1 for the rows in `active` (they act and move on), 0 else."""
    mask = np.zeros(buffer.shape[0], np.int64)
    mask[list(active)] = 1
    buffer.copy_(torch.from_numpy(mask))


class RowSlot(BufferComponent):
    """Row `index` of a batched runtime's buffers `rows` (bound); `specs`: the one-row runtime's state
    buffers (each the shape of one row, or of one row with a leading 1)."""

    def __init__(self, name: str, rows: Mapping[str, torch.Tensor], index: int, specs: Sequence[BufferSpec],
                 fingerprint: Mapping[str, str]) -> None:
        super().__init__()
        self.name, self.index = name, index
        self.rows = rows
        self._specs = list(specs)
        self._fingerprint = dict(fingerprint)
        for spec in self._specs:
            row = rows[spec.name][index]
            if row.numel() != torch.Size(spec.shape).numel():
                raise ValueError(f"{name}: row buffer {spec.name} {tuple(row.shape)} does not hold the one-row "
                                 f"buffer {spec.shape}")

    def buffer_specs(self) -> list[BufferSpec]:
        return list(self._specs)

    def fingerprint(self) -> Mapping[str, str]:
        return self._fingerprint

    def row(self, name: str) -> torch.Tensor:
        """This slot's row of the batched buffer `name`, with a leading dimension of 1."""
        return self.rows[name][self.index: self.index + 1]

    def before_snapshot(self) -> None:
        for spec in self._specs:
            self.buffers[spec.name].copy_(self.rows[spec.name][self.index].reshape(spec.shape))

    def after_restore(self) -> None:
        for spec in self._specs:
            row = self.rows[spec.name][self.index]
            row.copy_(self.buffers[spec.name].reshape(row.shape))

    def load_row(self, obs, *, cameras: tuple[str, ...], who: str) -> None:
        """Validate one observation and copy it into this slot's row of the io buffers (nothing on failure)."""
        keys = [f"image_{cam}" for cam in cameras] + ["state"]
        load_observation({k: self.row(k) for k in keys}, obs, cameras=cameras, who=who)


class ObjectRows:
    """N slots of one user object that batches (`policies.infer_policy_rows`, `critics.infer_critic_rows`): its
    own arena of N rows (`rows_component`), each slot a `slot_cls` (a `RowSlot` of the one-row component's state
    buffers), and every slot's last observation kept for the next call over all N rows. `batch_method` (say,
    `infer_batch`) is called when the object has it, else `method` (an object that says `batches = True`)."""

    def __init__(self, template, n: int, rows_component: BufferComponent, slot_cls: type, *, batch_method: str,
                 method: str, what: str) -> None:
        if n < 1:
            raise ValueError(f"a batched {what} has at least one row, got {n}")
        obj = template.obj
        has_batch = callable(getattr(obj, batch_method, None))
        if not (has_batch or getattr(obj, "batches", False) is True):
            raise ValueError(f"{type(obj).__name__} does not batch (no {batch_method}, no `batches = True`): give "
                             "each slot an instance of its own")
        self.template, self.rows, self.spec, self.device, self.obj = template, n, template.spec, template.device, obj
        self._rows = rows_component
        self.arena = Arena([rows_component]).allocate()
        self.buffers = rows_component.buffers
        self._obs: list[dict | None] = [None] * n
        one_row = [s for s in template.buffer_specs() if s.role == Role.STATE]
        self.slots = [slot_cls(self, i, one_row) for i in range(n)]
        self._method = batch_method if has_batch else method
        self._call = getattr(obj, self._method)

    def slot(self, i: int):
        return self.slots[i]

    def batch(self, prompt_key: str, prompts: Sequence[str | None]) -> dict:
        """Every row's observation `(N, ...)` (a row that never loaded one: zeros of the shape the others have),
        and the rows' prompts (a list) under `prompt_key`."""
        loaded = next(o for o in self._obs if o is not None)
        obs = {k: stack_rows([o[k] if o is not None else None for o in self._obs], v) for k, v in loaded.items()}
        obs[prompt_key] = list(prompts)
        return obs
