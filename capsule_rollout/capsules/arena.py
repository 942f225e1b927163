"""`Arena`: allocates every component buffer once, at static addresses."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

import numpy as np
import torch

from capsule_rollout.capsules.buffer_spec import BufferSpec, Role
from capsule_rollout.capsules.component import BufferComponent, CapsuleComponent
from capsule_rollout.capsules.errors import Mismatch, SpecError
from capsule_rollout.capsules.layout import SlabLayout, plan_slabs
from capsule_rollout.capsules.slab_copy import SlabPlace, copy_runs, slab_places

FORMAT_FINGERPRINT_KEY = "capsules/format"
FORMAT_FINGERPRINT = "1"  # bump when the meaning of a state layout changes


class Arena:
    """Collects buffer specs from components, allocates them once, binds views.

    Buffers of one (role, device) share one byte slab (see `capsules.layout`), so
    the whole committed state of a device is one contiguous region: snapshot and
    restore are a single copy per device, and addresses never change after
    `allocate()` (captured CUDA graphs stay valid). CPU buffers can be seen as
    numpy arrays sharing the same memory (`numpy()`).
    """

    def __init__(
        self,
        components: Iterable[CapsuleComponent] = (),
        *,
        fingerprint: Mapping[str, str] | None = None,
    ) -> None:
        self._components: dict[str, CapsuleComponent] = {}
        self._extra_fingerprint = dict(fingerprint or {})
        self._specs: dict[str, BufferSpec] = {}
        self._layouts: tuple[SlabLayout, ...] = ()
        self._slabs: list[torch.Tensor] = []
        self._views: dict[str, torch.Tensor] = {}
        self._state: list[tuple[SlabLayout, torch.Tensor]] = []
        self._merged_fingerprint: tuple[tuple, dict[str, str]] | None = None
        self._fingerprint_match: tuple[Mapping[str, str], dict[str, str]] | None = None
        self.state_signature: tuple = ()
        for component in components:
            self.add(component)

    # -- registration -------------------------------------------------------------
    def add(self, component: CapsuleComponent) -> None:
        """Register a component; its specs are read now, buffers made in `allocate()`."""
        if self.allocated:
            raise SpecError(
                f"cannot add component {component.name!r}: the arena is already allocated "
                "(addresses are static); build a new Arena with every component"
            )
        if not isinstance(component, CapsuleComponent):
            raise SpecError(
                f"{type(component).__name__} is not a CapsuleComponent: it needs name, buffer_specs(), "
                "bind(), fingerprint(), before_snapshot() and after_restore()"
            )
        name = component.name
        if not isinstance(name, str) or not name or "/" in name:
            raise SpecError(f"component name {name!r} must be a non-empty string without '/'")
        if name in self._components:
            raise SpecError(f"two components are named {name!r}; give each a unique name")
        specs: dict[str, BufferSpec] = {}
        for spec in component.buffer_specs():
            if not isinstance(spec, BufferSpec):
                raise SpecError(f"component {name!r} declared {spec!r}, which is not a BufferSpec")
            key = f"{name}/{spec.name}"
            if key in specs:
                raise SpecError(f"component {name!r} declares buffer {spec.name!r} twice")
            specs[key] = spec
        self._components[name] = component
        self._specs.update(specs)

    def allocate(self) -> Arena:
        """Allocate every slab once and bind each component to its views."""
        if self.allocated:
            raise SpecError("the arena is already allocated; allocation happens once")
        if not self._components:
            raise SpecError("the arena has no components; add at least one before allocate()")
        self._layouts = plan_slabs(self._specs)
        for layout in self._layouts:
            slab = torch.zeros(layout.nbytes, dtype=torch.uint8, device=layout.device)
            self._slabs.append(slab)
            self._views.update(layout.views(slab))
            if layout.role is Role.STATE:
                self._state.append((layout, slab))
        self.state_signature = tuple(lay.signature for lay, _ in self._state)
        self._places = slab_places(self._state)
        self._direct = self._direct_buffers()
        skipped = {f"{name}/{buffer}" for name, _ in self._direct for buffer in self._components[name].direct_buffers}
        self._runs = tuple(copy_runs(lay, skipped) if any(s.key in skipped for s in lay.slots) else None
                           for lay, _ in self._state)
        self._restore_checks = tuple(  # the components with a check of their own, found once
            (name, component.check_restore) for name, component in self._components.items()
            if getattr(component, "check_restore", None) is not None
            and getattr(type(component), "check_restore", None) is not BufferComponent.check_restore
        )
        for name in self._components:
            self.rebind(name)
        return self

    def _direct_buffers(self) -> tuple[tuple[str, CapsuleComponent], ...]:
        """The components that copy some of their state buffers from a capsule themselves (`direct_buffers`), each
        named buffer checked to be one of its host state buffers."""
        found = []
        for name, component in self._components.items():
            direct = tuple(getattr(component, "direct_buffers", ()))
            if not direct:
                continue
            for buffer in direct:
                spec = self._specs.get(f"{name}/{buffer}")
                if spec is None or spec.role is not Role.STATE or torch.device(spec.device).type != "cpu":
                    raise SpecError(f"component {name!r} names {buffer!r} among its direct_buffers, which is not one "
                                    "of its host state buffers")
            found.append((name, component))
        return tuple(found)

    def copy_runs(self) -> tuple[tuple[tuple[int, int], ...] | None, ...]:
        """Per state slab, the (offset, bytes) runs a restore copies into it (None: the whole slab): all but the
        buffers components copy from the capsule themselves (`direct_buffers`)."""
        self._require_allocated()
        return self._runs

    def restore_direct(self, capsule_tensors: Callable[[str], Mapping[str, torch.Tensor]]) -> None:
        """Give each component with `direct_buffers` the capsule's buffers (`restore_direct`), after the slabs'
        copy, before `after_restore`."""
        for name, component in self._direct:
            component.restore_direct(capsule_tensors(name))

    def rebind(self, name: str) -> None:
        """Bind component `name` to this arena's views (again): a component held by several arenas used one at a
        time (a slot's row serving the host of whichever task the slot plays now) is bound to the one in use."""
        self._require_allocated()
        prefix = f"{name}/"
        self._components[name].bind(
            {key[len(prefix) :]: view for key, view in self._views.items() if key.startswith(prefix)}
        )

    @property
    def allocated(self) -> bool:
        return bool(self._layouts)

    def _require_allocated(self) -> None:
        if not self.allocated:
            raise SpecError("the arena is not allocated yet; call allocate() first")

    # -- introspection ------------------------------------------------------------
    @property
    def components(self) -> Mapping[str, CapsuleComponent]:
        return MappingProxyType(self._components)

    @property
    def specs(self) -> Mapping[str, BufferSpec]:
        return MappingProxyType(self._specs)

    def slabs(self, role: Role | None = None) -> list[tuple[SlabLayout, torch.Tensor]]:
        """(layout, slab) pairs, optionally of one role; slabs are 1-D uint8 tensors."""
        self._require_allocated()
        if role is Role.STATE:
            return list(self._state)
        return [(lay, slab) for lay, slab in zip(self._layouts, self._slabs) if role is None or lay.role is role]

    def slab_places(self) -> tuple[SlabPlace, ...]:
        """(address, bytes, place) of each state slab (fixed at allocation; see `capsules.slab_copy`)."""
        self._require_allocated()
        return self._places

    @property
    def state_layouts(self) -> tuple[SlabLayout, ...]:
        self._require_allocated()
        return tuple(lay for lay in self._layouts if lay.role is Role.STATE)

    @property
    def state_nbytes(self) -> int:
        return sum(lay.nbytes for lay in self.state_layouts)

    def buffer(self, key: str) -> torch.Tensor:
        """The live view of buffer `"<component>/<buffer>"`."""
        self._require_allocated()
        try:
            return self._views[key]
        except KeyError:
            raise SpecError(f"no buffer {key!r} in this arena; known: {sorted(self._views)}") from None

    def buffers(self, role: Role | None = None) -> dict[str, torch.Tensor]:
        self._require_allocated()
        return {k: v for k, v in self._views.items() if role is None or self._specs[k].role is role}

    def numpy(self, key: str) -> np.ndarray:
        """A numpy array sharing memory with a CPU buffer (writes go both ways)."""
        view = self.buffer(key)
        if view.device.type != "cpu":
            raise SpecError(f"buffer {key!r} lives on {view.device}; only CPU buffers have numpy views")
        if view.dtype is torch.bfloat16:
            raise SpecError(f"buffer {key!r} is bfloat16, which numpy cannot represent; use the torch view")
        return view.numpy()

    def fingerprint(self) -> dict[str, str]:
        """Merged fingerprint: each component's keys prefixed by its name (a copy)."""
        return dict(self._merged())

    def _merged(self) -> dict[str, str]:
        """The merged fingerprint, merged again only when a component returns a different mapping object than
        last time (components return cached mappings, so a restore pays one identity check per component)."""
        cached = self._merged_fingerprint
        if cached is not None and len(cached[0]) == len(self._components):
            for component, part in zip(self._components.values(), cached[0]):
                if component.fingerprint() is not part:
                    break
            else:
                return cached[1]
        parts = tuple(component.fingerprint() for component in self._components.values())
        merged = {FORMAT_FINGERPRINT_KEY: FORMAT_FINGERPRINT}
        merged.update(self._extra_fingerprint)
        for name, part in zip(self._components, parts):
            for k, v in part.items():
                merged[f"{name}/{k}"] = str(v)
        self._merged_fingerprint = (parts, merged)
        return merged

    def fingerprint_matches(self, other: Mapping[str, str]) -> bool:
        """Whether `other` equals the merged fingerprint (without copying either). A read-only mapping found
        equal is remembered with the merged dict it matched, so the same two objects match again without
        comparing items: a capsule's fingerprint, restored every episode."""
        merged = self._merged()
        last = self._fingerprint_match
        if last is not None and last[0] is other and last[1] is merged:
            return True
        if merged != other:
            return False
        if isinstance(other, MappingProxyType):
            self._fingerprint_match = (other, merged)
        return True

    def alignment(self) -> int:
        """Least common multiple of every state buffer's boundary alignment (1 if none)."""
        aligns = [s.alignment for s in self._specs.values() if s.alignment]
        return math.lcm(*aligns) if aligns else 1

    def misaligned(self, step: int) -> list[tuple[str, int]]:
        """(key, alignment) of every state buffer for which `step` is not a boundary."""
        return [(k, s.alignment) for k, s in self._specs.items() if s.alignment and step % s.alignment]

    # -- hooks and test helpers ---------------------------------------------------
    def before_snapshot(self) -> None:
        for component in self._components.values():
            component.before_snapshot()

    def after_restore(self) -> None:
        for component in self._components.values():
            component.after_restore()

    def refusals(self, capsule_tensors: Callable[[str], Mapping[str, torch.Tensor]]) -> list[Mismatch]:
        """Each component's own objection to a capsule (`check_restore`), before anything is copied.

        `capsule_tensors(name)` gives that component's buffers in the capsule; it is only
        called for components that define a check (building views costs per buffer).
        """
        self._require_allocated()
        found = []
        for name, check in self._restore_checks:
            try:
                check(capsule_tensors(name))
            except (ValueError, KeyError, IndexError) as exc:
                found.append(Mismatch("component", name, str(exc), ""))
        return found

    def fill_random_(self, generator: torch.Generator) -> None:
        """Overwrite every live buffer (all roles) with random bytes.

        Used by `verify` to prove a restore does not depend on what was there.
        Booleans get random 0/1 so they stay valid booleans.
        """
        self._require_allocated()
        for slab in self._slabs:
            noise = torch.randint(0, 256, slab.shape, dtype=torch.uint8, generator=generator)
            slab.copy_(noise)
        for view in self._views.values():
            if view.dtype is torch.bool:
                view.view(torch.uint8).bitwise_and_(1)

    def __repr__(self) -> str:
        state = f"{self.state_nbytes} state bytes" if self.allocated else "not allocated"
        return f"Arena(components={list(self._components)}, {state})"
