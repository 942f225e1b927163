"""Slab layout: where each buffer lives inside one contiguous allocation.

The arena groups buffers by (role, device) and places each group in one byte slab,
every buffer at a 64-byte aligned offset, in key order. The layout is a pure
function of the specs, so an arena and a capsule (even one read from disk) that
agree on specs agree on offsets, and a restore is one `copy_` per device.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property

import torch

from capsule_rollout.capsules.buffer_spec import DTYPE_NAMES, BufferSpec, Role

SLAB_ALIGN = 64  # bytes; a cache line, and a multiple of every supported itemsize
_ROLE_ORDER = {Role.STATE: 0, Role.IO: 1, Role.SCRATCH: 2}


def _round_up(n: int, align: int = SLAB_ALIGN) -> int:
    return (n + align - 1) // align * align


@dataclass(frozen=True)
class Slot:
    """One buffer's place in its slab."""

    key: str  # "<component>/<buffer>"
    spec: BufferSpec
    offset: int  # bytes from the slab start

    @property
    def nbytes(self) -> int:
        return self.spec.nbytes

    def view(self, slab: torch.Tensor) -> torch.Tensor:
        """The typed, shaped view of this slot inside `slab` (a 1-D uint8 tensor)."""
        raw = slab[self.offset : self.offset + self.spec.nbytes]
        return raw.view(self.spec.dtype).view(self.spec.shape)


@dataclass(frozen=True)
class SlabLayout:
    """The slots of one (role, device) group and the padded slab size."""

    role: Role
    device: str
    slots: tuple[Slot, ...]
    nbytes: int

    @cached_property
    def signature(self) -> tuple:
        """Everything that must agree for a byte-for-byte slab copy to be valid."""
        slots = tuple((s.key, s.offset, DTYPE_NAMES[s.spec.dtype], s.spec.shape, s.spec.alignment) for s in self.slots)
        return (self.role.value, torch.device(self.device).type, slots)

    @cached_property
    def payload_bytes(self) -> int:
        return sum(s.nbytes for s in self.slots)

    def views(self, slab: torch.Tensor) -> dict[str, torch.Tensor]:
        return {s.key: s.view(slab) for s in self.slots}


def plan_slabs(specs: Mapping[str, BufferSpec], roles: Iterable[Role] | None = None) -> tuple[SlabLayout, ...]:
    """Group `specs` (keyed "<component>/<buffer>") into slabs; deterministic."""
    wanted = set(Role) if roles is None else set(roles)
    groups: dict[tuple[Role, str], list[tuple[str, BufferSpec]]] = {}
    for key, spec in specs.items():
        if spec.role in wanted:
            groups.setdefault((spec.role, spec.device), []).append((key, spec))
    layouts = []
    for role, device in sorted(groups, key=lambda g: (_ROLE_ORDER[g[0]], g[1])):
        offset = 0
        slots = []
        for key, spec in sorted(groups[(role, device)]):
            slots.append(Slot(key, spec, offset))
            offset = _round_up(offset + spec.nbytes)
        layouts.append(SlabLayout(role, device, tuple(slots), offset))
    return tuple(layouts)
