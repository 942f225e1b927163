"""`capsules.graph.template.Template`: the fresh copies a restore makes of a snapshot's states without reading its bytes
again (and without pickle) are what the reader makes from those bytes, sharing and cycles kept, nothing mutable
shared between two restores; the references to the env resolved at every restore unless the template holds them."""

from __future__ import annotations

import collections
import enum
import xml.etree.ElementTree as ET
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from capsule_rollout.capsules import state_codec as sc
from capsule_rollout.capsules.graph.state import GraphState
from capsule_rollout.capsules.graph.template import BoundRef, Consumed, Ref, Shared, compile_template
from capsule_rollout.capsules.graph.walk import Edges
from capsule_rollout.capsules.state_reader import Decoder
from tests.capsules.any_name import AnyLoadedName


class Color(enum.Enum):
    RED = 1


class Point(NamedTuple):
    x: Any
    y: Any


class Record:
    def __init__(self, value):
        self.value, self.me = value, self

    def bump(self):
        self.value = [*self.value, "bumped"]


class Slotted:
    __slots__ = ("a", "b")


class Table(dict):
    """A dict with attributes of its own."""


def read(value: Any) -> tuple[Any, Decoder]:
    """`value` written and read back as `GraphState._read` reads a snapshot's states (bound methods kept as
    `BoundRef`)."""
    reader = Decoder(sc.encode(value), AnyLoadedName())
    reader.bind = BoundRef
    return reader.decode(), reader


def same(a: Any, b: Any, pairs: dict[int, int] | None = None) -> bool:
    """`a` and `b` hold the same values in the same shape: types, values, arrays' bytes and flags, and which mutable
    values are one (a bijection between them)."""
    pairs = {} if pairs is None else pairs
    t = type(a)
    if t is not type(b):
        return False
    if isinstance(a, (type(None), bool, int, float, complex, str, bytes, type, enum.Enum, np.dtype, np.generic, slice)):
        return a == b or a is b or (isinstance(a, float) and a != a and b != b)
    if id(a) in pairs:
        return pairs[id(a)] == id(b)
    pairs[id(a)] = id(b)
    if t is np.ndarray:
        if a.dtype == object:
            return a.shape == b.shape and a.flags.writeable == b.flags.writeable and all(
                same(x, y, pairs) for x, y in zip(a.reshape(-1), b.reshape(-1)))
        return (a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
                and a.flags.writeable == b.flags.writeable)
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b) and a.requires_grad == b.requires_grad
    if isinstance(a, torch.Generator):
        return torch.equal(a.get_state(), b.get_state())
    if isinstance(a, ET.Element):
        return (a.tag, a.attrib, a.text, a.tail) == (b.tag, b.attrib, b.text, b.tail) and same(list(a), list(b), pairs)
    if callable(a) and hasattr(a, "__self__"):
        return a.__name__ == b.__name__ and same(a.__self__, b.__self__, pairs)
    if isinstance(a, (set, frozenset)):
        return len(a) == len(b) and all(any(same(x, y, dict(pairs)) for y in b) for x in a)
    if isinstance(a, dict):
        if list(a) != list(b) or not all(same(a[k], b[k], pairs) for k in a):
            return False
        if isinstance(a, collections.defaultdict) and not same(a.default_factory, b.default_factory, pairs):
            return False
    elif isinstance(a, (list, tuple, collections.deque)):
        if len(a) != len(b) or not all(same(x, y, pairs) for x, y in zip(a, b)):
            return False
        if isinstance(a, collections.deque) and a.maxlen != b.maxlen:
            return False
    elif isinstance(a, bytearray):
        return a == b
    for k in sc._slot_names(t):
        if hasattr(a, k) != hasattr(b, k) or hasattr(a, k) and not same(getattr(a, k), getattr(b, k), pairs):
            return False
    return same(getattr(a, "__dict__", None), getattr(b, "__dict__", None), pairs) if hasattr(a, "__dict__") else True


def mutables(x: Any, out: dict[int, Any] | None = None) -> dict[int, Any]:
    """Every mutable value reachable from `x` (containers, arrays, instances), by id."""
    out = {} if out is None else out
    if id(x) in out or isinstance(x, (type(None), bool, int, float, complex, str, bytes, type, enum.Enum, np.dtype,
                                      np.generic, slice)):
        return out
    if not isinstance(x, (tuple, frozenset)) or hasattr(x, "__dict__"):
        out[id(x)] = x
    items: list[Any] = []
    if isinstance(x, dict):
        items = [*x.keys(), *x.values()]
    elif isinstance(x, (list, tuple, set, frozenset, collections.deque)):
        items = list(x)
    elif isinstance(x, np.ndarray) and x.dtype == object:
        items = list(x.reshape(-1))
    elif isinstance(x, ET.Element):
        items = list(x)
    if callable(x) and hasattr(x, "__self__") and not isinstance(x.__self__, type):
        items.append(x.__self__)
    if hasattr(x, "__dict__") and not callable(x):
        items.append(vars(x))
    for k in sc._slot_names(type(x)):
        if hasattr(x, k):
            items.append(getattr(x, k))
    for v in items:
        mutables(v, out)
    return out


def everything() -> dict:
    shared = [1.5, "x"]
    frozen = np.arange(4.0)
    frozen.flags.writeable = False
    record = Record([shared])
    slotted = Slotted()
    slotted.a = shared
    table = Table(k=[2])
    table.note = "n"
    element = ET.Element("body", {"name": "b"})
    element.append(ET.Element("geom"))
    value = {
        "shared": shared, "again": shared, "tuple": ("a", 1, (2.0, None)), "holds": (shared, 3),
        "record": record, "bump": record.bump, "append": shared.append, "slotted": slotted, "table": table,
        "array": np.arange(6, dtype=np.int32).reshape(2, 3), "frozen": frozen, "view": frozen,
        "objects": np.array([None, shared, "s"], dtype=object),
        "defaultdict": collections.defaultdict(list, {"a": [1]}), "deque": collections.deque([1, [2]], maxlen=4),
        "ordered": collections.OrderedDict(b=1, a=[3]), "set": {1, "two"}, "frozenset": frozenset({3, (4,)}),
        "point": Point(1, "y"), "holding point": Point([1], 2), "bytes": bytearray(b"xy"), "color": Color.RED,
        "dtype": np.dtype("<f4"), "scalar": np.float32(2.5), "class": Record, "slice": slice(1, None, 2),
        "tensor": torch.arange(3.0), "parameter": torch.nn.Parameter(torch.ones(2)), "generator": torch.Generator(),
        "element": element, "keys": {(1, 2): "tuple key", Color.RED: "enum key"},
    }
    value["self"] = value
    return value


def test_a_template_makes_what_the_reader_makes_sharing_and_cycles_kept():
    value, reader = read(everything())
    template = compile_template(value, reader.built)
    assert template is not None
    first, second = template({}), template({})
    plain = sc.decode(sc.encode(everything()), AnyLoadedName())  # what the reader makes (bound methods bound)
    for out in (first, second):
        assert same(out, plain)
    assert first["self"] is first and first["shared"] is first["again"] is first["holds"][0]
    assert first["append"].__self__ is first["shared"] and first["record"].me is first["record"]
    assert first["bump"].__self__ is first["record"] and first["slotted"].a is first["shared"]
    assert first["objects"][1] is first["shared"] and first["view"] is first["frozen"]
    assert not first["frozen"].flags.writeable and first["array"].flags.writeable
    # values that cannot change are the reader's own; nothing mutable is shared with it or between two restores
    assert first["tuple"] is second["tuple"] is value["tuple"] and first["point"] is value["point"]
    made, other, kept = mutables(first), mutables(second), mutables(value)
    assert len(made) > 25 and not set(made) & set(other) and not set(made) & set(kept)
    first["shared"].append("more")
    first["record"].bump()
    first["array"][0, 0] = 99
    assert same(template({}), plain)


def test_references_are_resolved_at_every_restore_unless_the_template_holds_them():
    env_part, env_list, per_restore = Record(1), [], np.zeros(2)
    value = [Ref(("o", 0)), (Ref(("o", 0)), 1), BoundRef(Ref(("o", 1)), "append"), {"k": Ref(("v", 0))}]
    resolved = {("o", 0): env_part, ("o", 1): env_list, ("v", 0): per_restore}
    generic = compile_template(value, {})
    out = generic(resolved)
    assert out[0] is env_part and out[1] == (env_part, 1) and out[2].__self__ is env_list and out[3]["k"] is per_restore
    fixed = compile_template(value, {}, {("o", 0): env_part, ("o", 1): env_list})
    assert fixed.fixed == {("o", 0), ("o", 1)}
    a, b = fixed({("v", 0): 1}), fixed({("v", 0): 2})
    assert a[1] is b[1] and a[2] == b[2] and a[3] == {"k": 1} and b[3] == {"k": 2}
    with pytest.raises(sc.StateDecodeError, match="no method 'nope'"):
        compile_template([BoundRef(Ref(("o", 0)), "nope")], {}, {("o", 0): env_part})


def test_what_a_restore_only_reads_is_given_as_it_is_and_never_mixed_with_what_the_env_holds():
    attrs = {"n": 1, "name": "a"}
    held = {"n": [1]}
    value = [(Consumed(attrs), Consumed({}), Consumed(None)), (Consumed(held), Consumed({}), Consumed(None)),
             {"also": held}, Shared({"lookat": np.zeros(3)})]
    template = compile_template(value, {})
    a, b = template({}), template({})
    assert a[0] is b[0] and a[0][0] == attrs and a[3] is value[3].value  # shared: nothing in them is made afresh
    assert a[1][0] is not b[1][0] and a[1][0]["n"] is a[2]["also"]["n"]
    # a dict given as an object's attributes, held elsewhere too (a crafted snapshot): the other place gets its own
    assert a[2]["also"] is not a[1][0] and a[2]["also"] is not b[2]["also"]


@pytest.mark.parametrize("value", [np.zeros(1, dtype=[("a", "<f8")])[0], slice([1], 2)])
def test_a_value_templates_do_not_copy_leaves_the_snapshot_to_be_read_from_its_bytes(value):
    decoded, reader = read({"v": value})
    assert compile_template(decoded, reader.built) is None


leaves = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=4) | \
    st.binary(max_size=4) | st.builds(np.array, st.lists(st.floats(allow_nan=False), max_size=3))


@settings(max_examples=200, deadline=None)
@given(st.recursive(leaves, lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
                    | st.dictionaries(st.text(max_size=3), inner, max_size=4) | st.builds(Point, inner, inner),
                    max_leaves=24),
       st.data())
def test_any_value_is_made_as_the_reader_makes_it(value, data):
    holder = [value, value]  # a value held twice
    if isinstance(value, list):
        value.append(holder)  # and a cycle
    holder.append(data.draw(st.sampled_from([value, holder, None])))
    decoded, reader = read(holder)
    template = compile_template(decoded, reader.built)
    first, second = template({}), template({})
    assert same(first, decoded) and same(second, decoded)  # (no bound methods in these)
    assert not set(mutables(first)) & set(mutables(second))


def test_edges_name_the_places_whose_object_the_env_replaced():
    root = Record(Record(1))
    root.parts = [Record(2)]
    edges = Edges(root)
    assert edges.resolve((("a", "value"), ("a", "value"))) == 1 and edges.resolve((("a", "parts"), ("i", 0))).value == 2
    assert edges.changes() == {}
    root.parts = [root.parts[0]]  # a container made afresh: the steps out of it followed as it is now
    moved = edges.changes()
    assert list(moved) == [edges.indices[(("a", "parts"),)]]
    root.parts[0] = replaced = Record(3)
    assert edges.changes()[edges.indices[(("a", "parts"), ("i", 0))]] is replaced
    root.parts = []
    assert edges.changes() is None  # a path that no longer leads anywhere


class Accessor:
    def __init__(self, value):
        self.value = value


class Replacing:
    """An env that makes a new accessor at every step (MyoSuite's `_accessor`)."""

    def __init__(self):
        self.accessor, self.steps, self.rng = Accessor(0), 0, np.random.default_rng(0)

    def step(self):
        self.steps += 1
        self.accessor = Accessor(self.rng.random())


def test_an_object_the_env_replaces_at_every_step_is_rebound_alone():
    env = Replacing()
    graph = GraphState(env, global_rngs=False)
    blob = graph.snapshot()
    first_draw = np.random.default_rng(0).random()
    for _ in range(4):
        env.step()
        graph.restore(blob)
        assert env.steps == 0 and env.accessor.value == 0 and env.rng.random() == first_draw
    (bound,) = graph._bound.values()
    assert bound.moving == {("o", 1)} and ("o", 1) not in bound.template.fixed
    assert bound.direct is not None and ("o", 1) not in bound.direct.fixed  # set straight in, the accessor resolved
    first = env.accessor
    env.step()
    replaced = env.accessor
    graph.restore(blob)
    assert env.accessor is replaced and first.value == 0  # the env's new object set in place, the old untouched
    assert graph._bound[id(bound.read)] is bound  # still the same binding: nothing resolved again from the start


class Holds:
    """An env whose objects hold every kind of value as attributes: one array held by two objects, a record, a list
    the record holds."""

    def __init__(self, drop: tuple[str, ...]):
        self.values = {k: v for k, v in everything().items() if k not in drop}
        self.part = Record([1])
        self.part.array = np.arange(3.0)
        self.array = self.part.array
        self.rng = np.random.default_rng(0)


@pytest.mark.parametrize("drop, direct", [(("slotted", "table", "self"), True), ((), False)])
def test_a_bound_restore_sets_each_objects_attributes_as_a_first_restore_does(drop, direct):
    """From the second restore on, a snapshot whose objects hold only attributes is set straight into them from its
    template (`compile_direct`: no state dict or tuple made between); one with an object of slots or items (`Slotted`,
    `Table`) through the states. Either way the graph is the one built, sharing kept, its arrays fresh each time."""
    env = Holds(drop)
    graph = GraphState(env, global_rngs=False)
    blob = graph.snapshot()
    arrays = []
    for _ in range(4):
        env.values["shared"].append("changed")
        env.part.array[:] = 9.0
        env.array, env.part.value, env.part.extra = np.zeros(1), None, "added"
        env.rng.random()
        graph.restore(blob)
        assert same(vars(env), vars(Holds(drop)))
        assert env.array is env.part.array and not hasattr(env.part, "extra")
        arrays.append(env.array)
    assert len({id(a) for a in arrays}) == len(arrays)
    (bound,) = graph._bound.values()
    assert (bound.direct is not None) is direct
