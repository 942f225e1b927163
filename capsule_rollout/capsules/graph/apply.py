"""What a graph capture (`capsules.graph.state`) reads from and writes into one object: its own state (`state_of`),
that state set back in place (`apply_state`, keeping a target's own value where the capsule names an opaque object
it lacks: `MISSING`), and the stand-ins for a graph with no structs or no handles."""

from __future__ import annotations

from typing import Any

import numpy as np

from capsule_rollout.capsules.graph.walk import _slots


def state_of(obj: Any) -> tuple[dict | None, dict, Any]:
    """An object's own state: (`__dict__` copy or None, slots, dict items / list items / None)."""
    d = getattr(obj, "__dict__", None)
    slots = {}
    for k in _slots(type(obj)):
        try:
            slots[k] = object.__getattribute__(obj, k)
        except AttributeError:
            continue
    items = dict(obj) if isinstance(obj, dict) else list(obj) if isinstance(obj, list) else None
    return (dict(d) if isinstance(d, dict) else None), slots, items


class _Missing:
    """An opaque object the target does not have (yet): a GL context a fresh env makes at its first render."""

    def __repr__(self) -> str:
        return "<missing in the target>"


MISSING = _Missing()


def _holds_missing(v: Any, depth: int = 3) -> bool:
    if v is MISSING:
        return True
    if depth and isinstance(v, (list, tuple)):
        return any(_holds_missing(x, depth - 1) for x in v)
    if depth and isinstance(v, dict):
        return any(_holds_missing(x, depth - 1) for x in v.values())
    return False


def apply_state(obj: Any, state: tuple[dict | None, dict, Any], missing: bool) -> None:
    d, slots, items = state
    if d is not None:
        own = obj.__dict__
        if missing:  # an attribute that holds an opaque object the target lacks keeps the target's own value
            d = {k: own[k] if _holds_missing(v) else v for k, v in d.items() if not _holds_missing(v) or k in own}
        own.clear()
        own.update(d)
    for k in _slots(type(obj)):
        if k in slots:
            object.__setattr__(obj, k, slots[k])
        else:
            try:
                object.__delattr__(obj, k)
            except AttributeError:
                pass
    if items is not None:
        obj.clear()
        obj.update(items) if isinstance(obj, dict) else obj.extend(items)


class NoStructs:
    """A graph without structs set in place."""

    types: tuple[type, ...] = ()

    def state(self, obj: Any) -> dict:
        raise TypeError(f"no struct: {type(obj).__name__}")

    def check(self, obj: Any, state: dict) -> None:
        raise ValueError("a struct, and this graph has none")

    def apply(self, obj: Any, state: dict) -> None:
        raise TypeError(f"no struct: {type(obj).__name__}")


class NoAliases:
    """A graph without handles: no array aliases one."""

    def find(self, arr: np.ndarray, handles: list) -> None:
        return None

    def view(self, *args: Any) -> np.ndarray:
        raise ValueError("an alias of a handle, and this graph has none")
