"""The Python state of an object found without declarations: the whole object graph reachable from it (an
env: `envs.object_graph`; a policy object: `policies.infer_policy`).

`GraphState(root)` walks every object reachable from `root` (wrappers, nested envs, robots, controllers,
samplers, caches, spaces, a policy's queues and histories...) breadth first, giving each its first path
(`.env.robots[0].controller`), and classifies it:

- **handle**: an object of one of `handles`' types (an env's `mujoco.MjModel` / `mujoco.MjData`). Never copied
  here (the env adapter captures MuJoCo's state through MuJoCo); the target's own handle at the same path is used.
- **alias**: an ndarray whose memory lies inside a handle's arrays (a view of `MjData.qpos`, dm_control's
  `physics._warnings`), found by `aliases`: kept as (handle, field, byte offset, shape, strides) and re-linked
  to the target's handle at a restore, never copied as a value.
- **opaque**: what cannot or must not be copied: GL and render contexts and other classes with `__del__`
  (a copy would free the original's resources), MuJoCo's other C structs, locks, weak references, file and
  socket objects, closures and local functions or classes (not importable in another process), and a torch
  module's weights, buffers and submodules (`graph.walk.by_reference`). The target's own object at the same
  path is used; the walk still looks inside for handles (not inside a module's weights).
- **generator**: numpy `Generator` / `RandomState` / `BitGenerator` and `random.Random`: restored in place
  (the target's generator at the same path takes the saved state, so whoever else holds it sees it too).
- **object**: any other instance with a `__dict__` or `__slots__`: its attributes are saved, and a restore
  rewrites the target object at the same path (same type) in place, so identity is kept for whoever holds
  it (the adapter, the user, a Ray actor); objects rebuilt at reset, or at paths the target lacks, are made
  fresh. Attributes absent at the snapshot are removed.
- **struct**: an object of one of `structs`' types (an env's MuJoCo visualization structs: a renderer's camera,
  options, perturbation and scene settings, `envs.object_graph`): its fields are saved and set in place in the
  target's struct at the same path, also inside an opaque object (the renderer that holds it); a target that has
  none there yet (a renderer made at the first render) is listed in `Prepared.missing_structs`, for its owner
  to make.
- everything else (containers, arrays, scalars, strings, module-level functions, an XML element) is saved by
  value (views of another Python array stay views of its copy).

`snapshot()` gives bytes in `capsules.state_codec`'s format, which cannot run code when read (the paths, the
states), so the state fits a fixed-size capsule buffer and travels to another process; `restore(blob)`
applies them to this graph: `prepare(blob)` reads and checks everything and resolves it in this graph, changing
nothing (so a capsule refused there leaves the env as it was), `apply` then sets it. The names a snapshot may
use are `graph.names.GraphNamespace`'s. The global `numpy.random` and
`random` states are part of it (some suites seed those). `dump()` lists every value by path, for the
diagnostics that name what a restore did not bring back.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from typing import Any

import numpy as np

from capsule_rollout.capsules import state_codec
from capsule_rollout.capsules.data_only import HOW_TO_TRUST, DataOnlyCheck, DataOnlyError
from capsule_rollout.capsules.graph.apply import MISSING, NoAliases, NoStructs, apply_state, state_of
from capsule_rollout.capsules.graph.dump import differing_paths, dump_graph, unencodable  # noqa: F401 - differing_paths: API
from capsule_rollout.capsules.graph.names import GraphNamespace, type_key
from capsule_rollout.capsules.graph.read import (  # noqa: F401 - GraphStateError and split are part of this module's API
    BIT_GENERATORS,
    BoundRef,
    Consumed,
    DirectTemplate,
    GraphStateError,
    Plan,
    Prepared,
    Read,
    ReadCache,
    Ref,
    Shared,
    SpareGenerators,
    Template,
    bounded_view,
    checked_plan,
    checked_states,
    compile_direct,
    compile_template,
    fresh_copy,
    generator_state,
    new_generator,
    pids,
    quick_state,
    set_generator_state,
    split,
)
from capsule_rollout.capsules.graph.walk import (  # noqa: F401 - the walk is part of this module's API
    Edges,
    Node,
    Path,
    _children,
    _slots,
    classify,
    fmt,
    resolve,
    walk,
)
from capsule_rollout.capsules.rng_state import GeneratorSetter
from capsule_rollout.capsules.state_codec import StateDecodeError, StateEncodeError, StateNameError, new_instance
from capsule_rollout.capsules.state_reader import Decoder
from capsule_rollout.capsules.trust import Trust, current_trust, safe_type


@dataclasses.dataclass
class Binding:
    """A read snapshot's targets in this graph, with the steps that led to them (`graph.walk.Edges`): a restore of it
    again follows those steps and resolves only what the env replaced since (`GraphState._rebind`)."""

    read: Read
    edges: Edges
    fixed: dict[tuple, Any]  # what the graph gives, by reference: the same at every restore while its paths hold
    objects: list[Any]
    generators: list[Any]
    structs: list[Any]
    targets: dict[int, list[tuple]]  # a place of `edges` -> the references whose target it is
    template: Template | None = None  # `read`'s template compiled against `fixed` (`GraphState._specialized`)
    direct: DirectTemplate | None = None  # the same, set straight into the objects (`GraphState._specialized`)
    moving: set[tuple] = dataclasses.field(default_factory=set)  # references the env replaced: resolved every time


def _targets(plan: Plan, edges: Edges) -> dict[int, list[tuple]]:
    out: dict[int, list[tuple]] = {}
    for kind, entries in (("r", plan.refs), ("o", plan.objects), ("g", plan.generators), ("t", plan.structs)):
        for k, entry in enumerate(entries):
            i = edges.indices.get(entry[0]) if entry[0] is not None else None
            if i is not None:
                out.setdefault(i, []).append((kind, k))
    return out


class GraphState:
    """The Python state reachable from `root`, captured and restored without declarations.

    `exclude`: attribute names never captured (their values are left as the target has them), e.g. a
    renderer a suite keeps; `root` itself is the outermost env. `handles` and `aliases` (an object with
    `find(array, [(ref index, handle)])` and `view(handle, field, offset, shape, strides, dtype)`): what the
    graph's handles are and how an array aliasing one is found and re-linked (`envs.object_graph`).
    `readonly_bytes`: numpy arrays this large that are not writeable are taken by reference, as weights (a
    policy object's: `policies.infer_policy`). `structs` (an object with `types`, `state(obj) -> dict`,
    `check(obj, state)` raising ValueError, `apply(obj, state)`): the values set in place (`envs.object_graph`).
    """

    STATIC_BYTES = 65536
    """Arrays this large that still hold their values from when the env was built (observation spaces'
    bounds, a suite's tables) are saved by path, not by value, once `remember_static` has recorded them."""

    def __init__(self, root: Any, *, exclude: tuple[str, ...] = (), global_rngs: bool = True,
                 handles: tuple[type, ...] = (), aliases: Any = None, readonly_bytes: int | None = None,
                 structs: Any = None) -> None:
        self.root, self.exclude, self.global_rngs = root, frozenset(exclude), global_rngs
        self.readonly_bytes = readonly_bytes
        self.handles = tuple(handles)
        self._aliases = aliases if aliases is not None else NoAliases()
        self._structs = structs if structs is not None else NoStructs()
        self._static: dict[Path, np.ndarray] = {}
        self._known: GraphNamespace | None = None  # the names its capsules may use
        self._seen: set[str] = set()  # names the graph held at its snapshots
        self._reads = ReadCache()  # snapshots read (a restore of the same capsule again makes copies of its states)
        self._bound: dict[int, Binding] = {}  # a read snapshot's targets in this graph, by the `Read`'s id
        self._spares = SpareGenerators()  # to try a capsule's generator states on
        self._generators = GeneratorSetter(set_generator_state)  # a state by copying its words where it can

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
    def nodes(self, refs: set[str] | None = None) -> dict[int, Node]:
        graph = walk(self.root, refs, handles=self.handles, structs=self._structs.types)
        if not self.exclude:
            return graph
        return {i: n for i, n in graph.items() if n.path is None or not any(
            s[0] == "a" and s[1] in self.exclude for s in n.path)}

    def snapshot(self, externals: dict[int, tuple[str, np.ndarray]] | None = None) -> bytes:
        """The state as bytes (`capsules.state_codec`, three parts: the plan of paths, the bases of views, then
        the objects' and generators' states). `externals`: arrays the owner keeps elsewhere in the capsule, by
        id -> (key, the array): one of the graph's arrays that is one of them (the same object, still equal) is
        written as its key, and `prepare(..., externals=)` gives it back (an env's last observation, which a
        wrapper keeps too, held once)."""
        graph = self.nodes(self._seen)  # the names it holds now stay names its capsules may use
        table: dict[int, tuple] = {}
        plan = Plan([], [], [], [], [], [], [], [])
        handles: list[tuple[int, Any]] = []
        for node in graph.values():
            if node.kind == "array" and self.readonly_bytes is not None and node.path is not None and \
                    not node.obj.flags.writeable and node.obj.nbytes >= self.readonly_bytes:
                node.kind = "opaque"  # read-only weights: the target's own (`readonly_bytes`)
            if node.kind in ("handle", "opaque"):
                if node.path is None:
                    if node.kind == "handle":
                        raise GraphStateError(f"a {type(node.obj).__name__} is reachable only through a set")
                    continue  # an opaque object inside a set: saved by value if it can be, else named below
                table[id(node.obj)] = ("r", len(plan.refs))
                if node.kind == "handle":
                    handles.append((len(plan.refs), node.obj))
                plan.refs.append((node.path, type(node.obj).__qualname__, node.kind))
        bases: list[np.ndarray] = []
        base_index: dict[int, int] = {}
        states: list[Any] = []  # the objects' states, then the generators'
        generator_states: list[Any] = []
        struct_states: list[Any] = []
        for node in graph.values():
            obj = node.obj
            if node.kind == "array":
                kept = externals.get(id(obj)) if externals else None
                if kept is not None and kept[1] is obj and obj.dtype != object:
                    table[id(obj)] = ("x", len(plan.externals))
                    plan.externals.append(kept[0])
                    continue
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
                # such as the buffer a decoded array keeps, is not state: the array is copied alone)
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
                d, slots, items = state_of(obj)
                if self.exclude and d is not None:  # left as the target has them
                    d = {k: v for k, v in d.items() if k not in self.exclude}
                states.append((d, slots, items))
            elif node.kind == "generator":
                table[id(obj)] = ("g", len(plan.generators))
                plan.generators.append((node.path, type(obj)))
                generator_states.append(generator_state(obj))
            elif node.kind == "struct" and node.path is not None:
                table[id(obj)] = ("t", len(plan.structs))
                plan.structs.append((node.path, type_key(type(obj))))
                struct_states.append(self._structs.state(obj))
        glob = (np.random.get_state(legacy=False), random.getstate()) if self.global_rngs else None
        try:
            head = state_codec.encode(tuple(getattr(plan, f.name) for f in dataclasses.fields(Plan)))
            base_blob = state_codec.encode(bases)  # by value (a view's base is never a reference)
            body = state_codec.encode((states + generator_states + struct_states, glob), lambda x: table.get(id(x)))
        except StateEncodeError as exc:
            raise GraphStateError(unencodable(graph, table, exc)) from None
        parts = (head, base_blob, body)
        return b"".join(len(p).to_bytes(8, "little") + p for p in parts)

    def restore(self, blob: bytes) -> None:
        """Apply a snapshot of this graph (or of one built the same way, in any process) to this graph."""
        self.apply(self.prepare(blob))

    def prepare(self, blob: bytes | memoryview, externals: Any = None) -> Prepared:
        """Read a snapshot and resolve everything it refers to in this graph, changing nothing yet
        (`GraphStateError` for a snapshot this graph cannot take, or that this reader refuses). `externals(key)`
        gives the array a snapshot wrote by its key (`snapshot(externals=)`), or raises KeyError."""
        blob = bytes(blob)
        data_only = current_trust() is Trust.DATA  # a capsule from elsewhere, restored as data (`capsules.trust`)
        read = self._reads.get(blob)
        if read is None:
            read = self._read(blob)
            self._reads.put(blob, read)
        bound = self._bound.get(id(read)) if not data_only else None
        if bound is not None and bound.read is read and self._rebind(bound):  # resolved in this graph before
            resolved = dict(bound.fixed)
            self._per_restore(read, resolved, externals)
            template = self._specialized(bound)
            objects, generators, n, ng = bound.objects, bound.generators, len(bound.objects), len(bound.generators)
            direct = bound.direct
            if direct is not None:  # the fresh values made now; set into the objects by `apply`
                try:
                    values = direct.values.run(resolved)
                except StateDecodeError as exc:
                    raise GraphStateError(f"the capsule's Python state is refused: {exc}") from None
                rest = direct.rest
                return Prepared(objects, [], generators, rest[:ng], read.glob, False, bound.structs, rest[ng:], (),
                                (direct, values))
            states, glob = self._states(read, resolved, template)
            return Prepared(objects, states[:n], generators, states[n:n + ng], glob, False, bound.structs,
                            states[n + ng:], ())
        plan = read.plan
        edges = Edges(self.root)
        resolved: dict[tuple, Any] = {}
        refs = self._resolve_refs(plan, edges, resolved)
        self._resolve_aliases(plan, refs, resolved)
        taken: set[int] = set()
        objects, made = self._resolve_objects(plan, edges, taken, resolved, data_only)
        generators = []
        for i, (path, kind) in enumerate(plan.generators):
            target = self._paired(path, kind, taken, edges)
            resolved[("g", i)] = target  # None: made fresh below, once its state is read
            generators.append(target)
        structs, missing = [], []
        for i, (path, key) in enumerate(plan.structs):
            target = self._paired(path, key, taken, edges)
            resolved[("t", i)] = MISSING if target is None else target
            structs.append(target)
            if target is None:
                missing.append(fmt(path))
        fixed = dict(resolved)  # what the graph gives: the same at every restore while its paths hold
        self._per_restore(read, resolved, externals)
        states, glob = self._states(read, resolved)
        n = len(objects)
        fresh: dict[int, Any] = {}
        for i, (_, kind) in enumerate(plan.generators):
            if generators[i] is None:  # numpy's or random's own class, made by its constructor, set by its state API
                fresh[i] = new_generator(kind, states[n + i])
                generators[i] = fresh[i]
        if fresh:
            # a generator made fresh must replace the placeholder it was read as: rare (a generator created
            # after the target was built); read the states again with it resolved
            for i, g in fresh.items():
                resolved[("g", i)] = g
            states, glob = self._states(read, resolved)
        ng = len(plan.generators)
        self._check_states(structs, objects, generators, states, n, ng)
        absent = any(v is MISSING for v in resolved.values())
        if data_only:
            self._check_data_only(read, resolved, objects, states, glob)
        if not (made or fresh or absent or missing):  # every target found in the graph: bind them for next time
            if len(self._bound) >= self._reads.size:
                self._bound.pop(next(iter(self._bound)))
            self._bound[id(read)] = Binding(read, edges, fixed, objects, generators, structs, _targets(plan, edges))
        return Prepared(objects, states[:n], generators, states[n:n + ng], glob, absent, structs, states[n + ng:],
                        tuple(missing))

    def _resolve_refs(self, plan, edges: Edges, resolved: dict) -> list:
        """The objects the snapshot refers to by path (kept by reference: handles, opaque objects), each checked
        to be of the class it names; an opaque one the env does not hold is left MISSING."""
        refs = []
        for i, (path, type_name, kind) in enumerate(plan.refs):
            try:
                target = edges.resolve(path)
            except (KeyError, IndexError, AttributeError, TypeError):
                target = None
            if kind == "opaque" and (target is None or type(target).__qualname__ != type_name):
                resolved[("r", i)] = MISSING
                refs.append(None)
                continue
            if target is None or type(target).__qualname__ != type_name or (
                    kind == "handle") != isinstance(target, self.handles):
                raise GraphStateError(f"the env has no {type_name} at {fmt(path)} (found "
                                      f"{type(target).__name__}): the capsule was taken from an env built "
                                      "differently")
            resolved[("r", i)] = target
            refs.append(target)
        return refs

    def _resolve_aliases(self, plan, refs: list, resolved: dict) -> None:
        """Each alias's view of the same field of this graph's handle."""
        for i, (h, field, offset, shape, strides, dtype) in enumerate(plan.aliases):
            if h >= len(refs) or not isinstance(refs[h], self.handles):
                raise GraphStateError(f"the capsule's Python state is refused: alias {i} names no MuJoCo handle")
            try:
                resolved[("a", i)] = self._aliases.view(refs[h], field, offset, shape, strides, dtype)
            except ValueError as exc:
                raise GraphStateError(f"the capsule's Python state is refused: {exc}") from None

    def _resolve_objects(self, plan, edges: Edges, taken: set[int], resolved: dict,
                         data_only: bool) -> tuple[list, bool]:
        """Each object whose state the snapshot holds: the graph's own at its path, or one made of its class where
        the graph holds none (never as data: `Trust.DATA`); (the objects, whether any was made)."""
        namespace = self._namespace()
        objects, made = [], False
        for i, (path, key) in enumerate(plan.objects):
            target = self._paired(path, key, taken, edges)
            if target is None:
                made = True
                module, _, qualname = key.partition(":")
                try:
                    kind = namespace.lookup(module, qualname, "class")
                    if data_only and not safe_type(kind):
                        raise GraphStateError(
                            f"the capsule makes a {key} at {fmt(path)}, where the env built here holds none of that "
                            f"class: a capsule restored as data (--trust) never makes an instance the env does not "
                            f"hold. {HOW_TO_TRUST}")
                    target = new_instance(kind)
                except StateDecodeError as exc:
                    raise GraphStateError(f"the env built here has no object at {fmt(path)}, and its class {key} "
                                          f"cannot be made here ({exc})") from None
            resolved[("o", i)] = target
            objects.append(target)
        return objects, made

    def _check_states(self, structs: list, objects: list, generators: list, states: list, n: int, ng: int) -> None:
        """Each state read fits what it goes into: a struct's fields, an object's attributes or items, a
        generator's kind."""
        for target, state in zip(structs, states[n + ng:]):
            if target is not None:
                try:
                    self._structs.check(target, state)
                except ValueError as exc:
                    raise GraphStateError(f"the capsule's Python state is refused: {exc}") from None
        for target, (d, _, items) in zip(objects, states[:n]):
            if d is not None and not isinstance(getattr(target, "__dict__", None), dict) or items is not None and \
                    not isinstance(target, dict if isinstance(items, dict) else list):
                raise GraphStateError(f"the capsule's Python state is refused: a {type(target).__qualname__} given "
                                      "attributes or items it cannot hold")
        for g, state in zip(generators, states[n:n + ng]):
            bits = g.bit_generator if isinstance(g, np.random.Generator) else g
            if isinstance(bits, np.random.BitGenerator) and state.get("bit_generator") != type(bits).__name__:
                raise GraphStateError(f"the capsule's Python state is refused: a {state.get('bit_generator')!r} "
                                      f"state for a {type(bits).__name__} generator")

    def _rebind(self, bound: Binding) -> bool:
        """Follow a binding's steps in the graph as it is now: True when its targets are still there, or where the env
        replaced one by an object of the same class (not a MuJoCo handle nor a struct, and paired with no other
        target), now bound to that one; False when the snapshot must be resolved again from the start."""
        moved = bound.edges.changes()
        if moved is None:
            return False
        changed = [(i, x) for i, x in moved.items() if i in bound.targets]
        if not changed:
            return True
        objects, generators, fixed = list(bound.objects), list(bound.generators), dict(bound.fixed)
        refs = bound.read.plan.refs
        for i, x in changed:
            if type(x) is not type(bound.edges.objects[i]):
                return False
            for kind, k in bound.targets[i]:
                if kind == "o":
                    objects[k] = x
                elif kind == "g":
                    generators[k] = x
                elif kind != "r" or refs[k][2] != "opaque":
                    return False
                fixed[(kind, k)] = x
        paired = [t for t in (*objects, *generators, *bound.structs) if t is not None]
        if len({id(t) for t in paired}) != len(paired):
            return False
        pids = {pid for i, _ in changed for pid in bound.targets[i]}
        bound.objects, bound.generators, bound.fixed = objects, generators, fixed
        for i, x in changed:
            bound.edges.objects[i] = x
        bound.moving |= pids
        if any(t is not None and t.fixed & pids for t in (bound.template, bound.direct)):
            bound.template = bound.direct = None  # one holds an object the env replaced: compiled again without it
        return True

    def _specialized(self, bound: Binding) -> Template | None:
        """The binding's template, compiled at its first restore through the binding against the objects it binds
        (shared by every restore, with the tuples and bound methods holding them) less those the env has replaced
        (resolved at every restore), and again when the env replaces one the template holds."""
        if bound.template is None:
            read = bound.read
            fixed = {k: v for k, v in bound.fixed.items() if k not in bound.moving}
            try:
                bound.template = compile_template(read.value, read.built, fixed) if read.template else None
            except StateDecodeError as exc:
                raise GraphStateError(f"the capsule's Python state is refused: {exc}") from None
            if bound.template is None:
                bound.template = read.template  # nothing to compile: the read snapshot's own
            bound.direct = None
            if bound.template is not None and not self.exclude and not any(_slots(type(o)) for o in bound.objects):
                try:
                    bound.direct = compile_direct(read.value, read.built, fixed, len(bound.objects))
                except StateDecodeError as exc:
                    raise GraphStateError(f"the capsule's Python state is refused: {exc}") from None
        return bound.template

    @staticmethod
    def _check_data_only(read: Read, resolved: dict[tuple, Any], objects: list[Any], states: list[Any],
                         glob: tuple | None) -> None:
        """Every place the snapshot sets holds data, or what the env built here holds there (`data_only`)."""
        check = DataOnlyCheck({id(v) for v in resolved.values()})
        plan, n, ng = read.plan, len(objects), len(read.plan.generators)
        try:
            for target, state, (path, _) in zip(objects, states[:n], plan.objects):
                check.check_object(target, state, path)
            for state, (path, _) in zip(states[n:n + ng], plan.generators):
                check.check_data(state, f"the state of the generator at {fmt(path)}")
            for state, (path, _) in zip(states[n + ng:], plan.structs):
                check.check_data(state, fmt(path))
            check.check_data(glob, "the global numpy.random and random states")
        except DataOnlyError as exc:
            raise GraphStateError(str(exc)) from None

    def _per_restore(self, read: Read, resolved: dict[tuple, Any], externals: Any) -> None:
        """What a restore resolves afresh every time: views of fresh copies of the view bases, the owner's
        externals, copies of the static arrays."""
        plan = read.plan
        bases = [fresh_copy(b) for b in read.bases] if plan.views else []  # the reader's arrays, kept aside
        for i, (b, offset, shape, strides, dtype, writeable) in enumerate(plan.views):
            view = bounded_view(bases[b], offset, shape, strides, dtype)  # checked when read
            view.flags.writeable = writeable and bases[b].flags.writeable
            resolved[("v", i)] = view
        for i, key in enumerate(plan.externals):
            try:
                resolved[("x", i)] = externals(key)
            except (KeyError, TypeError):
                raise GraphStateError(f"the capsule's Python state refers to {key!r}, which this owner does not keep "
                                      "beside it") from None
        for i, path in enumerate(plan.statics):
            static = self._static.get(path)
            if static is None:
                raise GraphStateError(f"the env built here holds no array at {fmt(path)} from its construction: the "
                                      "capsule was taken from an env built differently")
            resolved[("s", i)] = static.copy()

    def _read(self, blob: bytes) -> Read:
        """A snapshot read and checked once (nothing resolved in the env yet): its plan, and its view bases and
        states kept for fresh copies at every restore (`graph.read`)."""
        parts = split(blob)
        namespace = self._namespace()
        try:
            plan = Plan(*checked_plan(state_codec.decode(parts[0], namespace)))
            reader = Decoder(parts[1], namespace)
            bases = reader.decode()
        except StateDecodeError as exc:
            raise GraphStateError(f"the capsule's Python state is refused: {exc}") from None
        if not isinstance(bases, list) or not all(type(b) is np.ndarray for b in bases):
            raise GraphStateError("the capsule's Python state is refused: its view bases are not arrays")
        for i, (b, offset, shape, strides, dtype, _) in enumerate(plan.views):
            if b >= len(bases):
                raise GraphStateError(f"the capsule's Python state is refused: view {i} of base {b}, which it lacks")
            try:
                bounded_view(bases[b], offset, shape, strides, dtype)
            except ValueError as exc:
                raise GraphStateError(f"the capsule's Python state is refused: {exc}") from None
        defined = pids(plan)

        def reference(pid: Any) -> Ref:
            try:
                if pid in defined:
                    return Ref(pid)
            except TypeError:
                pass
            raise StateDecodeError(f"the snapshot refers to {pid!r}, which it does not define")

        def bind(owner: Any, name: str) -> Any:
            if type(owner) is not Ref:
                state_codec.bound_method(owner, name)  # refused here if its owner has no such method
            return BoundRef(owner, name)  # made again with its owner at every restore (`Template`)

        for fresh_names in (False, True):
            reader = Decoder(parts[2], self._namespace(fresh_names), reference)
            reader.bind = bind
            try:
                value = reader.decode()
                break
            except StateNameError as exc:  # a name not seen yet: looked for once more in the graph as it is now
                if fresh_names:
                    raise GraphStateError(f"the capsule's Python state is refused: {exc}") from None
            except StateDecodeError as exc:
                raise GraphStateError(f"the capsule's Python state is refused: {exc}") from None
        n, ng = len(plan.objects), len(plan.generators)
        states, glob = checked_states(value, n, ng, len(plan.structs))
        self._spares.check(plan.generators, states[n:n + ng], glob)
        # generator states are only read by the generators they are set into: kept once, shared by every restore
        # (an MT19937 key as a list: numpy sets a 624-word key from a list 14x faster than from an array)
        glob = None if glob is None else (quick_state(glob[0]), glob[1])
        # what a restore only reads is given as it is (a generator's state, a struct's fields, the dicts of an
        # object's attributes holding nothing made afresh): the rest is copied from the template at every restore
        kept = [*((Consumed(d), Consumed(slots), Consumed(items)) for d, slots, items in states[:n]),
                *(Shared(quick_state(x)) for x in states[n:n + ng]), *(Shared(x) for x in states[n + ng:])]
        try:
            template = compile_template(kept, reader.built)
        except StateDecodeError as exc:
            raise GraphStateError(f"the capsule's Python state is refused: {exc}") from None
        return Read(plan, bases, template, parts[2], kept, reader.built, value, glob)

    def _states(self, read: Read, resolved: dict[tuple, Any],
                template: Template | None = None) -> tuple[list, tuple | None]:
        """Fresh copies of a read snapshot's states, its references resolved in this graph (`template`: one compiled
        against this graph's objects, `_specialized`)."""
        template = template or read.template
        try:
            if template is not None:
                return template(resolved), read.glob
            value = state_codec.decode(read.raw_states, self._namespace(), resolved.__getitem__)
        except StateDecodeError as exc:
            raise GraphStateError(f"the capsule's Python state is refused: {exc}") from None
        return checked_states(value, len(read.plan.objects), len(read.plan.generators), len(read.plan.structs))

    def apply(self, prepared: Prepared) -> None:
        """Set this graph to a prepared snapshot (`prepare`)."""
        if prepared.direct is not None:  # each object's attributes set from the template and the fresh values
            direct, values = prepared.direct
            for target, (shared, fresh) in zip(prepared.objects, direct.attributes):
                own = target.__dict__
                own.clear()
                own.update(shared)
                for k, slot in fresh:
                    own[k] = values[slot]
        for target, state in zip(prepared.objects, prepared.states):
            if self.exclude and state[0] is not None:
                own = getattr(target, "__dict__", {})
                state = ({**state[0], **{k: own[k] for k in self.exclude if k in own}}, *state[1:])
            apply_state(target, state, prepared.missing)
        set_generator = self._generators.set
        for g, state in zip(prepared.generators, prepared.generator_states):
            set_generator(g, state)
        for t, state in zip(prepared.structs, prepared.struct_states):
            if t is not None:
                self._structs.apply(t, state)
        if prepared.glob is not None:
            self._generators.set_globals(*prepared.glob)

    def _namespace(self, fresh: bool = False) -> GraphNamespace:
        """The names this graph's capsules may use: those it holds now, and those it held at any snapshot this
        process took of it (a value it holds only at some steps: dm_env's `StepType` in a dm_control env's last
        time step); learnt once, and again when a snapshot names one not seen yet (an object the env built
        since)."""
        if fresh or self._known is None:
            refs: set[str] = set()
            walk(self.root, refs, self.handles, self._structs.types)
            self._known = GraphNamespace(frozenset(refs | self._seen))
        return self._known

    def _paired(self, path: Path | None, kind: type | str, taken: set[int], edges: Edges | None = None) -> Any:
        if path is None:
            return None
        try:
            target = resolve(self.root, path) if edges is None else edges.resolve(path)
        except (KeyError, IndexError, AttributeError, TypeError):
            return None
        same = type_key(type(target)) == kind if isinstance(kind, str) else type(target) is kind
        if not same or id(target) in taken:
            return None
        taken.add(id(target))
        return target

    # -- diagnostics ------------------------------------------------------------------------------------
    def dump(self) -> dict[str, str]:
        """Every value reachable, by path -> a short digest (`graph.dump.dump_graph`)."""
        return dump_graph(self.nodes(), self.handles, self._structs, self._aliases)
