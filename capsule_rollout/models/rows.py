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

from capsule_rollout.capsules import BufferComponent, BufferSpec
from capsule_rollout.models.inputs import load_observation


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
