"""The small protocol through which a component declares and receives its buffers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from capsule_rollout.capsules.buffer_spec import BufferSpec

_NO_FINGERPRINT: Mapping[str, str] = MappingProxyType({})  # one object: the arena re-merges on a new one


@runtime_checkable
class CapsuleComponent(Protocol):
    """A part of a rollout host whose state lives in arena buffers.

    Life cycle: the arena asks `buffer_specs()`, allocates every buffer once, then
    calls `bind()` with the views (their addresses never change afterwards).

    Live state that cannot live in arena memory (a MuJoCo `MjData`, a
    `torch.Generator`) is mirrored through the two hooks: `before_snapshot()`
    writes it into the component's state buffers, `after_restore()` reads it back.
    Components whose state lives entirely in their buffers implement both as no-ops.

    Optional hook, called by `restore` and `fork` before the first byte is copied:
    `check_restore(view)`, where `view` maps each of the component's buffer names to
    the capsule's (read-only by contract) tensor (a `BufferViews`: `host_arrays(view)`
    gives numpy views of the host buffers, kept with the capsule, so that a check
    calls no torch at every restore). It raises `ValueError` saying why
    the component cannot take that state (e.g. a task of another family); the
    restore is then refused with the arena untouched. Without it a component accepts
    every capsule whose specs and fingerprint match (`BufferComponent` has the default).

    Optional, for state mirrored from elsewhere: `direct_buffers`, names of host state
    buffers the component copies from the capsule into their live place itself (a
    MuJoCo env's MjData image, copied once into MjData instead of into the arena and
    again from there). A restore copies every other byte into the arena, then calls
    `restore_direct(view)` with the capsule's buffers (as `check_restore` gets them),
    then `after_restore()`. Between a restore and the next snapshot the arena's copy of
    such a buffer holds what an earlier snapshot wrote, never read by the component.
    """

    name: str

    def buffer_specs(self) -> Sequence[BufferSpec]:
        """Every buffer this component needs, in any order."""
        ...

    def bind(self, buffers: Mapping[str, torch.Tensor]) -> None:
        """Receive the allocated buffers, keyed by `BufferSpec.name`."""
        ...

    def fingerprint(self) -> Mapping[str, str]:
        """What the state is bound to (weights hash, model hash, code version...).

        Called on every snapshot and restore: return a cached mapping.
        """
        ...

    def before_snapshot(self) -> None:
        """Copy live state kept outside the arena into the state buffers."""
        ...

    def after_restore(self) -> None:
        """Load live state kept outside the arena from the (restored) state buffers."""
        ...


class BufferViews(dict):
    """One component's buffers in a capsule, by name (torch views, read-only by contract), as `check_restore` is given
    them; `arrays()`: numpy views of those on the host, made at its first call and kept with the capsule. A check
    that reads them as arrays spares a restore torch's dispatch, whose first calls after an env's step cost tens of
    microseconds each (its code is out of the CPU's caches then): a stored capsule is restored every episode."""

    __slots__ = ("_arrays",)

    def arrays(self) -> Mapping[str, np.ndarray]:
        try:
            return self._arrays
        except AttributeError:
            self._arrays = _numpy_views(self)
            return self._arrays


def host_arrays(view: Mapping[str, torch.Tensor]) -> Mapping[str, np.ndarray]:
    """Numpy views of `view`'s host buffers (sharing their memory; bfloat16 and device buffers left out), kept
    with the capsule when `view` is one's `BufferViews`."""
    return view.arrays() if isinstance(view, BufferViews) else _numpy_views(view)


def _numpy_views(view: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in view.items() if v.device.type == "cpu" and v.dtype is not torch.bfloat16}


class BufferComponent:
    """Convenience base: keeps the bound buffers and implements no-op hooks."""

    name: str = "component"

    def __init__(self) -> None:
        self.buffers: dict[str, torch.Tensor] = {}

    def buffer_specs(self) -> Sequence[BufferSpec]:  # pragma: no cover - abstract
        raise NotImplementedError

    def bind(self, buffers: Mapping[str, torch.Tensor]) -> None:
        self.buffers = dict(buffers)

    def fingerprint(self) -> Mapping[str, str]:
        return _NO_FINGERPRINT

    def before_snapshot(self) -> None:
        return None

    def after_restore(self) -> None:
        return None

    def check_restore(self, view: Mapping[str, torch.Tensor]) -> None:
        """Raise `ValueError` to refuse a capsule's state before it is copied (default: accept)."""
        return None

    direct_buffers: tuple[str, ...] = ()
    """Host state buffers this component copies from a capsule itself (`restore_direct`); none by default."""

    def restore_direct(self, view: Mapping[str, torch.Tensor]) -> None:
        """Given the capsule's buffers at a restore (after the arena's copy, before `after_restore`) when
        `direct_buffers` names some: copy those into their live place, here or in `after_restore`."""
        return None
