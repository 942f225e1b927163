"""An env's Python state found without declarations: MuJoCo's side of graph capture (`capsules.graph`).

`GraphState` is `capsules.graph.state.GraphState` over the env with MuJoCo's handles:

- `MjModel` / `MjData` are never copied (the adapter captures them through MuJoCo); an array lying in their
  memory is an alias re-linked to the target's handle (`Aliases`: where each array field of a handle lies in
  memory, which field an ndarray is a view of, and a view of the same field of another handle);
- a renderer's visualization structs are values set in place (`VisualStructs`). A suite's renderer keeps,
  beside its GL context, the settings `mjv_updateScene` reads: the camera (`MjvCamera`: gymnasium's viewer aims
  its free camera at the median of the geoms' positions when it is made, at the first render), the visual
  options (`MjvOption`: robosuite sets geom groups at each reset), the perturbation (`MjvPerturb`) and the
  scene's own settings (`MjvScene`: flags, transform, frame). They are state outside MjData: each is saved
  field by field and set in place in the target's struct at the same path (the renderer holding it is the
  target's own). The scene's geoms, lights and skins are not: `mjv_updateScene` rebuilds them from MjData at
  every render.
"""

from __future__ import annotations

from typing import Any

import mujoco
import numpy as np

from capsule_rollout.capsules.graph.read import GraphStateError, extent, span, split  # noqa: F401 - part of the API
from capsule_rollout.capsules.graph.state import GraphState as _GraphState
from capsule_rollout.capsules.graph.state import differing_paths  # noqa: F401 - part of this module's API
from capsule_rollout.capsules.graph.walk import fmt, walk  # noqa: F401 - part of this module's API

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
    view of another handle (`capsules.graph.state.GraphState`'s `aliases`)."""

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


FIELDS: dict[type, tuple[str, ...]] = {
    mujoco.MjvCamera: ("type", "fixedcamid", "trackbodyid", "lookat", "distance", "azimuth", "elevation",
                       "orthographic"),
    mujoco.MjvOption: ("label", "frame", "geomgroup", "sitegroup", "jointgroup", "tendongroup", "actuatorgroup",
                       "flexgroup", "skingroup", "flags", "bvh_depth", "flex_layer"),
    mujoco.MjvPerturb: ("select", "flexselect", "skinselect", "active", "active2", "refpos", "refquat", "refselpos",
                        "localpos", "localmass", "scale"),
    mujoco.MjvScene: ("flags", "enabletransform", "translate", "rotate", "scale", "stereo", "framewidth", "framergb",
                      "flexvertopt", "flexedgeopt", "flexfaceopt", "flexskinopt"),
}
"""The fields saved per struct type (those this MuJoCo has: `_fields`)."""

_SCALARS = (int, float)


def _fields(t: type) -> tuple[str, ...]:
    probe = t()
    return tuple(f for f in FIELDS[t] if hasattr(probe, f))


class VisualStructs:
    """`capsules.graph.state.GraphState`'s `structs` for MuJoCo: what of each visualization struct is state."""

    types = tuple(FIELDS)

    def __init__(self) -> None:
        self._fields = {t: _fields(t) for t in FIELDS}

    def _names(self, obj: Any) -> tuple[str, ...]:
        return self._fields[next(t for t in FIELDS if isinstance(obj, t))]

    def state(self, obj: Any) -> dict[str, Any]:
        out = {}
        for name in self._names(obj):
            value = getattr(obj, name)
            out[name] = value.copy() if isinstance(value, np.ndarray) else value
        return out

    def check(self, obj: Any, state: dict) -> None:
        """Refuse (ValueError) a state that is not this struct's fields with their shapes and types (a capsule
        file is input): `apply` then cannot fail."""
        names = self._names(obj)
        if set(state) != set(names):
            raise ValueError(f"a {type(obj).__name__} with fields {sorted(state)}; this MuJoCo's are {sorted(names)}")
        for name in names:
            have, value = getattr(obj, name), state[name]
            if isinstance(have, np.ndarray):
                if not (type(value) is np.ndarray and value.shape == have.shape and value.dtype == have.dtype):
                    raise ValueError(f"{type(obj).__name__}.{name}: not a {have.dtype} array of shape {have.shape}")
            elif type(value) is not type(have) or not isinstance(value, _SCALARS):
                raise ValueError(f"{type(obj).__name__}.{name}: not a {type(have).__name__}")

    def apply(self, obj: Any, state: dict) -> None:
        for name, value in state.items():
            if isinstance(value, np.ndarray):
                getattr(obj, name)[...] = value
            else:
                setattr(obj, name, value)


class GraphState(_GraphState):
    """`capsules.graph.state.GraphState` of an env: its MuJoCo handles and the arrays that alias them, its
    visualization structs."""

    def __init__(self, root: Any, *, exclude: tuple[str, ...] = (), global_rngs: bool = True) -> None:
        super().__init__(root, exclude=exclude, global_rngs=global_rngs, handles=HANDLE_TYPES, aliases=Aliases(),
                         structs=VisualStructs())


def env_walk(root: Any) -> dict:
    """`graph.walk.walk` of an env (its MuJoCo handles as handles)."""
    return walk(root, handles=HANDLE_TYPES, structs=VisualStructs.types)
