"""The walk of an env's object graph (`envs.object_graph`): every object reachable from the env, breadth first,
with its first path, and what kind of thing each is (handle, opaque, generator, array, object, container, value;
see `object_graph`'s docstring for what each kind means to a capsule)."""

from __future__ import annotations

import collections
import enum
import random
import threading
import types
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import mujoco
import numpy as np

from capsule_rollout.envs.graph_codec import OPAQUE_MODULES, ref_key

HANDLE_TYPES = (mujoco.MjModel, mujoco.MjData)
ATOMIC_TYPES = (type(None), bool, int, float, complex, str, bytes, range, slice, type, types.BuiltinFunctionType,
                types.ModuleType, np.generic, np.dtype, type(Ellipsis), type(NotImplemented), enum.Enum)
GENERATOR_TYPES = (np.random.Generator, np.random.RandomState, np.random.BitGenerator, random.Random)
LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()), threading.Condition, threading.Event,
              threading.Thread)

REF_TYPES = (type, types.FunctionType, types.BuiltinFunctionType, types.ModuleType, types.MethodDescriptorType,
             types.WrapperDescriptorType, np.ufunc)

Path = tuple  # of steps: ("a", name) attribute, ("k", key) mapping key, ("i", index) sequence item, ("self",)


def fmt(path: Path | None) -> str:
    """A path as Python reads it: `.env.robots[0].controller`; `<root>` for the root itself."""
    if path is None:
        return "<inside a set>"
    out = ""
    for step in path:
        kind = step[0]
        out += f".{step[1]}" if kind == "a" else f"[{step[1]!r}]" if kind in ("k", "i") else ".__self__"
    return out or "<root>"


def _slots(t: type) -> list[str]:
    out = []
    for k in t.__mro__:
        s = vars(k).get("__slots__", ())
        out += [s] if isinstance(s, str) else [n for n in s if n not in ("__dict__", "__weakref__")]
    return out


def _has_del(t: type) -> bool:
    return any("__del__" in vars(k) for k in t.__mro__ if k is not object)


def _python_call(t: type) -> bool:
    return any(isinstance(vars(k).get("__call__"), types.FunctionType) for k in t.__mro__)


def classify(x: Any) -> str:
    """handle | atomic | opaque | generator | array | method | container | object | value."""
    if isinstance(x, HANDLE_TYPES):
        return "handle"
    if isinstance(x, ATOMIC_TYPES):
        return "atomic"
    t = type(x)
    if isinstance(x, types.FunctionType):
        # a closure points at its owner, a lambda or local function cannot be pickled by reference
        return "opaque" if x.__closure__ or "<" in x.__qualname__ else "atomic"
    if isinstance(x, GENERATOR_TYPES):
        return "generator"
    if isinstance(x, np.ndarray):
        return "array"
    if t.__module__.startswith("torch") and t.__name__ in ("Tensor", "Parameter", "Generator"):
        return "value"  # its data is not in its __dict__: pickled whole
    if isinstance(x, types.MethodType):
        return "method"
    module = t.__module__ or ""
    if "<locals>" in t.__qualname__:
        return "opaque"  # a class made inside a function (dm_control's named indexers): not importable elsewhere
    if (isinstance(x, LOCK_TYPES) or isinstance(x, (weakref.ref, types.GeneratorType, types.CoroutineType))
            or module.split(".")[0] in OPAQUE_MODULES or (module.startswith("mujoco") and "<" not in t.__qualname__)):
        return "opaque"
    if callable(x) and not isinstance(x, type) and not _python_call(t) and not hasattr(x, "__dict__"):
        return "atomic"  # C functions, method wrappers, numpy ufuncs: pickled by reference
    if isinstance(x, (list, tuple, dict, set, frozenset, collections.deque)) and (
            not hasattr(x, "__dict__") or t in (collections.OrderedDict, collections.defaultdict)):
        return "container"
    if hasattr(x, "__dict__") or _slots(t):
        if _has_del(t) or "<locals>" in t.__qualname__:
            return "opaque"
        return "object"
    return "value"


def _children(x: Any, kind: str) -> Iterator[tuple[tuple | None, Any]]:
    if kind == "container":
        if isinstance(x, dict):
            for k, v in x.items():
                yield (("k", k) if isinstance(k, (str, int, bool, float, tuple, type(None))) else None), v
        elif isinstance(x, (list, tuple, collections.deque)):
            for i, v in enumerate(x):
                yield ("i", i), v
        else:
            for v in x:  # a set: its members have no path
                yield None, v
    elif kind in ("object", "opaque"):
        d = getattr(x, "__dict__", None)
        if isinstance(d, dict):
            for k, v in list(d.items()):
                yield ("a", k), v
        for k in _slots(type(x)):
            try:
                yield ("a", k), object.__getattribute__(x, k)
            except AttributeError:
                continue
        if isinstance(x, dict):
            for k, v in list(x.items()):
                yield (("k", k) if isinstance(k, (str, int)) else None), v
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                yield ("i", i), v
    elif kind == "method":
        yield ("self",), x.__self__


@dataclass
class Node:
    obj: Any
    kind: str
    path: Path | None  # None: reachable only through a set (no path to pair it by)


def walk(root: Any, refs: set[str] | None = None) -> dict[int, Node]:
    """Every non-atomic object reachable from `root`, breadth first, with its first path; `refs` (when given)
    gathers the `graph_codec.ref_key` of every class, function and module met (the names a capsule of this
    graph may use)."""
    seen: dict[int, Node] = {}
    queue = collections.deque([(root, ())])
    while queue:
        x, path = queue.popleft()
        if id(x) in seen:
            continue
        kind = classify(x)
        if refs is not None:
            held = x if kind == "atomic" and isinstance(x, REF_TYPES) else type(x)
            key = ref_key(held)
            if key is not None:
                refs.add(key)
        if kind == "atomic":
            continue
        seen[id(x)] = Node(x, kind, path)
        if kind in ("handle", "array", "generator", "value"):
            continue
        for step, v in _children(x, kind):
            queue.append((v, None if path is None or step is None else (*path, step)))
    return seen


def resolve(root: Any, path: Path) -> Any:
    """The object at `path` from `root`. A path may come from a capsule file: only an instance's own
    attributes and declared slots, the items of plain containers and a method's owner are followed (no
    property or `__getitem__` of the env's classes runs); KeyError otherwise."""
    x = root
    for step in path:
        kind = step[0]
        if kind == "a":
            d = getattr(x, "__dict__", None)
            if isinstance(d, dict) and step[1] in d:
                x = d[step[1]]
            elif step[1] in _slots(type(x)):
                x = object.__getattribute__(x, step[1])
            else:
                raise KeyError(step[1])
        elif kind in ("k", "i"):
            if not isinstance(x, (dict, list, tuple, collections.deque)):
                raise KeyError(step[1])
            base = next(b for b in (dict, list, tuple, collections.deque) if isinstance(x, b))
            x = base.__getitem__(x, step[1])
        elif isinstance(x, types.MethodType):
            x = x.__self__
        else:
            raise KeyError("__self__")
    return x


# -- snapshot / restore ----------------------------------------------------------------------------------
