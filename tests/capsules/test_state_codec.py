"""`capsules.state_codec`: Python state a capsule carries, read without running anything it names, within
bounds set before anything is allocated."""

from __future__ import annotations

import collections
import enum
import math
import struct
import tracemalloc
import xml.etree.ElementTree as ET
from typing import NamedTuple

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from capsule_rollout.capsules import state_codec as sc
from capsule_rollout.capsules.state_codec import StateDecodeError, StateEncodeError, decode, encode


class Color(enum.Enum):
    RED = 1
    BLUE = 2


class Point(NamedTuple):
    x: int
    y: float


class Plain:
    def __init__(self, a=None):
        self.a = a

    def method(self):
        return self.a


class Slotted:
    __slots__ = ("u", "v")


class Names:
    """The names a test's reader resolves: this module's classes, and the safe types."""

    def __init__(self, *extra: str) -> None:
        self.allowed = {f"{__name__}:{n}" for n in ("Color", "Point", "Plain", "Slotted")} | set(extra)

    def lookup(self, module: str, qualname: str, purpose: str):
        key = f"{module}:{qualname}"
        if key not in self.allowed and key not in sc.SAFE_TYPES:
            raise StateDecodeError(f"names {key}: refused")
        return sc.loaded(module, qualname)


def roundtrip(value, names=None):
    data = encode(value)
    return decode(data, names or Names()), data


def _equal(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return type(b) is np.ndarray and a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return type(a) is type(b) and list(a) == list(b) and all(_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


leaves = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**200), 2**200), st.floats(allow_nan=True), st.text(max_size=20),
    st.binary(max_size=20), st.complex_numbers(allow_nan=False),
    st.builds(lambda n, dt: np.arange(n).astype(dt), st.integers(0, 12), st.sampled_from(["<f8", "<i4", "|u1", "|b1"])),
)
values = st.recursive(leaves, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.tuples(inner, inner),
    st.dictionaries(st.one_of(st.text(max_size=5), st.integers()), inner, max_size=5)), max_leaves=30)


@given(values)
def test_any_plain_value_comes_back_equal_and_writes_the_same_bytes_again(value):
    back, data = roundtrip(value)
    assert _equal(value, back)
    assert encode(back) == data


def test_kinds_beyond_plain_values_come_back():
    gen = torch.Generator().manual_seed(5)
    slotted = Slotted()
    slotted.u = [1]
    tree = ET.Element("mujoco", {"model": "m"})
    ET.SubElement(tree, "worldbody").text = "x"
    value = {
        "enum": Color.BLUE, "point": Point(3, 2.5), "obj": Plain(a={"k": (1, 2)}), "slotted": slotted,
        "set": {1, 2, 3}, "frozen": frozenset({"a"}), "od": collections.OrderedDict(b=1, a=2),
        "dd": collections.defaultdict(list, {"x": [1]}), "deque": collections.deque([1, 2], maxlen=4),
        "scalar": np.float32(1.5), "dtype": np.dtype("<i2"), "struct": np.zeros(2, [("a", "<f4"), ("b", "<i8")]),
        "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)), "readonly": np.ones(3),
        "tensor": torch.arange(4, dtype=torch.float32), "param": torch.nn.Parameter(torch.ones(2)),
        "gen": gen, "slice": slice(1, None, 2), "range": range(0, 10, 3), "bytes": bytearray(b"ab"),
        "type": Plain, "fn": math.sqrt, "xml": tree, "ellipsis": ...,
    }
    value["readonly"].flags.writeable = False
    back, data = roundtrip(value, Names("math:sqrt"))
    assert encode(back) == data  # canonical: what was read writes the same bytes
    assert back["enum"] is Color.BLUE and back["point"] == Point(3, 2.5) and type(back["point"]) is Point
    assert type(back["obj"]) is Plain and back["obj"].a == {"k": (1, 2)}
    assert back["slotted"].u == [1] and not hasattr(back["slotted"], "v")
    assert back["set"] == {1, 2, 3} and back["frozen"] == frozenset({"a"}) and list(back["od"]) == ["b", "a"]
    assert back["dd"]["missing"] == [] and back["deque"].maxlen == 4 and list(back["deque"]) == [1, 2]
    assert back["scalar"] == np.float32(1.5) and type(back["scalar"]) is np.float32 and back["dtype"] == np.dtype("<i2")
    assert back["struct"].dtype == value["struct"].dtype
    assert np.array_equal(back["fortran"], value["fortran"]) and not back["readonly"].flags.writeable
    assert torch.equal(back["tensor"], value["tensor"]) and isinstance(back["param"], torch.nn.Parameter)
    assert torch.equal(back["gen"].get_state(), gen.get_state())
    assert back["slice"] == slice(1, None, 2) and back["range"] == range(0, 10, 3) and back["bytes"] == b"ab"
    assert back["type"] is Plain and back["fn"] is math.sqrt and back["ellipsis"] is ...
    assert ET.tostring(back["xml"]) == ET.tostring(tree)


def test_sharing_cycles_and_bound_methods_are_kept():
    shared = [1, 2]
    loop: list = []
    loop.append(loop)
    obj = Plain()
    obj.a = obj  # an instance that holds itself
    value = [shared, shared, loop, obj, obj.method, {"same": shared}]
    back, _ = roundtrip(value)
    assert back[0] is back[1] is back[5]["same"]
    assert back[2][0] is back[2]
    assert back[3].a is back[3]
    assert back[4].__self__ is back[3] and back[4]() is back[3]


def test_an_array_of_python_objects_is_its_items():
    value = np.empty((2, 2), object)
    value[0, 0], value[0, 1], value[1, 0], value[1, 1] = None, np.zeros(3), [1, 2], "x"
    back, data = roundtrip([value, value])
    assert back[0] is back[1] and back[0].dtype == object and back[0].shape == (2, 2)
    assert back[0][0, 0] is None and np.array_equal(back[0][0, 1], np.zeros(3)) and back[0][1, 0] == [1, 2]
    assert encode(back) == data


def test_what_it_cannot_hold_is_named_when_written():
    with pytest.raises(StateEncodeError, match="builtins.object cannot be saved by value"):
        encode(np.array([object()]))
    with pytest.raises(StateEncodeError, match="not found again"):
        encode(lambda: 0)


# -- reading a hostile stream ---------------------------------------------------------------------------

def _str(s: str) -> bytes:
    data = s.encode()
    return sc._varint(len(data)) + data


def _global(module: str, qualname: str) -> bytes:
    return bytes([sc.GLOBAL]) + _str(module) + _str(qualname)


@pytest.mark.parametrize(("stream", "refused"), [
    (_global("os", "system"), "names os:system"),
    (_global("builtins", "getattr"), "names builtins:getattr"),
    (_global("builtins", "eval"), "names builtins:eval"),
    (bytes([sc.OBJECT]) + _global("subprocess", "Popen") + bytes([sc.NONE] * 3), "names subprocess:Popen"),
    (bytes([sc.ENUM]) + _global("os", "environ") + _str("PATH"), "names os:environ"),
    (bytes([sc.SUBCLASS]) + _global("os", "PathLike") + bytes([sc.NONE, sc.NONE]), "names os:PathLike"),
])
def test_a_name_outside_the_namespace_is_refused_before_anything_is_made(stream, refused):
    with pytest.raises(StateDecodeError, match=refused):
        decode(sc.MAGIC + stream, Names())


def test_a_bound_method_is_only_a_method_of_the_class():
    plain = bytes([sc.OBJECT]) + _global(__name__, "Plain") + bytes([sc.NONE, sc.DICT, 0, sc.NONE])
    assert decode(sc.MAGIC + bytes([sc.METHOD]) + plain + _str("method"), Names()).__func__ is Plain.method
    with pytest.raises(StateDecodeError, match="no method '__class__'"):  # an attribute, not a function
        decode(sc.MAGIC + bytes([sc.METHOD]) + plain + _str("__class__"), Names())
    with pytest.raises(StateDecodeError, match="no method 'nothing'"):
        decode(sc.MAGIC + bytes([sc.METHOD]) + plain + _str("nothing"), Names())


def _array(dtype: str, shape: tuple, nbytes: int, data: bytes = b"") -> bytes:
    out = bytes([sc.ARRAY, sc.STR]) + _str(dtype) + sc._varint(len(shape))
    for n in shape:
        out += sc._varint(n)
    return out + b"\x01" + sc._varint(nbytes) + data


@pytest.mark.parametrize(("stream", "refused"), [
    (bytes([sc.LIST]) + sc._varint(10**9), "claims 1,000,000,000 items"),
    (bytes([sc.DICT]) + sc._varint(5) + bytes([sc.NONE] * 9), "claims 5 items"),
    (bytes([sc.STR]) + sc._varint(2**40), "claims 1,099,511,627,776 bytes"),
    (bytes([sc.INT]) + sc._varint(10**6), "integer of 1,000,000 bytes"),
    (_array("<f8", (10**6, 10**6), 8 * 10**12), "claims 8,000,000,000,000 bytes, more than the 0 left"),
    (_array("<f8", (4,), 8, b"\0" * 8), r"shape \(4,\) and dtype float64 given 8 bytes"),
    (_array("O", (1,), 8, b"\0" * 8), "dtype of Python objects"),
    (_array("<f8", (1,) * 40, 8, b"\0" * 8), "40 dimensions"),
    (bytes([sc.LIST, 1] * 300) + bytes([sc.NONE]), "nested more than"),
    (bytes([sc.MEMO, 3]), "back reference to value 3"),
    (bytes([sc.NONE, sc.NONE]), "1 bytes follow"),
    (bytes([0x7F]), "unknown tag"),
    (bytes([sc.RANGE, sc.NONE, sc.NONE, sc.NONE]), "range of non-integers"),
    (bytes([sc.SET, 1, sc.LIST, 0]), "cannot be hashed"),
    (bytes([sc.PERSISTENT, sc.INT, 1, 1]), "refers to an object of the caller"),
])
def test_malformed_or_oversized_streams_are_refused(stream, refused):
    with pytest.raises(StateDecodeError, match=refused):
        decode(sc.MAGIC + stream, Names())


@pytest.mark.parametrize("stream", [b"", b"\x80\x05N.", b"CRS"])  # nothing, a pickle, a truncated magic
def test_what_is_not_this_format_is_refused(stream):
    with pytest.raises(StateDecodeError, match="not Python state in this project's format"):
        decode(stream, Names())


@pytest.mark.parametrize(("item", "over"), [
    (bytes([sc.DEQUE, sc.NONE, 0]), True),  # 3 bytes, 760 in memory
    (bytes([sc.SET, 0]), True),  # 2 bytes, 216
    (bytes([sc.DICT, 0]), False),  # 2 bytes, 64: under the bound
    (bytes([sc.OBJECT]) + _global(__name__, "Plain") + bytes([sc.DICT, 0, sc.DICT, 0, sc.NONE]), False),
])
def test_a_stream_of_amplifiers_never_makes_more_than_its_bound(item, over):
    """The worst amplifiers a stream can name (empty containers, empty instances), 256 KiB of them: the reader
    allocates at most `MEMORY_PER_BYTE` x its size + 1 MiB; what would make more is refused on the way."""
    n = (1 << 18) // len(item)
    stream = sc.MAGIC + bytes([sc.LIST]) + sc._varint(n) + item * n
    bound = sc.MEMORY_PER_BYTE * len(stream) + (1 << 20)
    tracemalloc.start()
    try:
        try:
            decode(stream, Names())
            refused = False
        except StateDecodeError as exc:
            assert "in memory: refused" in str(exc)
            refused = True
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < bound, f"{peak:,} bytes allocated for a {len(stream):,}-byte stream (bound {bound:,})"
    assert refused == over


def test_floats_keep_their_bits():
    nan = struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_0000_0001))[0]
    back, _ = roundtrip([nan, -0.0, math.inf])
    assert struct.pack("<d", back[0]) == struct.pack("<d", nan)
    assert math.copysign(1, back[1]) == -1 and back[2] == math.inf
