"""`Capsule`: an immutable snapshot of an arena's state buffers, and its verbs.

`snapshot(arena)` copies every state slab (one copy per device); `restore(arena,
capsule)` copies them back in place (addresses unchanged, no re-allocation);
`fork(capsule, arenas)` restores one capsule into several independent arenas.
A capsule is never written after it is made: restores and forks only read it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

from capsule_rollout.capsules.arena import Arena
from capsule_rollout.capsules.buffer_spec import BufferSpec, Role
from capsule_rollout.capsules.component import BufferViews
from capsule_rollout.capsules.digest import digest_slab
from capsule_rollout.capsules.errors import (
    MISSING,
    CapsuleAlignmentError,
    CapsuleIntegrityError,
    CapsuleMismatchError,
    Mismatch,
)
from capsule_rollout.capsules.layout import SlabLayout
from capsule_rollout.capsules.slab_copy import SlabPlace, copy_slabs, slab_places
from capsule_rollout.capsules.trust import Trust, restoring_as


@dataclass(frozen=True)
class CapsuleMeta:
    """Self-description of a capsule (everything but the bytes)."""

    capsule_id: str
    label: str
    step: int  # the host's committed step count at the boundary
    episode: str | None
    created_at: float  # unix seconds
    fingerprint: Mapping[str, str]
    forced: bool = False  # taken at a boundary that violates a declared alignment
    extra: Mapping[str, str] = field(default_factory=dict)  # free-form caller metadata


class Capsule:
    """State bytes of one committed boundary, grouped in per-device slabs.

    Slabs may sit on their original devices (the "device" placement) or all on
    the host (`to_host()`); `restore` accepts either. Treat every tensor a capsule
    hands out as read-only.
    """

    def __init__(
        self,
        meta: CapsuleMeta,
        slabs: Sequence[tuple[SlabLayout, torch.Tensor]],
        digests: Mapping[str, str] | None = None,
        *,
        trust: Trust = Trust.OWN,
    ) -> None:
        self.meta = meta
        self.trust = trust  # how far its bytes are trusted at a restore (`capsules.trust`): set by its reader
        self.annotations: Mapping[str, str] = MappingProxyType({})  # the file's notes (`capsule_file`), signed with it
        self._slabs = tuple(slabs)
        self._digests = dict(digests) if digests is not None else None
        self.signature = tuple(lay.signature for lay, _ in self._slabs)
        self._component_views: dict[str, BufferViews] = {}

    # -- description --------------------------------------------------------------
    @property
    def label(self) -> str:
        return self.meta.label

    @property
    def step(self) -> int:
        return self.meta.step

    @property
    def layouts(self) -> tuple[SlabLayout, ...]:
        return tuple(lay for lay, _ in self._slabs)

    @property
    def specs(self) -> dict[str, BufferSpec]:
        return {slot.key: slot.spec for lay, _ in self._slabs for slot in lay.slots}

    @property
    def nbytes(self) -> int:
        """Bytes held (slab sizes, alignment padding included)."""
        return sum(slab.numel() for _, slab in self._slabs)

    @property
    def on_host(self) -> bool:
        return all(slab.device.type == "cpu" for _, slab in self._slabs)

    def slabs(self) -> tuple[tuple[SlabLayout, torch.Tensor], ...]:
        return self._slabs

    def slab_places(self) -> tuple[SlabPlace, ...]:
        """(address, bytes, place) of each slab (found once: a capsule's slabs never move)."""
        if not hasattr(self, "_places"):
            self._places = slab_places(self._slabs)
        return self._places

    def tensors(self) -> dict[str, torch.Tensor]:
        """Typed views of every buffer (read-only by contract)."""
        out: dict[str, torch.Tensor] = {}
        for lay, slab in self._slabs:
            out.update(lay.views(slab))
        return out

    def component_tensors(self, name: str) -> BufferViews:
        """Views of one component's buffers, keyed by buffer name (read-only by contract; numpy views of the host
        ones: `BufferViews.arrays`).

        Made once per capsule and component (a view costs microseconds; a stored capsule is restored often).
        """
        if name not in self._component_views:
            prefix = f"{name}/"
            self._component_views[name] = BufferViews(
                (slot.key[len(prefix) :], slot.view(slab))
                for lay, slab in self._slabs
                for slot in lay.slots
                if slot.key.startswith(prefix)
            )
        return self._component_views[name]

    def buffer(self, key: str) -> torch.Tensor:
        for lay, slab in self._slabs:
            for slot in lay.slots:
                if slot.key == key:
                    return slot.view(slab)
        raise KeyError(f"capsule {self.label!r} has no buffer {key!r}; it has {sorted(self.specs)}")

    # -- integrity ----------------------------------------------------------------
    @property
    def digests(self) -> Mapping[str, str]:
        """Per-buffer digests; computed at snapshot, or on first access if skipped then."""
        if self._digests is None:
            self._digests = self.compute_digests()
        return MappingProxyType(self._digests)

    def compute_digests(self) -> dict[str, str]:
        """Digest the bytes as they are now (use to check nothing wrote the capsule)."""
        out: dict[str, str] = {}
        for lay, slab in self._slabs:
            values = digest_slab(slab, [(s.offset, s.nbytes) for s in lay.slots])
            out.update(zip((s.key for s in lay.slots), values))
        return out

    def check_integrity(self, source: str | None = None) -> None:
        """Raise `CapsuleIntegrityError` if any buffer changed since its digest was taken."""
        recorded = self.digests
        now = self.compute_digests()
        bad = sorted(k for k in now if now[k] != recorded.get(k))
        if bad:
            raise CapsuleIntegrityError(source or repr(self.label), bad)

    # -- placement ----------------------------------------------------------------
    def to_host(self, pin_memory: bool = False) -> Capsule:
        """A capsule with every slab in host memory (shares them if already there)."""
        if self.on_host and (not pin_memory or all(slab.is_pinned() for _, slab in self._slabs)):
            return self
        moved = []
        for lay, slab in self._slabs:
            host = torch.empty(slab.shape, dtype=slab.dtype, pin_memory=pin_memory)
            host.copy_(slab)
            moved.append((lay, host))
        return self._with_slabs(moved)

    def to_devices(self) -> Capsule:
        """A capsule whose slabs sit on the devices their buffers were declared on."""
        moved, changed = [], False
        for lay, slab in self._slabs:
            target = torch.device(lay.device)
            if slab.device == target or (target.type == slab.device.type and target.index is None):
                moved.append((lay, slab))
            else:
                moved.append((lay, slab.to(target, non_blocking=slab.is_pinned())))
                changed = True
        return self._with_slabs(moved) if changed else self

    def _with_slabs(self, slabs: Sequence[tuple[SlabLayout, torch.Tensor]]) -> Capsule:
        moved = Capsule(self.meta, slabs, self._digests, trust=self.trust)
        moved.annotations = self.annotations
        return moved

    def __repr__(self) -> str:
        return (
            f"Capsule(label={self.label!r}, step={self.step}, bytes={self.nbytes}, "
            f"buffers={sum(len(lay.slots) for lay in self.layouts)}, id={self.meta.capsule_id[:8]})"
        )


# -- verbs -----------------------------------------------------------------------


def snapshot(
    arena: Arena,
    *,
    label: str = "",
    step: int = 0,
    episode: str | None = None,
    force: bool = False,
    extra: Mapping[str, str] | None = None,
    digest: bool = True,
) -> Capsule:
    """Freeze the arena's state buffers at committed boundary `step`.

    Refused with `CapsuleAlignmentError` when `step` is not a multiple of a state
    buffer's declared alignment, unless `force=True` (recorded in the metadata).
    `digest=False` defers the digests to their first use.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    misaligned = arena.misaligned(step)
    if misaligned and not force:
        detail = ", ".join(f"{k} (every {a})" for k, a in misaligned)
        raise CapsuleAlignmentError(
            f"step {step} is not a committed boundary of {detail}; snapshot at a multiple of "
            f"{arena.alignment()} or pass force=True"
        )
    arena.before_snapshot()
    slabs = [(lay, slab.clone()) for lay, slab in arena.slabs(Role.STATE)]
    meta = CapsuleMeta(
        capsule_id=uuid.uuid4().hex,
        label=label,
        step=step,
        episode=episode,
        created_at=time.time(),
        fingerprint=MappingProxyType(arena.fingerprint()),
        forced=bool(misaligned),
        extra=MappingProxyType({str(k): str(v) for k, v in (extra or {}).items()}),
    )
    capsule = Capsule(meta, slabs)
    if digest:
        capsule.digests  # noqa: B018 - computed now, while the bytes are fresh
    return capsule


def mismatches(arena: Arena, capsule: Capsule) -> list[Mismatch]:
    """Every difference in fingerprint or state specs between capsule and arena."""
    found: list[Mismatch] = []
    if not arena.fingerprint_matches(capsule.meta.fingerprint):
        arena_fp, cap_fp = arena.fingerprint(), dict(capsule.meta.fingerprint)
        for key in sorted(set(arena_fp) | set(cap_fp)):
            if arena_fp.get(key) != cap_fp.get(key):
                found.append(Mismatch("fingerprint", key, cap_fp.get(key, MISSING), arena_fp.get(key, MISSING)))
    if arena.state_signature != capsule.signature:
        arena_specs = {k: s for lay in arena.state_layouts for k, s in ((sl.key, sl.spec) for sl in lay.slots)}
        cap_specs = capsule.specs
        for key in sorted(set(arena_specs) | set(cap_specs)):
            a, c = arena_specs.get(key), cap_specs.get(key)
            if a is None or c is None or a != c or a.device_type != c.device_type:
                found.append(
                    Mismatch("spec", key, c.describe() if c else MISSING, a.describe() if a else MISSING)
                )
    return found


def refusals(arena: Arena, capsule: Capsule) -> list[Mismatch]:
    """`mismatches`, then (when there are none) each component's own `check_restore` objections, at the capsule's
    trust level (`capsules.trust`)."""
    with restoring_as(capsule.trust):
        return _refusals(arena, capsule)


def _refusals(arena: Arena, capsule: Capsule) -> list[Mismatch]:
    return mismatches(arena, capsule) or arena.refusals(capsule.component_tensors)


def restore(arena: Arena, capsule: Capsule, *, check_integrity: bool = False) -> None:
    """Copy `capsule` back into the arena's live state buffers, in place.

    Everything is checked before the first byte is copied (specs, fingerprint, each
    component's `check_restore`, and with `check_integrity=True` the digests): a
    refused capsule leaves the arena untouched. Components check and restore at the
    capsule's trust level (`capsule.trust`, `capsules.trust`).
    """
    with restoring_as(capsule.trust):  # entered once: its checks and its loads at the capsule's trust
        found = _refusals(arena, capsule)
        if found:
            raise CapsuleMismatchError(capsule.label or capsule.meta.capsule_id, found)
        if check_integrity:
            capsule.check_integrity()
        _copy_into(arena, capsule)
        arena.after_restore()


def _copy_into(arena: Arena, capsule: Capsule) -> None:
    # the specs were compared, so the slabs pair up and their sizes match; the buffers components copy from the
    # capsule themselves (`direct_buffers`) are given to them instead of copied into the arena
    copy_slabs(arena.slab_places(), capsule.slab_places(), arena.slabs(Role.STATE), capsule.slabs(), arena.copy_runs())
    arena.restore_direct(capsule.component_tensors)


def fork(capsule: Capsule, arenas: Sequence[Arena]) -> None:
    """Restore one capsule into several arenas: independent live branches.

    Each branch gets its own copy of the bytes; the capsule is only read, so it
    stays valid for further forks (copy-on-write). All arenas are checked first.
    """
    if len({id(a) for a in arenas}) != len(arenas):
        raise ValueError("fork needs distinct arenas; the same arena appears twice")
    for arena in arenas:
        found = refusals(arena, capsule)
        if found:
            raise CapsuleMismatchError(capsule.label or capsule.meta.capsule_id, found)
    for arena in arenas:
        _copy_into(arena, capsule)
        with restoring_as(capsule.trust):
            arena.after_restore()
