"""Reading a snapshot of an object graph's Python state (`capsules.graph.state`): its three parts, the checks on every
entry a capsule file could forge, and a cache of what was read.

A snapshot's bytes come from a capsule file, so they are read only by `capsules.state_codec` and checked entry
by entry (`checked_plan`, `checked_states`) before anything is resolved in the env. Reading is pure Python; an
env restores the same capsule again and again (every reset of a seed, every branch of a boundary), so what was
read is kept (`ReadCache`, keyed by the bytes themselves): the view bases as the reader built them, copied at
every restore, and the states as a `Template` compiled from the values the reader built, which makes fresh copies
of them at every restore (values that cannot change shared, arrays and containers copied from templates,
references to the env's objects resolved by the restore). Nothing here is pickle: no value is ever made by a
function a stream or a template names.
"""

from __future__ import annotations

import collections
import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from capsule_rollout.capsules.graph.names import GENERATOR_TYPES, type_key
from capsule_rollout.capsules.graph.template import (  # noqa: F401 - the templates are part of this module's API
    BoundRef,
    Consumed,
    DirectTemplate,
    Ref,
    Shared,
    Template,
    compile_direct,
    compile_template,
)
from capsule_rollout.capsules.graph.walk import Path
from capsule_rollout.capsules.state_codec import StateDecodeError


def span(a: np.ndarray) -> tuple[int, int]:
    """The bytes an array's elements lie in, from its first element's address (a struct array's field spans
    more than its `nbytes`: MjData.warning.number strides over the whole struct)."""
    if a.size == 0:
        return 0, 0
    low = sum((n - 1) * k for n, k in zip(a.shape, a.strides) if k < 0)
    high = sum((n - 1) * k for n, k in zip(a.shape, a.strides) if k > 0) + a.itemsize
    return low, high


def extent(offset: Any, shape: Any, strides: Any, dtype: Any, within: tuple[int, int]) -> np.dtype:
    """Check that a view (`offset` bytes in, `shape`, `strides`, `dtype`) lies inside `within`; its dtype.
    A capsule gives these numbers, so nothing is trusted: a view past its memory would read or write
    whatever lies there."""
    if not (type(offset) is int and isinstance(shape, tuple) and isinstance(strides, tuple)
            and len(shape) == len(strides) <= 32 and all(type(n) is int and n >= 0 for n in shape)
            and all(type(k) is int for k in strides) and isinstance(dtype, str)):
        raise ValueError("a malformed array view")
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError):
        raise ValueError(f"a view of dtype {dtype!r}") from None
    if dt.hasobject:
        raise ValueError("a view of Python objects")
    if 0 in shape:
        return dt
    low = offset + sum((n - 1) * k for n, k in zip(shape, strides) if k < 0)
    high = offset + sum((n - 1) * k for n, k in zip(shape, strides) if k > 0) + dt.itemsize
    if low < within[0] or high > within[1]:
        raise ValueError(f"a view of bytes {low}..{high} of an array lying in bytes {within[0]}..{within[1]}")
    return dt


def bounded_view(base: np.ndarray, offset: Any, shape: Any, strides: Any, dtype: Any) -> np.ndarray:
    """A view of `base`'s memory, refused (ValueError) unless it lies inside it."""
    dt = extent(offset, shape, strides, dtype, (0, base.nbytes))
    return np.ndarray(shape, dt, buffer=base, offset=offset if 0 not in shape else 0, strides=strides)


class GraphStateError(ValueError):
    """The env's Python state cannot be captured as found; the message names the path and what to do."""




def generator_state(g: Any) -> Any:
    if isinstance(g, np.random.Generator):
        return g.bit_generator.state
    if isinstance(g, np.random.RandomState):
        return g.get_state(legacy=False)
    if isinstance(g, np.random.BitGenerator):
        return g.state
    return g.getstate()


def set_generator_state(g: Any, state: Any) -> None:
    if isinstance(g, np.random.Generator):
        g.bit_generator.state = state
    elif isinstance(g, np.random.RandomState):
        g.set_state(state)
    elif isinstance(g, np.random.BitGenerator):
        g.state = state
    else:
        g.setstate(state)


BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")


def quick_state(state: Any) -> Any:
    """A generator state as `set_generator_state` takes it fastest: an MT19937 key (a `RandomState`'s, the global
    `numpy.random`'s) as a list of ints (numpy's setter reads the 624 words one by one: about 2 us from a list,
    28 from an array). Anything else as it is."""
    inner = state.get("state") if isinstance(state, dict) else None
    if isinstance(inner, dict) and isinstance(inner.get("key"), np.ndarray):
        return {**state, "state": {**inner, "key": inner["key"].tolist()}}
    return state


_POSITIONS = {"MT19937": (lambda st: st["state"]["pos"], 624), "Philox": (lambda st: st["buffer_pos"], 4)}
"""Where each bit generator reads next, and its largest value: numpy sets these as given and its C code then reads
the state's array at that position (an MT19937 `pos` of 10**7 is taken, and the next draw reads past the key)."""


def in_bounds(state: Any) -> None:
    """ValueError for a state (as numpy gives it back once set) whose position lies outside its buffer."""
    if not isinstance(state, dict) or state.get("bit_generator") not in _POSITIONS:
        return
    position, top = _POSITIONS[state["bit_generator"]]
    at = int(position(state))
    if not 0 <= at <= top:
        raise ValueError(f"a {state['bit_generator']} state whose position {at} lies outside 0..{top}")


class SpareGenerators:
    """A generator of each kind, and spares of the global `numpy.random` and `random` states, to try a capsule's
    generator states on: a restore applies only states numpy and random took, so it cannot fail half way."""

    def __init__(self) -> None:
        self._spares: dict[type, Any] = {}
        self._globals = (np.random.RandomState(), random.Random())

    def check(self, generators: Sequence[tuple[Any, type]], states: Sequence[Any], glob: tuple | None) -> None:
        """`generators`: a plan's (path, kind) pairs; `states` theirs; `glob` the global generators' states or
        None. `GraphStateError` for a state numpy or random refuses."""
        try:
            for (_, kind), state in zip(generators, states):
                if issubclass(kind, (np.random.Generator, np.random.BitGenerator)):
                    name = state.get("bit_generator") if isinstance(state, dict) else None
                    if name not in BIT_GENERATORS:
                        raise ValueError(f"bit generator {name!r}")
                    kind = getattr(np.random, name)
                elif issubclass(kind, np.random.RandomState):
                    kind = np.random.RandomState
                else:
                    kind = random.Random
                spare = self._spares.get(kind)
                if spare is None:
                    spare = self._spares[kind] = kind()
                set_generator_state(spare, state)
                in_bounds(generator_state(spare))
            if glob is not None:
                self._globals[0].set_state(glob[0])
                in_bounds(self._globals[0].get_state(legacy=False))
                self._globals[1].setstate(glob[1])
        except Exception as exc:  # noqa: BLE001 - tried on a spare: whatever numpy or random raises, it is refused
            raise GraphStateError(f"the capsule's Python state is refused: a generator state that numpy or random "
                                  f"refuses ({exc})") from None


def new_generator(kind: type, state: Any) -> Any:
    if issubclass(kind, np.random.Generator):
        name = state.get("bit_generator") if isinstance(state, dict) else None
        if name not in BIT_GENERATORS:
            raise GraphStateError(f"the capsule's Python state is refused: a generator of bit generator {name!r}")
        g = kind(getattr(np.random, name)())
    else:
        g = kind()
    try:
        set_generator_state(g, state)
    except (TypeError, ValueError, KeyError) as exc:
        raise GraphStateError(f"the capsule's Python state is refused: a generator state numpy refuses ({exc})") from None
    return g




class Prepared(NamedTuple):
    """A snapshot read and resolved in one graph (`GraphState.prepare`), to be applied (`GraphState.apply`)."""

    objects: list[Any]
    states: list[tuple[dict | None, dict, Any]]
    generators: list[Any]
    generator_states: list[Any]
    glob: tuple | None
    missing: bool = False  # an opaque object the target lacks is referred to (applying checks every attribute)
    structs: Sequence[Any] = ()  # the target's structs (None: it has none there yet)
    struct_states: Sequence[Any] = ()
    missing_structs: tuple[str, ...] = ()  # paths of structs the target lacks (a renderer it has not made yet)
    direct: tuple[DirectTemplate, list] | None = None  # the objects' states as a template and its fresh values
    # (`compile_direct`), set straight into `objects` by `apply` (then `states` is empty)


def split(blob: bytes | memoryview) -> list[bytes]:
    """The three length-prefixed parts of a snapshot."""
    data = memoryview(blob).cast("B")
    parts, at = [], 0
    for _ in range(3):
        if at + 8 > len(data):
            raise GraphStateError("the capsule's Python state is truncated")
        n = int.from_bytes(data[at:at + 8], "little")
        if n > len(data) - at - 8:
            raise GraphStateError("the capsule's Python state is truncated (a part longer than what is left)")
        parts.append(bytes(data[at + 8:at + 8 + n]))
        at += 8 + n
    return parts


_KEY_TYPES = (str, int, bool, float, tuple, type(None))


def _is_path(p: Any, optional: bool = False) -> bool:
    if p is None:
        return optional
    if not isinstance(p, tuple):
        return False
    for step in p:
        if not isinstance(step, tuple) or not step:
            return False
        if step == ("self",):
            continue
        if len(step) != 2 or not (step[0] == "a" and type(step[1]) is str or step[0] == "k"
                                  and isinstance(step[1], _KEY_TYPES) or step[0] == "i" and type(step[1]) is int):
            return False
    return True


def _ints(x: Any) -> bool:
    return isinstance(x, tuple) and all(type(n) is int for n in x)


def checked_plan(value: Any) -> tuple:
    """A snapshot's plan, every entry of the shape `GraphState.snapshot` writes (a capsule file is input); a plan
    written before structs were captured has none."""
    ok = isinstance(value, tuple) and len(value) in (7, 8) and all(isinstance(v, list) for v in value)
    if ok:
        value = value if len(value) == 8 else (*value, [])
        refs, objects, generators, aliases, views, statics, externals, structs = value
        ok = (all(isinstance(r, tuple) and len(r) == 3 and _is_path(r[0]) and type(r[1]) is str
                  and r[2] in ("handle", "opaque") for r in refs)
              and all(isinstance(o, tuple) and len(o) == 2 and _is_path(o[0], True) and type(o[1]) is str
                      for o in objects)
              and all(isinstance(g, tuple) and len(g) == 2 and _is_path(g[0], True) and isinstance(g[1], type)
                      and type_key(g[1]) in GENERATOR_TYPES for g in generators)
              and all(isinstance(a, tuple) and len(a) == 6 and type(a[0]) is int and a[0] >= 0 for a in aliases)
              and all(isinstance(v, tuple) and len(v) == 6 and type(v[0]) is int and v[0] >= 0
                      and type(v[5]) is bool for v in views)
              and all(_is_path(p) for p in statics) and all(type(k) is str for k in externals)
              and all(isinstance(t, tuple) and len(t) == 2 and _is_path(t[0]) and type(t[1]) is str
                      for t in structs))
    if not ok:
        raise StateDecodeError("its plan of paths is malformed")
    return value


def checked_states(value: Any, n_objects: int, n_generators: int, n_structs: int = 0) -> tuple[list, tuple | None]:
    """The states part: one (dict | None, slots, items) per object, one state per generator, one dict of fields
    per struct, the globals."""
    ok = isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], list) and \
        len(value[0]) == n_objects + n_generators + n_structs
    if ok:
        states, glob = value
        ok = all(isinstance(st, tuple) and len(st) == 3 and isinstance(st[0], (dict, type(None)))
                 and isinstance(st[1], dict) and all(type(k) is str for k in st[1])
                 and isinstance(st[2], (dict, list, type(None))) for st in states[:n_objects])
        ok = ok and all(isinstance(st, (dict, tuple)) for st in states[n_objects:n_objects + n_generators])
        ok = ok and all(isinstance(st, dict) and all(type(k) is str for k in st)
                        for st in states[n_objects + n_generators:])
        ok = ok and (glob is None or isinstance(glob, tuple) and len(glob) == 2 and isinstance(glob[0], dict)
                     and isinstance(glob[1], tuple))
    if not ok:
        raise GraphStateError("the capsule's Python state is refused: its states are malformed")
    return value




@dataclass
class Plan:
    """The paths of a snapshot and what sits at each (written first, so a restore resolves them all before any
    state is applied)."""

    refs: list[tuple[Path, str, str]]  # handles and opaque objects: path, type name, kind
    objects: list[tuple[Path | None, str]]  # paired objects: path, class as "module:qualname"
    generators: list[tuple[Path | None, type]]
    aliases: list[tuple[int, str, int, tuple, tuple, str]]  # (ref index of the handle, field, offset, ...)
    views: list[tuple[int, int, tuple, tuple, str, bool]]  # (base index, offset, shape, strides, dtype, writeable)
    statics: list[Path]  # large arrays holding what they held when the env was built: by path, not by value
    externals: list[str]  # arrays the owner keeps elsewhere in the capsule (an env's boundary observation), by key
    structs: list[tuple[Path, str]]  # values set in place (a renderer's camera): path, class as "module:qualname"




def pids(plan: Plan) -> frozenset[tuple]:
    """The references a snapshot's states may use: one per entry of its plan."""
    out = []
    for kind, entries in (("r", plan.refs), ("a", plan.aliases), ("v", plan.views), ("s", plan.statics),
                          ("o", plan.objects), ("g", plan.generators), ("x", plan.externals), ("t", plan.structs)):
        out += [(kind, i) for i in range(len(entries))]
    return frozenset(out)


def fresh_copy(template: np.ndarray) -> np.ndarray:
    """A copy of an array kept aside, as writeable as it is."""
    copy = template.copy()
    if not template.flags.writeable:
        copy.flags.writeable = False
    return copy


@dataclass
class Read:
    """One snapshot as read: its plan, and its view bases and object and struct states kept for fresh copies
    (`template`, compiled from `value`, what the reader built: `built` its instances), its generator states and the
    global generators' (`glob`) as values shared by every restore (`quick_state`); `template` None: everything is
    read from `raw_states` at every restore."""

    plan: Plan
    bases: list[np.ndarray]  # the reader's arrays, never handed to the env: each restore views copies (`fresh_copy`)
    template: Template | None
    raw_states: bytes
    value: Any = None  # the states as the reader built them (generator states `Shared`), for `compile_template`
    built: dict[int, str] = dataclasses.field(default_factory=dict)
    decoded: Any = None  # all the reader built: kept, so that the ids in `built` stay theirs
    glob: tuple | None = None


class ReadCache:
    """The last few snapshots read, by their bytes (an env restores a few capsules many times). The last one found is
    compared first: a restore's bytes are a new object each time, and comparing them costs a fraction of hashing
    them."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self.entries: collections.OrderedDict[bytes, Read] = collections.OrderedDict()
        self._last: tuple[bytes, Read] | None = None

    def get(self, blob: bytes) -> Read | None:
        last = self._last
        if last is not None and last[0] == blob:
            return last[1]
        read = self.entries.get(blob)
        if read is not None:
            self.entries.move_to_end(blob)
            self._last = (blob, read)
        return read

    def put(self, blob: bytes, read: Read) -> None:
        self.entries[blob] = read
        self._last = (blob, read)
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)
