"""The walk of an object graph (`capsules.graph.state`): every object reachable from a root (an env, a policy
object), breadth first, with its first path, and what kind of thing each is (handle, opaque, generator, array,
struct, object, container, value; see `graph.state`'s docstring for what each kind means to a capsule).

`handles` are the types whose objects are never copied but must be there (an env's MuJoCo `MjModel` / `MjData`:
`envs.object_graph`); `structs` the types whose objects are values set in place (MuJoCo's visualization structs:
a renderer's camera and options, `envs.object_graph`). A torch module's weights, buffers and submodules are
taken by reference (opaque): a capsule holds the module's own attributes (an action queue, a history), never its
weights."""

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

import numpy as np

from capsule_rollout.capsules.graph.names import OPAQUE_MODULES, ref_key
from capsule_rollout.capsules.state_codec import _slot_names as _slots

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


def _has_del(t: type) -> bool:
    return any("__del__" in vars(k) for k in t.__mro__ if k is not object)


def _python_call(t: type) -> bool:
    return any(isinstance(vars(k).get("__call__"), types.FunctionType) for k in t.__mro__)


TORCH_INTERNALS = frozenset({
    "_parameters", "_buffers", "_modules", "_non_persistent_buffers_set", "_backward_pre_hooks", "_backward_hooks",
    "_is_full_backward_hook", "_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
    "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_state_dict_hooks", "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks"})
"""A torch module's own bookkeeping: its weights, buffers, submodules and hooks, taken by reference."""


def by_reference(obj: Any) -> frozenset[str]:
    """Attribute names of `obj` whose values a capsule takes by reference (the target's own): a torch module's
    internals."""
    torch = __import__("sys").modules.get("torch")
    if torch is not None and isinstance(obj, torch.nn.Module):
        return TORCH_INTERNALS
    return frozenset()


def classify(x: Any, handles: tuple[type, ...] = (), structs: tuple[type, ...] = ()) -> str:
    """handle | struct | atomic | opaque | generator | array | method | container | object | value."""
    if handles and isinstance(x, handles):
        return "handle"
    if structs and isinstance(x, structs):
        return "struct"
    if isinstance(x, ATOMIC_TYPES):
        return "atomic"
    t = type(x)
    if isinstance(x, types.FunctionType):
        # a closure points at its owner, a lambda or local function cannot be named in another process
        return "opaque" if x.__closure__ or "<" in x.__qualname__ else "atomic"
    if isinstance(x, GENERATOR_TYPES):
        return "generator"
    if isinstance(x, np.ndarray):
        return "array"
    if t.__module__.startswith("torch") and t.__name__ in ("Tensor", "Parameter", "Generator"):
        return "value"  # its data is not in its __dict__: saved whole
    if isinstance(x, types.MethodType):
        return "method"
    module = t.__module__ or ""
    if "<locals>" in t.__qualname__:
        return "opaque"  # a class made inside a function (dm_control's named indexers): not importable elsewhere
    if (isinstance(x, LOCK_TYPES) or isinstance(x, (weakref.ref, types.GeneratorType, types.CoroutineType))
            or module.split(".")[0] in OPAQUE_MODULES):
        return "opaque"
    if callable(x) and not isinstance(x, type) and not _python_call(t) and not hasattr(x, "__dict__"):
        return "atomic"  # C functions, method wrappers, numpy ufuncs: saved by name
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


def walk(root: Any, refs: set[str] | None = None, handles: tuple[type, ...] = (),
         structs: tuple[type, ...] = ()) -> dict[int, Node]:
    """Every non-atomic object reachable from `root`, breadth first, with its first path; `refs` (when given)
    gathers the `graph.names.ref_key` of every class, function and module met (the names a capsule of this
    graph may use). What `by_reference` names is an opaque node the walk does not enter."""
    seen: dict[int, Node] = {}
    queue = collections.deque([(root, (), False)])
    while queue:
        x, path, held = queue.popleft()
        if id(x) in seen:
            continue
        kind = classify(x, handles, structs)
        if held and kind != "atomic":
            kind = "opaque"
        if refs is not None:
            ref = x if kind == "atomic" and isinstance(x, REF_TYPES) else type(x)
            key = ref_key(ref)
            if key is not None:
                refs.add(key)
        if kind == "atomic":
            continue
        seen[id(x)] = Node(x, kind, path)
        if held or kind in ("handle", "struct", "array", "generator", "value"):
            continue
        internal = by_reference(x) if kind == "object" else frozenset()
        for step, v in _children(x, kind):
            queue.append((v, None if path is None or step is None else (*path, step),
                          bool(internal) and step is not None and step[0] == "a" and step[1] in internal))
    return seen


def resolve(root: Any, path: Path) -> Any:
    """The object at `path` from `root`. A path may come from a capsule file: only an instance's own
    attributes and declared slots, the items of plain containers and a method's owner are followed (no
    property or `__getitem__` of the env's classes runs); KeyError otherwise."""
    x = root
    for step in path:
        x = follow(x, step)
    return x


def follow(x: Any, step: tuple) -> Any:
    """One step of a path (`resolve`) from `x`."""
    kind = step[0]
    if kind == "a":
        d = getattr(x, "__dict__", None)
        if isinstance(d, dict) and step[1] in d:
            return d[step[1]]
        if step[1] in _slots(type(x)):
            return object.__getattribute__(x, step[1])
        raise KeyError(step[1])
    if kind in ("k", "i"):
        if not isinstance(x, (dict, list, tuple, collections.deque)):
            raise KeyError(step[1])
        base = next(b for b in (dict, list, tuple, collections.deque) if isinstance(x, b))
        return base.__getitem__(x, step[1])
    if isinstance(x, types.MethodType):
        return x.__self__
    raise KeyError("__self__")


_MISSING = object()


class Edges:
    """The steps from `root` to a set of objects, each distinct step once (paths share their prefixes): `resolve(path)`
    as `resolve` does, remembering each step (`index(path)`: the place of the object it leads to); `changes()` follows
    every remembered step again from the root, as the graph is now, and names the places whose object is not the one
    remembered (an object the env replaced, and any container, which a restore makes afresh: the steps out of it
    are followed as it is now)."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self.indices: dict[Path, int] = {(): 0}  # a path -> its place
        self.objects: list[Any] = [root]  # the object remembered at each place
        self.steps: list[tuple[int, tuple]] = []  # place i + 1 is (the place it is followed from, the step)

    def resolve(self, path: Path) -> Any:
        return self.objects[self.index(path)]

    def index(self, path: Path) -> int:
        i = self.indices.get(path)
        if i is not None:
            return i
        parent = self.index(path[:-1])
        x = follow(self.objects[parent], path[-1])
        self.objects.append(x)
        self.steps.append((parent, path[-1]))
        i = self.indices[path] = len(self.objects) - 1
        return i

    def changes(self) -> dict[int, Any] | None:
        """Place -> the object there now, where it is not the one remembered ({} when none is); None when a
        remembered path no longer leads anywhere."""
        objects, now, moved = self.objects, [self.root], {}
        append = now.append
        try:
            for (parent, step), old in zip(self.steps, objects[1:]):
                at = now[parent]
                if step[0] == "a":  # an attribute in the instance's own dict: `follow` for anything else
                    try:
                        d = at.__dict__
                    except AttributeError:
                        d = None
                    x = d.get(step[1], _MISSING) if type(d) is dict else _MISSING
                elif type(at) is dict or type(at) is list:  # a plain container: no __getitem__ of the env's runs
                    x = at[step[1]]
                else:
                    x = _MISSING
                if x is _MISSING:
                    x = follow(at, step)
                append(x)
                if x is not old:
                    moved[len(now) - 1] = x
        except (KeyError, IndexError, AttributeError, TypeError):
            return None
        return moved


# -- snapshot / restore ----------------------------------------------------------------------------------
