"""Templates: fresh copies of what `state_reader.Decoder` built from a snapshot's states, made at every restore
without reading its bytes again (`Template`, `compile_template`), and the same compiled to be set straight into the
objects they belong to (`DirectTemplate`, `compile_direct`); the markers the reader leaves for what a restore resolves
or shares (`Ref`, `BoundRef`, `Shared`, `Consumed`). Nothing here is pickle: no value is ever made by a function a
template names; what cannot change is shared, arrays and containers are copied from templates, instances made as the
reader made them.
"""

from __future__ import annotations

import collections
import enum
import sys
import types
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from capsule_rollout.capsules import state_codec
from capsule_rollout.capsules.state_codec import StateDecodeError


class Ref(NamedTuple):
    """A reference to an object of the env (`pid` as the plan numbers it), before a restore resolves it."""

    pid: tuple


class Shared(NamedTuple):
    """A value every restore is given as it is, never copied: one only read by what applies it (a generator's state,
    which numpy copies as it sets it; a struct's fields, copied into the struct)."""

    value: Any


class Consumed(NamedTuple):
    """A dict or list only read by what applies it (an object's attributes, copied into its own `__dict__`): given as
    it is when what it holds is shared, made afresh (never one with anything else of the snapshot) when it holds a
    value made at every restore."""

    value: Any


class BoundRef(NamedTuple):
    """A bound method as the reader found it (its owner: an object of the env as a `Ref`, or a value the reader
    built), made again with its owner at every restore (`Template`)."""

    owner: Any
    name: str


# -- templates: fresh copies of what the reader built, at every restore --------------------------------------------
_SHARED_TYPES = frozenset({type(None), bool, int, float, complex, str, bytes, range, type(Ellipsis),
                           type(NotImplemented)})
_NAMED = (type, types.FunctionType, types.BuiltinFunctionType, types.ModuleType, types.MethodDescriptorType,
          types.WrapperDescriptorType, types.ClassMethodDescriptorType, np.ufunc, np.dtype, enum.Enum)
"""Values found by name (a class, a function, a module, an enum member) or that cannot change (a dtype): the very
object the reader found, shared by every restore."""
_COPIED = frozenset({list, dict, collections.OrderedDict, collections.defaultdict, collections.deque, bytearray})
"""Containers a restore makes by copying a template that holds their shared items (`.copy()` keeps a deque's
`maxlen` and a defaultdict's factory), the others set in it after."""

# a template's steps: (code, slot, argument)
_COPY, _BUILD, _TUPLE, _PATCH, _REF, _COPY_READONLY, _METHOD, _NEW, _FILL, _SET, _PAIRS, _FACTORY, _FLAT, _SUBCLASS, \
    _TENSOR, _TORCH_GEN, _ELEMENT, _CHILDREN = range(18)
_MODIFY = frozenset({_PATCH, _FILL, _PAIRS, _FACTORY, _FLAT, _CHILDREN})
"""Steps that change a value an earlier step made (in its slot)."""


class _Unsupported(Exception):
    """A value templates do not copy (its snapshot is then read from its bytes at every restore)."""


class Template:
    """Fresh copies of a value `state_reader.Decoder` built, made at every restore without reading its bytes again:
    what cannot change shared with the template (numbers, strings, dtypes, classes, functions and modules found by
    name, tuples and frozensets of those, bound methods of those, and the env's objects the template was compiled
    against: `fixed`), arrays copied from their templates, containers copied from a template that holds their
    shared items and then given their fresh ones, instances made as the reader made them (`new_instance`, then their
    attributes, slots and items). References to the env not fixed are resolved at every restore (`resolved`). What
    the reader built once is made once (sharing and cycles kept).

    A template is a list of steps `(code, slot, argument)`, each making one value into its slot (or giving a
    container made earlier what it holds): compiled once (`compile_template`), run by one loop at every restore."""

    def __init__(self, ops: list[tuple], size: int, root: tuple[bool, Any], fixed: frozenset) -> None:
        self.ops, self.size, self.root = ops, size, root
        self.fixed = fixed  # the references it holds as shared objects (`compile_template`'s `fixed`)

    def __call__(self, resolved: dict[tuple, Any]) -> Any:
        live, root = self.root
        return self.run(resolved)[root] if live else root

    def run(self, resolved: dict[tuple, Any]) -> list[Any]:  # noqa: C901 - one branch per step
        """Every slot's fresh value."""
        vals: list[Any] = [None] * self.size
        for code, s, a in self.ops:
            if code == _COPY:
                vals[s] = a.copy()
            elif code == _BUILD:  # a container: its template copied, then given what was made (or copied) for it
                c = a[0].copy()
                for k, v in a[1]:
                    c[k] = vals[v]
                for k, v in a[2]:
                    c[k] = v.copy()
                vals[s] = c
            elif code == _TUPLE:
                items = a[0].copy()
                for i, v in a[1]:
                    items[i] = vals[v]
                for i, v in a[2]:
                    items[i] = v.copy()
                vals[s] = tuple(items)
            elif code == _PATCH:  # a container that what it holds may hold, made before it
                c = vals[s]
                for k, v in a[0]:
                    c[k] = vals[v]
                for k, v in a[1]:
                    c[k] = v.copy()
            elif code == _REF:
                vals[s] = resolved[a]
            elif code == _COPY_READONLY:
                c = a.copy()
                c.flags.writeable = False
                vals[s] = c
            elif code == _METHOD:
                vals[s] = state_codec.bound_method(vals[a[0]], a[1])
            elif code == _NEW:  # checked again, as the reader checks it (a class's __new__ may have changed since)
                vals[s] = state_codec.new_instance(a)
            elif code == _FILL:
                obj, (d, slots, items, is_dict) = vals[s], a
                if d is not None:
                    obj.__dict__.update(vals[d])
                if slots is not None:
                    for k, v in vals[slots].items():
                        object.__setattr__(obj, k, v)
                if items is not None:
                    dict.update(obj, vals[items]) if is_dict else list.extend(obj, vals[items])
            elif code == _SET:
                kind, shared, live = a
                vals[s] = kind((*shared, *(vals[v] for v in live)))
            elif code == _PAIRS:
                c = vals[s]
                for k_live, k, v_live, v in a:
                    c[vals[k] if k_live else k] = vals[v] if v_live else v
            elif code == _FACTORY:
                vals[s].default_factory = vals[a]
            elif code == _FLAT:
                pairs, writeable = a
                flat = vals[s].reshape(-1)
                for i, v in pairs:
                    flat[i] = vals[v]
                vals[s].flags.writeable = writeable
            elif code == _SUBCLASS:
                base, cls, live, value = a
                vals[s] = base.__new__(cls, vals[value] if live else value)
            elif code == _TENSOR:
                vals[s] = _fresh_tensor(*a)
            elif code == _TORCH_GEN:
                g = sys.modules["torch"].Generator()
                g.set_state(a)
                vals[s] = g
            elif code == _ELEMENT:
                tag, attrib, text, tail = a
                e = vals[s] = sys.modules["xml.etree.ElementTree"].Element(tag, attrib)
                e.text, e.tail = text, tail
            else:  # _CHILDREN
                vals[s].extend([vals[v] for v in a])
        return vals


_BASE_VALUE = {int: int.__int__, float: float.__float__, str: str.__str__, bytes: bytes.__bytes__,
               tuple: lambda x: tuple.__getitem__(x, slice(None))}
"""The plain value of an instance of a subclass of each base, read by the base's own method (not the subclass's)."""


def _fresh_tensor(template: Any, parameter: bool, grad: bool) -> Any:
    t = template.detach().clone()
    if parameter:
        return sys.modules["torch"].nn.Parameter(t, requires_grad=grad)
    return t.requires_grad_(True) if grad else t


def compile_template(value: Any, built: dict[int, str], fixed: dict[tuple, Any] | None = None) -> Template | None:
    """A `Template` of `value` (what `state_reader.Decoder` built, references to the env as `Ref` and `BoundRef`;
    `built`: the reader's instances), or None for a value it does not copy (the caller reads the bytes again at every
    restore). `fixed`: references to hold as the objects given (the env's objects a restore found at the same
    places last time), the others resolved at every restore. `StateDecodeError` for a bound method its owner does
    not have."""
    compiler = _Compiler(built, fixed or {})
    try:
        root = compiler.value(value)
    except StateDecodeError:
        raise
    except Exception:  # noqa: BLE001 - _Unsupported, or anything a value's class raised: read from the bytes instead
        return None
    return Template(_fused(compiler.ops, root), compiler.size, root, frozenset(compiler.used))


class DirectTemplate(NamedTuple):
    """A snapshot's states compiled to be set straight into the objects they belong to (`compile_direct`): `values`
    makes the fresh values (arrays, containers, instances: in `prepare`, before anything is changed), then each
    object's `__dict__` is cleared and given its `shared` attributes (every one, in order, a fresh one as a
    placeholder) and its fresh ones from their slots (`attributes`), with no dict or tuple of the state made between
    (`GraphState.apply`). `rest`: the generators' and structs' states, shared."""

    values: Template
    attributes: tuple[tuple[dict, tuple[tuple[str, int], ...]], ...]  # per object: (shared, ((name, slot), ...))
    rest: list
    fixed: frozenset


def compile_direct(value: list, built: dict[int, str], fixed: dict[tuple, Any], n: int) -> DirectTemplate | None:
    """`value` (a `Read.value`: per object (Consumed(dict), Consumed(slots), Consumed(items)), then the generators'
    and structs' states, `Shared`) as a `DirectTemplate` against `fixed` (as `compile_template`); None where one
    object's state is more than attributes in a `__dict__` (slots, items), or a value it does not copy."""
    compiler = _Compiler(built, fixed)
    attributes = []
    try:
        for d, slots, items in value[:n]:
            if type(d.value) is not dict or slots.value or items.value is not None:
                return None
            shared, fresh = {}, []
            for k, v in d.value.items():
                if type(k) is not str:
                    return None
                live, x = compiler.value(v)
                shared[k] = None if live else x
                if live:
                    fresh.append((k, x))
            attributes.append((shared, tuple(fresh)))
        rest = []
        for x in value[n:]:  # `Shared`: given as they are
            live, v = compiler.value(x)
            if live:
                return None
            rest.append(v)
    except StateDecodeError:
        raise
    except Exception:  # noqa: BLE001 - as compile_template
        return None
    read_by_apply = [x for _, fresh in attributes for _, x in fresh]
    ops = _fused(compiler.ops, (False, None), read_by_apply)
    return DirectTemplate(Template(ops, compiler.size, (False, None), frozenset(compiler.used)), tuple(attributes),
                          rest, frozenset(compiler.used))


def _reads(code: int, a: Any) -> list[int]:
    """The slots a step reads values from (besides its own)."""
    if code in (_PATCH, _FLAT):
        return [v for _, v in a[0]]
    if code == _TUPLE:
        return [v for _, v in a[1]]
    if code == _METHOD:
        return [a[0]]
    if code == _FILL:
        return [v for v in a[:3] if v is not None]
    if code == _SET:
        return list(a[2])
    if code == _PAIRS:
        return [v for k_live, k, v_live, v in a for v in ((k,) if k_live else ()) + ((v,) if v_live else ())]
    if code == _FACTORY:
        return [a]
    if code == _SUBCLASS:
        return [a[3]] if a[2] else []
    if code == _CHILDREN:
        return list(a)
    return []


def _fused(ops: list[tuple], root: tuple[bool, Any], read_after: Sequence[int] = ()) -> list[tuple]:
    """`ops` in fewer steps: a container or array copied from its template alone and used once, by a container or
    tuple, copied there (never given a slot); a container's copy and what it is then given one step, where nothing
    reads it in between (it holds nothing that holds it). `read_after`: slots read once every step has run, as the
    root is."""
    ops = [(code, s, ((a, ()) if code == _PATCH else (*a, ()) if code == _TUPLE else a)) for code, s, a in ops]
    readers: dict[int, list[int]] = collections.defaultdict(list)
    changed: dict[int, list[int]] = collections.defaultdict(list)
    for n, (code, s, a) in enumerate(ops):
        for v in _reads(code, a):
            readers[v].append(n)
        if code in _MODIFY:
            changed[s].append(n)
    if root[0]:
        readers[root[1]].append(len(ops))
    for slot in read_after:
        readers[slot].append(len(ops))
    copied: dict[int, Any] = {}  # slot -> its template, copied where it is used
    for code, s, a in ops:
        if code == _COPY and not changed[s] and len(readers[s]) == 1 and readers[s][0] < len(ops) and \
                ops[readers[s][0]][0] in (_PATCH, _TUPLE):
            copied[s] = a
    out: list[tuple | None] = []
    made: dict[int, int] = {}  # slot -> the index in `out` of the copy that makes it
    for n, (code, s, a) in enumerate(ops):
        if code == _COPY and s in copied:
            continue
        if code in (_PATCH, _TUPLE):
            pairs = a[-2]
            a = (*a[:-2], tuple((k, v) for k, v in pairs if v not in copied),
                 tuple((k, copied[v]) for k, v in pairs if v in copied))
            at = made.get(s)
            if code == _PATCH and at is not None and changed[s] == [n] and all(r > n for r in readers[s]):
                template, out[at] = out[at][2], None  # nothing read it in between: copied here, then given what it holds
                out.append((_BUILD, s, (template, *a)))
                continue
        if code == _COPY:
            made[s] = len(out)
        out.append((code, s, a))
    return [op for op in out if op is not None]


class _Compiler:
    def __init__(self, built: dict[int, str], fixed: dict[tuple, Any]) -> None:
        self.built, self.fixed = built, fixed
        self.ops: list[tuple] = []
        self.size = 0
        self.used: set[tuple] = set()  # the fixed references it holds
        self.memo: dict[int, tuple[bool, Any]] = {}
        self.busy: set[int] = set()  # immutable values being compiled (a value that holds itself through one)
        self.keep: list[Any] = []  # what it made to compile (their ids stay theirs)

    def _slot(self) -> int:
        self.size += 1
        return self.size - 1

    def value(self, x: Any) -> tuple[bool, Any]:
        """(False, the value shared) or (True, the slot a restore makes it in)."""
        t = type(x)
        if t in _SHARED_TYPES:
            return False, x
        done = self.memo.get(id(x))
        if done is not None:
            return done
        if id(x) in self.busy:
            raise _Unsupported("a value that holds itself through an immutable one")
        self.busy.add(id(x))
        try:
            out = self._compile(x, t)
        finally:
            self.busy.discard(id(x))
        self.memo[id(x)] = out
        return out

    def _live(self, code: int, argument: Any) -> tuple[bool, int]:
        s = self._slot()
        self.ops.append((code, s, argument))
        return True, s

    def _compile(self, x: Any, t: type) -> tuple[bool, Any]:  # noqa: C901 - one branch per kind of value
        if t is Shared:
            return False, x.value
        if t is Consumed:
            inner = x.value
            return self._container(inner, type(inner), consumed=True) if type(inner) in (dict, list) else \
                self.value(inner)
        if t is Ref:
            if x.pid in self.fixed:
                self.used.add(x.pid)
                return False, self.fixed[x.pid]
            return self._live(_REF, x.pid)
        if t is BoundRef:
            live, owner = self.value(x.owner)
            if not live:
                return False, state_codec.bound_method(owner, x.name)
            return self._live(_METHOD, (owner, x.name))
        if t is np.ndarray:
            if x.dtype != object:
                return self._live(_COPY if x.flags.writeable else _COPY_READONLY, x)
            return self._object_array(x)
        if t in _COPIED:
            return self._container(x, t)
        if t is tuple or t is frozenset or t is set:
            items = [self.value(v) for v in x]
            if t is not set and not any(live for live, _ in items):  # shared: the reader's own unless a reference
                shared = [v for _, v in items]                       # was resolved in it
                return False, x if all(a is b for a, b in zip(shared, x)) else t(shared)
            if t is tuple:
                return self._live(_TUPLE, ([None if live else v for live, v in items],
                                           tuple((i, v) for i, (live, v) in enumerate(items) if live)))
            return self._live(_SET, (t, tuple(v for live, v in items if not live),
                                     tuple(v for live, v in items if live)))
        kind = self.built.get(id(x))
        if kind == "object":
            return self._object(x, t)
        if kind == "subclass":
            return self._subclass(x, t)
        if isinstance(x, _NAMED) or isinstance(x, np.generic) and not isinstance(x, np.void):
            return False, x
        if t is slice:
            parts = [self.value(v) for v in (x.start, x.stop, x.step)]
            if any(live for live, _ in parts):
                raise _Unsupported("a slice of values made at every restore")
            return False, x
        module = t.__module__ or ""
        if module.startswith("torch") and t.__name__ in ("Tensor", "Parameter"):
            return self._live(_TENSOR, (x, t.__name__ == "Parameter", bool(x.requires_grad)))
        if module.startswith("torch") and t.__name__ == "Generator":
            return self._live(_TORCH_GEN, x.get_state())
        if module == "xml.etree.ElementTree" and t.__name__ == "Element":
            return self._element(x)
        raise _Unsupported(f"a {t.__qualname__}")

    def _reserve(self, x: Any, memo: bool = True) -> tuple[int, int]:
        """A slot for a mutable value, made before what it holds (which may hold it), and the index of its step."""
        s = self._slot()
        if memo:
            self.memo[id(x)] = (True, s)
        self.ops.append(None)  # type: ignore[arg-type] - set once its items are compiled
        return s, len(self.ops) - 1

    def _container(self, x: Any, t: type, consumed: bool = False) -> tuple[bool, Any]:
        factory = self.value(x.default_factory) if t is collections.defaultdict else (False, None)
        s, at = self._reserve(x, memo=not consumed)
        if t is bytearray:
            self.ops[at] = (_COPY, s, bytearray(x))
            return True, s
        if isinstance(x, dict):
            pairs = [(self.value(k), self.value(v)) for k, v in x.items()]
            if any(k[0] for k, _ in pairs):  # a key made at every restore: set in order into an empty one
                template = t(None if factory[0] else factory[1]) if t is collections.defaultdict else t()
                self.ops.append((_PAIRS, s, tuple((*k, *v) for k, v in pairs)))
            else:
                template = t(None if factory[0] else factory[1]) if t is collections.defaultdict else t()
                for (_, k), (live, v) in pairs:
                    template[k] = None if live else v
                patch = tuple((k, v) for (_, k), (live, v) in pairs if live)
                if patch:
                    self.ops.append((_PATCH, s, patch))
        else:
            items = [self.value(v) for v in x]
            shared = [None if live else v for live, v in items]
            template = collections.deque(shared, x.maxlen) if t is collections.deque else shared
            patch = tuple((i, v) for i, (live, v) in enumerate(items) if live)
            if patch:
                self.ops.append((_PATCH, s, patch))
        if factory[0]:
            self.ops.append((_FACTORY, s, factory[1]))
        if consumed and len(self.ops) == at + 1:  # holds nothing made at every restore: given as it is
            self.ops.pop()
            return False, template
        self.ops[at] = (_COPY, s, template)
        return True, s

    def _object_array(self, x: np.ndarray) -> tuple[bool, int]:
        s, at = self._reserve(x)
        items = [self.value(v) for v in x.reshape(-1)]
        template = np.empty(x.shape, object)
        flat = template.reshape(-1)
        for i, (live, v) in enumerate(items):
            if not live:
                flat[i] = v
        self.ops[at] = (_COPY, s, template)
        self.ops.append((_FLAT, s, (tuple((i, v) for i, (live, v) in enumerate(items) if live),
                                    bool(x.flags.writeable))))
        return True, s

    def _object(self, x: Any, t: type) -> tuple[bool, int]:
        """An instance the reader made (`rebuild_object`'s steps): made first, its attributes, slots and items
        after (they may hold it)."""
        s, at = self._reserve(x)
        self.ops[at] = (_NEW, s, t)
        d = getattr(x, "__dict__", None)
        slots = {}
        for k in state_codec._slot_names(t):
            try:
                slots[k] = object.__getattribute__(x, k)
            except AttributeError:
                continue
        items = dict(x) if isinstance(x, dict) else list(x) if isinstance(x, list) else None
        parts = [None if v is None else self.value(self._kept(v)) for v in (
            dict(d) if isinstance(d, dict) else None, slots or None, items)]
        d_slot, slots_slot, items_slot = (None if p is None else self._made(p) for p in parts)
        self.ops.append((_FILL, s, (d_slot, slots_slot, items_slot, isinstance(x, dict))))
        return True, s

    def _subclass(self, x: Any, t: type) -> tuple[bool, Any]:
        """A subclass of int, float, str, bytes or tuple the reader made (`rebuild_subclass`): shared when it holds
        no attributes and nothing made at every restore."""
        base = next(b for b in state_codec._SUBCLASS_BASES if isinstance(x, b))
        live, value = self.value(self._kept(_BASE_VALUE[base](x)))
        d = getattr(x, "__dict__", None)
        if d is None and not live:
            return False, x if base is not tuple or all(a is b for a, b in zip(value, x)) else base.__new__(t, value)
        s = self._slot()
        self.memo[id(x)] = (True, s)
        self.ops.append((_SUBCLASS, s, (base, t, live, value)))
        if isinstance(d, dict):
            self.ops.append((_FILL, s, (self._made(self.value(self._kept(dict(d)))), None, None, False)))
        return True, s

    def _element(self, x: Any) -> tuple[bool, int]:
        parts = [self.value(v) for v in (x.tag, x.text, x.tail, *x.attrib.keys(), *x.attrib.values())]
        if any(live for live, _ in parts):
            raise _Unsupported("an XML element whose tag, text or attributes are made at every restore")
        s, at = self._reserve(x)
        self.ops[at] = (_ELEMENT, s, (x.tag, dict(x.attrib), x.text, x.tail))
        children = [self._made(self.value(c)) for c in x]
        if children:
            self.ops.append((_CHILDREN, s, tuple(children)))
        return True, s

    def _kept(self, x: Any) -> Any:
        self.keep.append(x)
        return x

    @staticmethod
    def _made(compiled: tuple[bool, Any]) -> int:
        live, s = compiled
        if not live:
            raise _Unsupported("a container compiled as shared")  # never: containers are made at every restore
        return s
