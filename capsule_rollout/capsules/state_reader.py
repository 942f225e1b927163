"""Reading Python state in `capsules.state_codec`'s format: `Decoder`, which runs nothing a stream names, bounds
every size before it allocates (copies of values it built included), bounds nesting over the values it builds
(back references included: a chain of tuples, each holding the one before, is as deep as it is long), refuses
mappings and sets whose keys share a hash past `MAX_SAME_HASH` (decode time stays linear in the input) and fails
with `StateDecodeError` alone, whatever the bytes (see `state_codec`)."""

from __future__ import annotations

import collections
import enum
import functools
import math
import struct
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from capsule_rollout.capsules.state_codec import (
    _SUBCLASS_BASES,
    ARRAY,
    BYTEARRAY,
    BYTES,
    COMPLEX,
    DDICT,
    DEQUE,
    DICT,
    DTYPE,
    ELEMENT,
    ELLIPSIS,
    ENUM,
    FALSE,
    FLOAT,
    FLOATS,
    FROZENSET,
    GLOBAL,
    INT,
    INTS,
    LIST,
    MAGIC,
    MAX_DEPTH,
    MAX_INT_BYTES,
    MAX_NDIM,
    MAX_SAME_HASH,
    MEMO,
    MEMORY_PER_BYTE,
    METHOD,
    NONE,
    NOTIMPL,
    NPSCALAR,
    OBJECT,
    OBJECT_ARRAY,
    ODICT,
    PERSISTENT,
    RANGE,
    SET,
    SLICE,
    SMALLINT,
    STR,
    SUBCLASS,
    TENSOR,
    TORCH_DTYPE_NAMES,
    TORCH_GEN,
    TRUE,
    TUPLE,
    Namespace,
    StateDecodeError,
    _slot_names,
    bound_method,
    new_instance,
)


class Decoder:
    """Reads one value written by `Encoder`, resolving references through `namespace` and `persistent`."""

    def __init__(self, data: bytes | memoryview, namespace: Namespace,
                 persistent: Callable[[Any], Any] | None = None) -> None:
        self.data = bytes(data)
        self.end = len(self.data)
        self.at = 0
        self.namespace = namespace
        self.persistent = persistent
        self.bind: Callable[[Any, str], Any] = bound_method  # a bound method from its owner and name
        self.built: dict[int, str] = {}  # instances made by `__new__` here: id -> "object" | "subclass"
        self.memo: list[Any] = []
        self.heights: dict[int, int] = {}  # memo index -> how deep the value it holds nests (0 when absent)
        self.deepest = 0  # the deepest nesting reached inside the value being read, back references included
        self.budget = MEMORY_PER_BYTE * self.end + (1 << 20)
        self.table: list[Callable[[int], Any] | None] = [None] * 256
        for tags, read in (((NONE,), lambda d: None), ((FALSE,), lambda d: False), ((TRUE,), lambda d: True),
                           ((SMALLINT,), self._smallint), ((INT,), lambda d: self._int()), ((FLOAT,), self._float),
                           ((COMPLEX,), self._complex), ((STR,), lambda d: self._str()),
                           ((BYTES,), self._bytes), ((ELLIPSIS,), lambda d: Ellipsis),
                           ((NOTIMPL,), lambda d: NotImplemented), ((SLICE, RANGE), None),
                           ((GLOBAL,), self._global), ((ENUM,), self._enum), ((METHOD,), self._method),
                           ((PERSISTENT,), self._persistent), ((MEMO,), self._memo), ((DTYPE,), self._dtype),
                           ((NPSCALAR,), self._npscalar), ((ARRAY,), self._array), ((TENSOR,), lambda d: self._tensor()),
                           ((TORCH_GEN,), lambda d: self._torch_generator()), ((ELEMENT,), self._element),
                           ((OBJECT_ARRAY,), self._object_array),
                           ((TUPLE,), self._tuple), ((OBJECT,), self._object), ((SUBCLASS,), self._subclass),
                           ((INTS, FLOATS), None),
                           ((LIST, DICT, SET, FROZENSET, ODICT, DDICT, DEQUE, BYTEARRAY), self._container)):
            for tag in tags:
                # containers straight to their reader (a partial adds no Python frame: nesting 200 deep holds 400
                # frames, and an error raised there makes each a frame object as it unwinds)
                self.table[tag] = (read if read is not None and read != self._container
                                   else functools.partial(read or self._tagged, tag))

    def _charge(self, *objs: Any) -> None:
        for obj in objs:
            self.budget -= sys.getsizeof(obj) + 32  # with what holds it: its memo and container slots, malloc's own
        if self.budget < 0:
            raise StateDecodeError(f"the state would take more than {MEMORY_PER_BYTE}x its {self.end:,} "
                                   "bytes in memory: refused")

    def _spend(self, nbytes: int) -> None:
        """Charge `nbytes` about to be allocated, before they are."""
        self.budget -= nbytes
        if self.budget < 0:
            raise StateDecodeError(f"the state would take more than {MEMORY_PER_BYTE}x its {self.end:,} "
                                   "bytes in memory: refused")

    def decode(self) -> Any:
        if self.data[:len(MAGIC)] != MAGIC:
            raise StateDecodeError("not Python state in this project's format (an older capsule, or not a capsule's "
                                   "state at all): take a new snapshot")
        self.at = len(MAGIC)
        try:
            value = self._value(0)
        except StateDecodeError:
            raise
        except MemoryError:
            raise StateDecodeError("the state asks for more memory than this process has: refused") from None
        except RecursionError:
            raise StateDecodeError("the state nests deeper than Python can follow: refused") from None
        except Exception as exc:  # noqa: BLE001 - whatever the bytes make numpy, torch or a class raise
            raise StateDecodeError(f"the state is refused ({type(exc).__name__}: {exc})") from None
        if self.at != self.end:
            raise StateDecodeError(f"{self.end - self.at} bytes follow the state")
        return value

    # -- primitives
    def _left(self) -> int:
        return self.end - self.at

    def _byte(self) -> int:
        at = self.at
        if at >= self.end:
            raise StateDecodeError("the state ends early (truncated)")
        self.at = at + 1
        return self.data[at]

    def _varint(self) -> int:
        at = self.at
        if at < self.end:
            b = self.data[at]
            if b < 0x80:
                self.at = at + 1
                return b
        n, shift = 0, 0
        while True:
            b = self._byte()
            n |= (b & 0x7F) << shift
            if not b & 0x80:
                return n
            shift += 7
            if shift > 63:
                raise StateDecodeError("a length or count over 2**63")

    def _count(self, what: str, each: int = 1) -> int:
        """A count of items that take at least `each` bytes each: never more than the bytes left can hold."""
        n = self._varint()
        if n * each > self.end - self.at:
            raise StateDecodeError(f"{what} claims {n:,} items, more than the {self._left():,} bytes left can hold")
        return n

    def _raw(self, n: int) -> bytes:
        at = self.at
        if n > self.end - at:
            raise StateDecodeError(f"a field claims {n:,} bytes, more than the {self._left():,} left")
        self.at = at + n
        return self.data[at:at + n]

    def _str(self) -> str:
        n = self._varint()
        self.budget -= 4 * n + 56  # the bytes sliced, then the string (up to 4 a character): checked at the next charge
        try:
            return self._raw(n).decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            raise StateDecodeError("a string that is not UTF-8") from None

    def _bytes(self, depth: int) -> bytes:
        n = self._varint()
        self.budget -= n + 40
        return self._raw(n)

    def _int(self) -> int:
        n = self._varint()
        if n > MAX_INT_BYTES:
            raise StateDecodeError(f"an integer of {n:,} bytes (at most {MAX_INT_BYTES:,})")
        return int.from_bytes(self._raw(n), "little", signed=True)

    def _smallint(self, depth: int) -> int:
        z = self._varint()
        return (z >> 1) ^ -(z & 1)

    def _float(self, depth: int) -> float:
        return struct.unpack("<d", self._raw(8))[0]

    def _complex(self, depth: int) -> complex:
        re, im = struct.unpack("<dd", self._raw(16))
        return complex(re, im)

    def _dtype(self, depth: int) -> np.dtype:
        spec = self._value(depth + 1)
        if not isinstance(spec, (str, list)):
            raise StateDecodeError(f"a dtype given as {type(spec).__name__}")
        # a structured dtype copies its spec (a back reference to a long list is cheap to write): charged first
        self._spend(256 * (len(spec) if isinstance(spec, list) else 1) + 128)
        try:
            dt = np.dtype(spec)
        except (TypeError, ValueError) as exc:
            raise StateDecodeError(f"an invalid dtype ({exc})") from None
        if dt.hasobject:
            raise StateDecodeError("a dtype of Python objects: refused")
        return dt

    def _ref(self, purpose: str) -> Any:
        if self._byte() != GLOBAL:
            raise StateDecodeError("a class or function reference was expected")
        module, qualname = self._str(), self._str()
        return self.namespace.lookup(module, qualname, purpose)

    # -- values
    def _value(self, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise StateDecodeError(f"values nested more than {MAX_DEPTH} deep")
        if depth > self.deepest:
            self.deepest = depth
        at = self.at
        if at >= self.end:
            raise StateDecodeError("the state ends early (truncated)")
        self.at = at + 1
        read = self.table[self.data[at]]
        if read is None:
            raise StateDecodeError(f"unknown tag {self.data[at]:#x} (damaged, or not this format)")
        return read(depth)

    def _tagged(self, tag: int, depth: int) -> Any:
        if tag in (SLICE, RANGE):
            parts = [self._value(depth + 1) for _ in range(3)]
            if tag == SLICE:
                return slice(*parts)
            if not all(type(p) is int for p in parts) or parts[2] == 0:
                raise StateDecodeError("a range of non-integers or step 0")
            return range(*parts)
        if tag in (INTS, FLOATS):
            as_tuple = self._byte()
            n = self._count("a packed sequence", 8)
            self._spend(40 * n + 64)  # each number a Python object, and the sequence's slots
            out: Any = struct.unpack_from(f"<{n}{'q' if tag == INTS else 'd'}", self._raw(8 * n))
            out = out if as_tuple else list(out)
            self.memo.append(out)
            self._charge(out)
            return out
        return self._container(tag, depth)

    def _global(self, depth: int) -> Any:
        self.at -= 1
        return self._ref("value")

    def _enum(self, depth: int) -> Any:
        cls = self._ref("enum")
        name = self._str()
        if not (isinstance(cls, type) and issubclass(cls, enum.Enum)) or name not in cls.__members__:
            raise StateDecodeError(f"{getattr(cls, '__qualname__', cls)!r} has no enum member {name!r}")
        return cls.__members__[name]

    def _persistent(self, depth: int) -> Any:
        pid = self._value(depth + 1)
        if self.persistent is None:
            raise StateDecodeError("the state refers to an object of the caller, and none were given")
        return self.persistent(pid)

    def _memo(self, depth: int) -> Any:
        i = self._varint()
        if i >= len(self.memo):
            raise StateDecodeError(f"a back reference to value {i}, which is not defined yet")
        nested = depth + self.heights.get(i, 1)
        if nested > self.deepest:
            if nested > MAX_DEPTH:
                raise StateDecodeError(f"values nested more than {MAX_DEPTH} deep (through back references)")
            self.deepest = nested
        return self.memo[i]

    def _enter(self, depth: int) -> int:
        """Start measuring how deep a container read at `depth` nests; returns what to give `_leave`."""
        outer, self.deepest = self.deepest, depth
        return outer

    def _leave(self, i: int, depth: int, outer: int) -> None:
        """Record how deep the container at memo index `i` nests, for the back references to it."""
        height = self.deepest - depth
        if height > 1:  # a container of plain values nests one deep: only deeper ones are kept (and charged)
            self.heights[i] = height
            self.budget -= 104
        if outer > self.deepest:
            self.deepest = outer

    @staticmethod
    def _same_hash(counts: dict[int, int], key: Any, what: str) -> None:
        """Count `key`'s hash in `counts`; refuse past `MAX_SAME_HASH` keys of one hash (strings are hashed with a
        per-process secret, so only other keys are counted), or a key that cannot be hashed."""
        if type(key) is str:
            return
        try:
            h = hash(key)
        except TypeError as exc:
            raise StateDecodeError(f"{what} that cannot be hashed ({exc})") from None
        c = counts[h] = counts.get(h, 0) + 1
        if c > MAX_SAME_HASH:
            raise StateDecodeError(f"{what}s of which more than {MAX_SAME_HASH} share a hash (they would take "
                                   "quadratic time): refused")

    def _npscalar(self, depth: int) -> Any:
        dt = self._dtype(depth)
        data = self._raw(self._varint())
        if len(data) != dt.itemsize or dt.itemsize == 0:
            raise StateDecodeError(f"a numpy scalar of {dt} given {len(data)} bytes")
        return np.frombuffer(data, dt)[0]

    def _tuple(self, depth: int) -> tuple:
        n = self._count("a tuple")
        value = self._value
        outer = self._enter(depth)
        out = tuple([value(depth + 1) for _ in range(n)])
        self._leave(len(self.memo), depth, outer)
        self.memo.append(out)
        self._charge(out)
        return out

    def _container(self, tag: int, depth: int) -> Any:
        if tag == BYTEARRAY:
            out = bytearray(self._raw(self._varint()))
            self.memo.append(out)
            self._charge(out)
            return out
        if tag in (SET, FROZENSET):
            i = len(self.memo)
            self.memo.append(None)  # a set's members cannot refer back to it (unhashable)
            n = self._count("a set")
            outer = self._enter(depth)
            items = [self._value(depth + 1) for _ in range(n)]
            self._leave(i, depth, outer)
            counts: dict[int, int] = {}
            for k in items:
                self._same_hash(counts, k, "a set member")
            self._spend(64 * n)  # at least the set's table, before it is made
            try:
                out = set(items) if tag == SET else frozenset(items)
            except TypeError as exc:
                raise StateDecodeError(f"a set member that cannot be hashed ({exc})") from None
            self.budget += 64 * n
            self._charge(out, items)
            self.memo[i] = out
            return out
        outer = self._enter(depth)
        if tag == DDICT:
            i = len(self.memo)
            self.memo.append(None)
            factory = self._value(depth + 1)
            if factory is not None and not callable(factory):
                raise StateDecodeError("a defaultdict whose factory is not callable")
            out: Any = collections.defaultdict(factory)
            self.memo[i] = out
        elif tag == DEQUE:
            i = len(self.memo)
            self.memo.append(None)
            maxlen = self._value(depth + 1)
            if maxlen is not None and (type(maxlen) is not int or maxlen < 0):
                raise StateDecodeError("a deque of a bad maxlen")
            out = collections.deque(maxlen=maxlen)
            self.memo[i] = out
        else:
            i = len(self.memo)
            out = {LIST: list, DICT: dict, ODICT: collections.OrderedDict}[tag]()
            self.memo.append(out)
        self._charge(out)
        made = sys.getsizeof(out)
        value = self._value
        if isinstance(out, dict):
            n = self._count("a mapping", 2)
            counts = {}
            for _ in range(n):
                k = value(depth + 1)
                self._same_hash(counts, k, "a mapping key")
                try:
                    out[k] = value(depth + 1)
                except TypeError as exc:
                    raise StateDecodeError(f"a mapping key that cannot be hashed ({exc})") from None
        else:
            n = self._count("a sequence")
            for _ in range(n):
                out.append(value(depth + 1))
        self._leave(i, depth, outer)
        self.budget += made + 32  # charged again as filled
        self._charge(out)
        return out

    def _shape(self) -> tuple[int, ...]:
        ndim = self._varint()
        if ndim > MAX_NDIM:
            raise StateDecodeError(f"an array of {ndim} dimensions (at most {MAX_NDIM})")
        return tuple(self._varint() for _ in range(ndim))

    def _array(self, depth: int) -> np.ndarray:
        i = len(self.memo)
        self.memo.append(None)
        dt = self._dtype(depth)
        shape = self._shape()
        writeable = self._byte()
        n = self._varint()
        if math.prod(shape) * dt.itemsize != n:
            raise StateDecodeError(f"an array of shape {shape} and dtype {dt} given {n:,} bytes")
        if dt.itemsize == 0 and math.prod(shape):  # numpy makes such items a byte or more: refused, never allocated
            raise StateDecodeError(f"an array of {math.prod(shape):,} items of no bytes ({dt})")
        data = self._raw(n)
        out = np.frombuffer(data, dt).reshape(shape).copy() if n else np.zeros(shape, dt)
        out.flags.writeable = bool(writeable)
        self._charge(out)
        self.memo[i] = out
        return out

    def _object_array(self, depth: int) -> np.ndarray:
        i = len(self.memo)
        self.memo.append(None)
        shape = self._shape()
        writeable = self._byte()
        size = math.prod(shape)
        if size > self._left():  # each item takes at least a byte of the list that follows
            raise StateDecodeError(f"an array of Python objects of shape {shape}, more items than the "
                                   f"{self._left():,} bytes left can hold")
        self._spend(8 * size + 128)  # before numpy allocates it
        out = np.empty(shape, object)
        self.memo[i] = out  # its items may refer back to it
        outer = self._enter(depth)
        items = self._value(depth + 1)
        self._leave(i, depth, outer)
        if not isinstance(items, list) or len(items) != out.size:
            raise StateDecodeError(f"an array of Python objects of shape {shape} given {type(items).__name__} "
                                   f"of {len(items) if isinstance(items, list) else '?'} items")
        flat = out.reshape(-1)
        for j, v in enumerate(items):
            flat[j] = v
        out.flags.writeable = bool(writeable)
        return out

    def _tensor(self) -> Any:
        torch = sys.modules.get("torch")
        if torch is None:
            raise StateDecodeError("the state holds a torch tensor, and torch is not loaded here")
        i = len(self.memo)
        self.memo.append(None)
        name = self._str()
        if name not in TORCH_DTYPE_NAMES:
            raise StateDecodeError(f"a torch tensor of dtype {name!r}: refused")
        dtype = getattr(torch, name)
        shape = self._shape()
        flags = self._byte()
        n = self._varint()
        itemsize = torch.empty((), dtype=dtype).element_size()
        if math.prod(shape) * itemsize != n:
            raise StateDecodeError(f"a tensor of shape {shape} and dtype {name} given {n:,} bytes")
        data = self._raw(n)
        self._spend(2 * n + 200)  # a copy to own the bytes, then the tensor's
        t = (torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape).clone() if n
             else torch.zeros(shape, dtype=dtype))
        if flags & 1:
            t = torch.nn.Parameter(t, requires_grad=bool(flags & 2))
        elif flags & 2:
            t.requires_grad_(True)
        self.memo[i] = t
        return t

    def _torch_generator(self) -> Any:
        torch = sys.modules.get("torch")
        if torch is None:
            raise StateDecodeError("the state holds a torch generator, and torch is not loaded here")
        i = len(self.memo)
        self.memo.append(None)
        data = self._raw(self._varint())
        g = torch.Generator()
        try:
            g.set_state(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        except (RuntimeError, ValueError) as exc:
            raise StateDecodeError(f"a torch generator state that torch refuses ({exc})") from None
        self.memo[i] = g
        return g

    def _element(self, depth: int) -> Any:
        et = sys.modules.get("xml.etree.ElementTree")
        if et is None:
            raise StateDecodeError("the state holds an XML element, and xml.etree is not loaded here")
        i = len(self.memo)
        self.memo.append(None)
        outer = self._enter(depth)
        tag, attrib, text, tail = (self._value(depth + 1) for _ in range(4))
        if not isinstance(tag, str) or not isinstance(attrib, dict) or not all(
                isinstance(v, (str, type(None))) for v in (text, tail)):
            raise StateDecodeError("a malformed XML element")
        self._spend(2 * sys.getsizeof(attrib) + 200)  # the element copies its attributes (a table of its own)
        element = et.Element(tag, attrib)
        element.text, element.tail = text, tail
        self.memo[i] = element
        children = self._value(depth + 1)
        if not isinstance(children, list) or not all(type(c) is et.Element for c in children):
            raise StateDecodeError("an XML element with children that are not elements")
        self._spend(8 * len(children) + 64)  # and its children's list
        element.extend(children)
        self._leave(i, depth, outer)
        return element

    def _method(self, depth: int) -> Any:
        owner = self._value(depth + 1)
        name = self._str()
        bound = self.bind(owner, name)
        self._charge(bound)
        return bound

    def _class(self) -> type:
        cls = self._ref("class")
        if not isinstance(cls, type):
            raise StateDecodeError(f"{cls!r} is not a class")
        return cls

    def _object(self, depth: int) -> Any:
        cls = self._class()
        obj = new_instance(cls)
        i = len(self.memo)
        self.memo.append(obj)
        self.built[id(obj)] = "object"
        self._charge(obj)
        outer = self._enter(depth)
        d, slots, items = (self._value(depth + 1) for _ in range(3))
        self._leave(i, depth, outer)
        if d is not None:
            if not isinstance(d, dict) or not isinstance(getattr(obj, "__dict__", None), dict):
                raise StateDecodeError(f"a {cls.__qualname__} given attributes it cannot hold")
            self._spend(sys.getsizeof(d))  # copied into the instance's own
            obj.__dict__.update(d)
        if not isinstance(slots, dict):
            raise StateDecodeError(f"a {cls.__qualname__} given slots as {type(slots).__name__}")
        allowed = set(_slot_names(cls))
        for k, v in slots.items():
            if k not in allowed:
                raise StateDecodeError(f"{cls.__qualname__} has no slot {k!r}")
            object.__setattr__(obj, k, v)
        if items is not None:
            if isinstance(obj, dict) and isinstance(items, dict):
                self._spend(sys.getsizeof(items))  # copied into the instance
                dict.update(obj, items)
            elif isinstance(obj, list) and isinstance(items, list):
                self._spend(sys.getsizeof(items))
                list.extend(obj, items)
            else:
                raise StateDecodeError(f"a {cls.__qualname__} given items it cannot hold")
        self.memo[i] = obj
        return obj

    def _subclass(self, depth: int) -> Any:
        cls = self._class()
        base = next((b for b in _SUBCLASS_BASES if issubclass(cls, b)), None)
        outer = self._enter(depth)
        value = self._value(depth + 1)
        if base is None or type(value) is not base:
            raise StateDecodeError(f"{getattr(cls, '__qualname__', cls)!r} is not a subclass of "
                                   f"{type(value).__name__}")
        self._spend(sys.getsizeof(value) + 64)  # the instance copies its value
        obj = base.__new__(cls, value)
        i = len(self.memo)
        self.memo.append(obj)
        self.built[id(obj)] = "subclass"
        d = self._value(depth + 1)
        self._leave(i, depth, outer)
        if d is not None:
            if not isinstance(d, dict) or not isinstance(getattr(obj, "__dict__", None), dict):
                raise StateDecodeError(f"a {cls.__qualname__} given attributes it cannot hold")
            self._spend(sys.getsizeof(d))
            obj.__dict__.update(d)
        return obj

