"""The Python state of an env found without declarations: the whole object graph reachable from it.

`GraphState(root)` walks every object reachable from `root` (wrappers, nested envs, robots, controllers,
samplers, caches, spaces...) breadth first, giving each its first path (`.env.robots[0].controller`), and
classifies it:

- **handle**: a `mujoco.MjModel` / `mujoco.MjData`. Never copied here (the adapter captures MuJoCo's state
  through MuJoCo); the target's own handle at the same path is used.
- **alias**: an ndarray whose memory lies inside a handle's arrays (a view of `MjData.qpos`, dm_control's
  `physics._warnings`): kept as (handle, field, byte offset, shape, strides) and re-linked to the target's
  handle at a restore, never copied as a value.
- **opaque**: what cannot or must not be copied: GL and render contexts and other classes with `__del__`
  (a copy would free the original's resources), MuJoCo's other C structs, locks, weak references, file and
  socket objects, closures and local functions or classes (not importable in another process). The
  target's own object at the same path is used; the walk still looks inside for handles.
- **generator**: numpy `Generator` / `RandomState` / `BitGenerator` and `random.Random`: restored in place
  (the target's generator at the same path takes the saved state, so whoever else holds it sees it too).
- **object**: any other instance with a `__dict__` or `__slots__`: its attributes are saved, and a restore
  rewrites the target object at the same path (same type) in place, so identity is kept for whoever holds
  it (the adapter, the user, a Ray actor); objects rebuilt at reset, or at paths the target lacks, are made
  fresh. Attributes absent at the snapshot are removed.
- everything else (containers, arrays, scalars, strings, module-level functions, an XML element) is saved by
  value with `pickle` (views of another Python array stay views of its copy).

`snapshot()` gives bytes (one pickle: the paths, the states), so the state fits a fixed-size capsule buffer
and travels to another process; `restore(blob)` applies them to this graph. The global `numpy.random` and
`random` states are part of it (some suites seed those). `dump()` lists every value by path, for the
diagnostics that name what a restore did not bring back.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import pickle
import random
import sys
import types
from dataclasses import dataclass
from typing import Any

import numpy as np

from capsule_rollout.envs.graph_codec import Pickler, interned, safe_loads, type_key, type_of
from capsule_rollout.envs.graph_codec import SafeUnpickler as _Unpickler
from capsule_rollout.envs.graph_handles import _Aliases, alias_view
from capsule_rollout.envs.graph_walk import (  # noqa: F401 - the walk is part of this module's API
    HANDLE_TYPES,
    Node,
    Path,
    _children,
    _slots,
    classify,
    fmt,
    resolve,
    walk,
)


class GraphStateError(ValueError):
    """The env's Python state cannot be captured as found; the message names the path and what to do."""


# -- snapshot / restore ----------------------------------------------------------------------------------

def _state_of(obj: Any) -> tuple[dict | None, dict, Any]:
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


def _apply_state(obj: Any, state: tuple[dict | None, dict, Any]) -> None:
    d, slots, items = state
    if d is not None:
        own = obj.__dict__
        # an attribute that holds an opaque object the target lacks keeps the target's own value
        # attribute names interned, as Python interns them when it sets an attribute (a capsule's bytes then
        # come out the same from a restored object as from the original)
        new = {sys.intern(k) if type(k) is str else k: own[k] if _holds_missing(v) else v
               for k, v in d.items() if not _holds_missing(v) or k in own}
        own.clear()
        own.update(new)
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


def _generator_state(g: Any) -> Any:
    if isinstance(g, np.random.Generator):
        return g.bit_generator.state
    if isinstance(g, np.random.RandomState):
        return g.get_state(legacy=False)
    if isinstance(g, np.random.BitGenerator):
        return g.state
    return g.getstate()


def _set_generator_state(g: Any, state: Any) -> None:
    if isinstance(g, np.random.Generator):
        g.bit_generator.state = state
    elif isinstance(g, np.random.RandomState):
        g.set_state(state)
    elif isinstance(g, np.random.BitGenerator):
        g.state = state
    else:
        g.setstate(state)


def _new_generator(kind: type, state: Any) -> Any:
    if issubclass(kind, np.random.Generator):
        g = kind(getattr(np.random, state["bit_generator"])())
    elif issubclass(kind, np.random.BitGenerator):
        g = kind()
    else:
        g = kind()
    _set_generator_state(g, state)
    return g


@dataclass
class _Plan:
    """The paths of a snapshot and what sits at each (pickled first, so a restore resolves them all before any
    state is applied)."""

    refs: list[tuple[Path, str, str]]  # handles and opaque objects: path, type name, kind
    objects: list[tuple[Path | None, str]]  # paired objects: path, class as "module:qualname"
    generators: list[tuple[Path | None, type]]
    aliases: list[tuple[int, str, int, tuple, tuple, str]]  # (ref index of the handle, field, offset, ...)
    views: list[tuple[int, int, tuple, tuple, str, bool]]  # (base index, offset, shape, strides, dtype, writeable)
    statics: list[Path]  # large arrays holding what they held when the env was built: by path, not by value


class GraphState:
    """The Python state reachable from `root`, captured and restored without declarations.

    `exclude`: attribute names never captured (their values are left as the target has them), e.g. a
    renderer a suite keeps; `root` itself is the outermost env.
    """

    STATIC_BYTES = 65536
    """Arrays this large that still hold their values from when the env was built (observation spaces'
    bounds, a suite's tables) are saved by path, not by value, once `remember_static` has recorded them."""

    def __init__(self, root: Any, *, exclude: tuple[str, ...] = (), global_rngs: bool = True) -> None:
        self.root, self.exclude, self.global_rngs = root, frozenset(exclude), global_rngs
        self._aliases = _Aliases()
        self._static: dict[Path, np.ndarray] = {}
        self._known: frozenset[str] | None = None  # classes of the graph, by `type_key`

    def remember_static(self) -> str:
        """Record the large arrays the env holds now (call it right after building the env); returns a digest
        of them, for the fingerprint: a capsule refers to them by path, so its target must hold the same."""
        digest = hashlib.blake2b(digest_size=16)
        graph = self.nodes()
        handles = [(0, n.obj) for n in graph.values() if n.kind == "handle"]
        self._static = {}
        for node in graph.values():
            obj = node.obj
            if (node.kind == "array" and node.path is not None and obj.nbytes >= self.STATIC_BYTES
                    and obj.dtype != object and self._aliases.find(obj, handles) is None):
                self._static[node.path] = obj.copy()
                digest.update(repr(node.path).encode())
                digest.update(np.ascontiguousarray(obj).tobytes())
        return digest.hexdigest()

    # -- the walk, with exclusions ---------------------------------------------------------------------
    def nodes(self) -> dict[int, Node]:
        graph = walk(self.root)
        if not self.exclude:
            return graph
        return {i: n for i, n in graph.items() if n.path is None or not any(
            s[0] == "a" and s[1] in self.exclude for s in n.path)}

    def snapshot(self) -> bytes:
        """The state as bytes: the paths of handles, opaque objects, objects and generators, then their states."""
        graph = self.nodes()
        table: dict[int, tuple] = {}
        plan = _Plan([], [], [], [], [], [])
        handles: list[tuple[int, Any]] = []
        for node in graph.values():
            if node.kind in ("handle", "opaque"):
                if node.path is None:
                    if node.kind == "handle":
                        raise GraphStateError(f"a {type(node.obj).__name__} is reachable only through a set")
                    continue  # an opaque object inside a set: pickled by value if it can be, else named below
                table[id(node.obj)] = ("r", len(plan.refs))
                if node.kind == "handle":
                    handles.append((len(plan.refs), node.obj))
                plan.refs.append((node.path, type(node.obj).__qualname__, node.kind))
        bases: list[np.ndarray] = []
        base_index: dict[int, int] = {}
        states: list[Any] = []  # the objects' states, then the generators'
        generator_states: list[Any] = []
        for node in graph.values():
            obj = node.obj
            if node.kind == "array":
                alias = self._aliases.find(obj, handles)
                if alias is not None:
                    table[id(obj)] = ("a", len(plan.aliases))
                    plan.aliases.append(alias)
                    continue
                static = self._static.get(node.path) if node.path is not None else None
                if (static is not None and static.shape == obj.shape and static.dtype == obj.dtype
                        and np.array_equal(static, obj)):
                    table[id(obj)] = ("s", len(plan.statics))
                    plan.statics.append(node.path)
                    continue
                base = obj
                while isinstance(base.base, np.ndarray):
                    base = base.base
                # a view of another array of the graph stays a view of its copy (a base no one else holds,
                # such as the buffer an unpickled array keeps, is not state: the array is copied alone)
                if base is not obj and obj.nbytes and base.dtype != object and id(base) in graph:
                    if id(base) not in base_index:
                        base_index[id(base)] = len(bases)
                        bases.append(base)
                    offset = obj.__array_interface__["data"][0] - base.__array_interface__["data"][0]
                    table[id(obj)] = ("v", len(plan.views))
                    plan.views.append((base_index[id(base)], offset, obj.shape, obj.strides, obj.dtype.str,
                                       bool(obj.flags.writeable)))
            elif node.kind == "object" and node.path is not None:
                table[id(obj)] = ("o", len(plan.objects))
                plan.objects.append((node.path, type_key(type(obj))))
                d, slots, items = _state_of(obj)
                if self.exclude and d is not None:  # left as the target has them
                    d = {k: v for k, v in d.items() if k not in self.exclude}
                states.append((d, slots, items))
            elif node.kind == "generator":
                table[id(obj)] = ("g", len(plan.generators))
                plan.generators.append((node.path, type(obj)))
                generator_states.append(_generator_state(obj))
        base_blob = io.BytesIO()
        pickle.Pickler(base_blob, protocol=5).dump(bases)  # by value (a view's base is never a persistent id)
        body = io.BytesIO()
        glob = (np.random.get_state(legacy=False), random.getstate()) if self.global_rngs else None
        try:
            pickler = Pickler(body, table)
            pickler.dump(interned((states + generator_states, glob), pickler.interned))
        except Exception as exc:  # noqa: BLE001 - name the object that cannot be saved
            raise GraphStateError(self._unpicklable(graph, table, exc)) from None
        memo: dict[int, Any] = {}
        head = pickle.dumps(_Plan(*(interned(getattr(plan, f.name), memo) for f in dataclasses.fields(_Plan))),
                            protocol=5)
        parts = (head, base_blob.getvalue(), body.getvalue())
        return b"".join(len(p).to_bytes(8, "little") + p for p in parts)

    def restore(self, blob: bytes) -> None:
        """Apply a snapshot of this graph (or of one built the same way, in any process) to this graph."""
        parts, at = [], 0
        for _ in range(3):
            n = int.from_bytes(blob[at:at + 8], "little")
            parts.append(blob[at + 8:at + 8 + n])
            at += 8 + n
        plan: _Plan = safe_loads(parts[0])
        bases: list[np.ndarray] = safe_loads(parts[1])
        root, resolved = self.root, {}
        refs = []
        for i, (path, type_name, kind) in enumerate(plan.refs):
            try:
                target = resolve(root, path)
            except (KeyError, IndexError, AttributeError, TypeError):
                target = None
            if kind == "opaque" and (target is None or type(target).__qualname__ != type_name):
                resolved[("r", i)] = MISSING
                refs.append(None)
                continue
            if target is None or type(target).__qualname__ != type_name:
                raise GraphStateError(f"the env has no {type_name} at {fmt(path)} (found "
                                      f"{type(target).__name__}): the capsule was taken from an env built "
                                      "differently")
            resolved[("r", i)] = target
            refs.append(target)
        for i, (h, field, offset, shape, strides, dtype) in enumerate(plan.aliases):
            resolved[("a", i)] = alias_view(refs[h], field, offset, shape, strides, np.dtype(dtype))
        for i, (b, offset, shape, strides, dtype, writeable) in enumerate(plan.views):
            base = bases[b]
            view = np.ndarray(shape, np.dtype(dtype), buffer=base, offset=offset, strides=strides)
            view.flags.writeable = writeable and base.flags.writeable
            resolved[("v", i)] = view
        for i, path in enumerate(plan.statics):
            static = self._static.get(path)
            if static is None:
                raise GraphStateError(f"the env built here holds no array at {fmt(path)} from its construction: the "
                                      "capsule was taken from an env built differently")
            resolved[("s", i)] = static.copy()
        taken: set[int] = set()
        objects = []
        for i, (path, key) in enumerate(plan.objects):
            target = self._paired(path, key, taken)
            if target is None:
                try:
                    kind = type_of(key)
                except LookupError:
                    raise GraphStateError(f"the env built here has no object at {fmt(path)}, and its class {key} is "
                                          "not loaded here: the capsule was taken from an env built differently") from None
                target = kind.__new__(kind)
            resolved[("o", i)] = target
            objects.append(target)
        generators = []
        for i, (path, kind) in enumerate(plan.generators):
            target = self._paired(path, kind, taken)
            resolved[("g", i)] = target  # None: made fresh below, once its state is read
            generators.append(target)
        states, glob = self._load_states(parts[2], resolved)
        n = len(objects)
        fresh: dict[int, Any] = {}
        for i, (_, kind) in enumerate(plan.generators):
            if generators[i] is None:
                fresh[i] = _new_generator(kind, states[n + i])
        if fresh:
            # a generator made fresh must replace the placeholder it was unpickled as: rare (a generator
            # created after the target was built); re-read the states with it resolved
            for i, g in fresh.items():
                resolved[("g", i)] = g
            states, glob = self._load_states(parts[2], resolved)
        for target, state in zip(objects, states[:n]):
            if self.exclude and state[0] is not None:
                own = getattr(target, "__dict__", {})
                state = ({**state[0], **{k: own[k] for k in self.exclude if k in own}}, *state[1:])
            _apply_state(target, state)
        for i, g in enumerate(generators):
            if g is not None:
                _set_generator_state(g, states[n + i])
        if glob is not None:
            np.random.set_state(glob[0])
            random.setstate(glob[1])

    def _load_states(self, data: bytes, resolved: dict[tuple, Any]) -> Any:
        """The states, reading only the classes this env uses (`graph_codec.SafeUnpickler`); those are learnt once
        and again only when a snapshot names one not seen yet (an object the env built since)."""
        for fresh in (False, True):
            if fresh or self._known is None:
                self._known = frozenset(type_key(type(n.obj)) for n in walk(self.root).values())
            try:
                return _Unpickler(data, resolved, self._known).load()
            except pickle.UnpicklingError as exc:
                if fresh or "refused" not in str(exc):
                    raise GraphStateError(str(exc)) from None
        raise AssertionError("unreachable")

    def _paired(self, path: Path | None, kind: type | str, taken: set[int]) -> Any:
        if path is None:
            return None
        try:
            target = resolve(self.root, path)
        except (KeyError, IndexError, AttributeError, TypeError):
            return None
        same = type_key(type(target)) == kind if isinstance(kind, str) else type(target) is kind
        if not same or id(target) in taken:
            return None
        taken.add(id(target))
        return target

    def _unpicklable(self, graph: dict[int, Node], table: dict[int, tuple], exc: Exception) -> str:
        for node in graph.values():
            if id(node.obj) in table or node.kind in ("object", "container", "handle"):
                continue
            try:
                Pickler(io.BytesIO(), table).dump(node.obj)
            except Exception as inner:  # noqa: BLE001
                return (f"the env's Python state cannot be captured: {type(node.obj).__module__}."
                        f"{type(node.obj).__qualname__} at {fmt(node.path)} cannot be saved ({inner}); exclude that "
                        "attribute (CaptureSpec.exclude) if it is not state")
        return f"the env's Python state cannot be captured: {type(exc).__name__}: {exc}"

    # -- diagnostics ------------------------------------------------------------------------------------
    def dump(self) -> dict[str, str]:
        """Every value reachable, by path -> a short digest: arrays (shape, dtype, bytes), scalars, generator
        states, which attributes an object has, aliases (field and offset). Handles' own arrays are left to the
        MjData comparison; opaque objects to their owners."""
        out: dict[str, str] = {}
        graph = self.nodes()
        handles = [(i, n.obj) for i, n in enumerate(graph.values()) if n.kind == "handle"]
        names = {i: fmt(n.path) for i, n in enumerate(graph.values())}
        for node in graph.values():
            if node.path is None:
                continue
            p = fmt(node.path)
            if node.kind == "array":
                alias = self._aliases.find(node.obj, handles)
                if alias is not None:
                    out[p] = f"alias of {names[alias[0]]}.{alias[1]} +{alias[2]} B {alias[3]}"
                elif node.obj.dtype == object:
                    out[p] = f"array object {node.obj.shape} {node.obj!r}"[:200]
                else:
                    digest = hashlib.blake2b(np.ascontiguousarray(node.obj).tobytes(), digest_size=8).hexdigest()
                    out[p] = f"array {node.obj.dtype} {node.obj.shape} {digest}"
            elif node.kind == "generator":
                out[p] = f"generator {hashlib.blake2b(repr(_generator_state(node.obj)).encode(), digest_size=8).hexdigest()}"
            elif node.kind in ("object", "container"):
                if node.kind == "object":
                    out[p + " (attributes)"] = ",".join(sorted(getattr(node.obj, "__dict__", {}) or ()))
                elif not isinstance(node.obj, dict):  # a sequence or set: its plain items as one value
                    plain = [repr(v) for v in node.obj if classify(v) == "atomic"]
                    if isinstance(node.obj, (set, frozenset)):
                        plain.sort()
                    digest = hashlib.blake2b("\n".join(plain).encode(), digest_size=8).hexdigest()
                    out[p + " (items)"] = f"{len(node.obj)} items {digest}"
                    continue
                else:
                    out[p + " (items)"] = str(len(node.obj))
                for step, v in _children(node.obj, node.kind):
                    if step is not None and classify(v) == "atomic" and not isinstance(
                            v, (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)):
                        out[fmt((*node.path, step))] = f"{type(v).__name__} {v!r}"[:200]
            elif node.kind == "value":
                try:
                    digest = hashlib.blake2b(pickle.dumps(node.obj), digest_size=8).hexdigest()
                    out[p] = f"{type(node.obj).__name__} {digest}"
                except Exception:  # noqa: BLE001 - not comparable by value
                    continue
        return out


def differing_paths(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Paths whose value differs between two dumps (or that one lacks), shortest first (causes before the
    arrays inside them)."""
    keys = set(before) | set(after)
    return sorted((k for k in keys if before.get(k) != after.get(k)), key=lambda k: (k.count(".") + k.count("["), k))
