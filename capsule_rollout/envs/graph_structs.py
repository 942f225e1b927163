"""MuJoCo's visualization structs in an env's object graph, captured as values (`envs.object_graph`).

A suite's renderer keeps, beside its GL context, the settings `mjv_updateScene` reads: the camera (`MjvCamera`:
gymnasium's viewer aims its free camera at the median of the geoms' positions when it is made, at the first
render), the visual options (`MjvOption`: robosuite sets geom groups at each reset), the perturbation
(`MjvPerturb`) and the scene's own settings (`MjvScene`: flags, transform, frame). They are state outside
MjData: each is saved field by field and set in place in the target's struct at the same path (the renderer
holding it is the target's own). The scene's geoms, lights and skins are not: `mjv_updateScene` rebuilds them
from MjData at every render.
"""

from __future__ import annotations

from typing import Any

import mujoco
import numpy as np

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
    """`capsules.graph_state.GraphState`'s `structs` for MuJoCo: what of each visualization struct is state."""

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
