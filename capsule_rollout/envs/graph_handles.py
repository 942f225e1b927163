"""MuJoCo handles in an env's object graph and the arrays that alias them (`envs.object_graph`): where each
array field of an MjModel / MjData lies in memory, which field an ndarray is a view of, and a view of the same
field of another handle (how an alias is re-linked at a restore)."""

from __future__ import annotations

from typing import Any

import mujoco
import numpy as np

from capsule_rollout.capsules.graph_read import extent, span

_SKIP_FIELDS = ("island", "efc_AR_")


def handle_fields(h: Any) -> list[tuple[int, int, str]]:
    """(start address, end address, field) of every array of an MjModel / MjData: MjData's model-sized buffer
    (its arena's arrays are left out: they point at stale memory when unused) and the struct arrays inside
    mjData itself (`warning.number`...), by address."""
    out = []
    inside = None
    if isinstance(h, mujoco.MjData):
        start = h.qpos.__array_interface__["data"][0]
        inside = (start, start + int(h.nbuffer))
    for name in dir(h):
        if name.startswith("_") or any(s in name for s in _SKIP_FIELDS):
            continue
        try:
            v = getattr(h, name)
        except Exception:  # noqa: BLE001 - a property that cannot be read here is no array
            continue
        if isinstance(v, np.ndarray) and v.nbytes:
            start = v.__array_interface__["data"][0]
            if inside is None or inside[0] <= start and start + v.nbytes <= inside[1]:
                out.append((start, start + v.nbytes, name))
        elif isinstance(h, mujoco.MjData) and name in ("warning", "timer", "solver"):
            for sub in dir(v):
                w = getattr(v, sub, None) if not sub.startswith("_") else None
                if isinstance(w, np.ndarray) and w.nbytes:
                    start = w.__array_interface__["data"][0]
                    out.append((start, start + w.nbytes, f"{name}.{sub}"))
    return sorted(out)


def _field_array(h: Any, field: str) -> np.ndarray:
    x = h
    for part in field.split("."):
        x = getattr(x, part)
    return x


class _Memory:
    """An ndarray interface over memory at an address, kept alive through `owner`."""

    def __init__(self, address: int, shape: tuple, strides: tuple, dtype: np.dtype, owner: Any) -> None:
        self.owner = owner
        self.__array_interface__ = {"data": (address, False), "shape": tuple(shape), "strides": tuple(strides),
                                    "typestr": np.dtype(dtype).str, "version": 3}


HANDLE_TYPES = (mujoco.MjModel, mujoco.MjData)


class Aliases:
    """Finds which handle field an array's memory lies in (fields cached per handle object), and makes the same
    view of another handle (`capsules.graph_state.GraphState`'s `aliases`)."""

    def __init__(self) -> None:
        self._fields: dict[int, tuple[Any, list[tuple[int, int, str]]]] = {}

    def fields(self, h: Any) -> list[tuple[int, int, str]]:
        cached = self._fields.get(id(h))
        if cached is None or cached[0] is not h:
            cached = (h, handle_fields(h))
            self._fields[id(h)] = cached
        return cached[1]

    def view(self, h: Any, field: Any, offset: Any, shape: Any, strides: Any, dtype: Any) -> np.ndarray:
        """The same view of `field` of handle `h` as an alias recorded (`find`), refused (ValueError) unless
        `field` is one of the handle's arrays and the view lies inside it."""
        if not any(name == field for _, _, name in self.fields(h)):
            raise ValueError(f"an alias of {field!r}, which is no array of a {type(h).__name__}")
        base = _field_array(h, field)
        dt = extent(offset, shape, strides, dtype, span(base))
        address = base.__array_interface__["data"][0] + offset
        return np.asarray(_Memory(address, shape, strides, dt, (h, base)))

    def find(self, arr: np.ndarray, handles: list[tuple[int, Any]]) -> tuple | None:
        if not arr.nbytes:
            return None
        p = arr.__array_interface__["data"][0]
        for index, h in handles:
            hits = [(start, name) for start, end, name in self.fields(h) if start <= p < end]
            if not hits:
                continue
            # struct arrays interleave (warning.lastinfo / .number): the field whose element grid it starts on
            good = [(s, n) for s, n in hits if _field_array(h, n).dtype == arr.dtype
                    and (p - s) % max(1, _field_array(h, n).strides[0] if _field_array(h, n).ndim else 1) == 0]
            start, name = (good or hits)[-1]
            return index, name, p - start, arr.shape, arr.strides, arr.dtype.str
        return None
