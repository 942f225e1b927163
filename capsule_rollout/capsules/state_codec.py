"""A format for Python state in a capsule that cannot run code when it is read.

A capsule carries Python state where a component keeps some outside its buffers (the graph capture of an
env: `envs.object_graph`). Capsules are shared to reproduce an episode, so reading one must never call a
function the file names: this format is not pickle. It is a tagged tree of values the project writes and
reads itself:

- plain values: None, bool, int, float, complex, str, bytes, bytearray, slice, range, Ellipsis;
- containers: list, tuple, dict, set, frozenset, OrderedDict, defaultdict, deque (sharing and cycles kept
  through back references);
- numpy arrays, scalars and dtypes, torch tensors, parameters and CPU generators (an array of Python objects is
  its shape and its items, each a value of this list),
  `xml.etree.ElementTree` elements (a suite's model XML);
- references to existing objects, never called: a class, function or module by name (`Namespace.lookup`
  decides which names a reader accepts), an enum member by name, a bound method by its owner and name, and
  a caller's own objects by id (`persistent`);
- instances rebuilt by value: `cls.__new__(cls)` of a class the namespace allows, then its `__dict__` and
  slots set from decoded values (never `__setstate__`), or `base.__new__(cls, value)` for a subclass of int,
  float, str, bytes or tuple (a named tuple, an int flag).

Reading bounds every size before it allocates: a count, string or array may not claim more bytes than are
left in the input, an array's bytes must equal its shape times its item size, integers are at most
`MAX_INT_BYTES` long and nesting at most `MAX_DEPTH` deep, and what it makes in all at most `MEMORY_PER_BYTE`
times the input's bytes plus 1 MiB (an empty deque costs 3 bytes to write and 760 to make). Any problem is a
`StateDecodeError` naming what was refused. Writing is canonical: the same values give the same bytes (arrays
in C order, no identity of strings).
"""

from __future__ import annotations

import collections
import functools
import sys
import types
from collections.abc import Callable
from typing import Any, Protocol

MAGIC = b"CRS1"
MAX_INT_BYTES = 4096
MAX_DEPTH = 200
MAX_NDIM = 32
MAX_SAME_HASH = 16
"""At most this many keys of one mapping or members of one set may share a hash: more decode in quadratic time
(integers that differ by multiples of 2**61 - 1 share one)."""
MEMORY_PER_BYTE = 64
"""What reading may allocate: at most this many bytes of Python objects per byte of state, plus 1 MiB (the
containers and instances it makes are counted by their size as they are made and filled)."""

# tags: one byte each
(NONE, FALSE, TRUE, INT, FLOAT, COMPLEX, STR, BYTES, BYTEARRAY, SLICE, RANGE, ELLIPSIS, NOTIMPL) = range(13)
(LIST, TUPLE, DICT, SET, FROZENSET, ODICT, DDICT, DEQUE) = range(0x10, 0x18)
(ARRAY, NPSCALAR, DTYPE, TENSOR, TORCH_GEN, ELEMENT, OBJECT_ARRAY) = range(0x20, 0x27)
(GLOBAL, ENUM, METHOD, PERSISTENT, MEMO, OBJECT, SUBCLASS) = range(0x30, 0x37)
(SMALLINT, INTS, FLOATS) = range(0x40, 0x43)  # an int of 63 bits or less (zigzag varint); packed sequences
PACKED_MIN = 8
"""Lists and tuples of at least this many ints (each within int64) or floats are written packed."""
_I64 = (-(1 << 63), (1 << 63) - 1)

_SUBCLASS_BASES = (int, float, str, bytes, tuple)


class StateDecodeError(ValueError):
    """A capsule's Python state that this reader refuses: malformed, over a bound, or naming a class or
    function the namespace does not allow."""


class StateNameError(StateDecodeError):
    """A reference to a name the reader's namespace does not accept (`Namespace.lookup` raises it)."""


class StateEncodeError(ValueError):
    """A value this format cannot hold; the message names its type."""


class Namespace(Protocol):
    """Which names a reader resolves: `lookup` returns the object a (module, qualname) reference names, or
    raises `StateNameError`. `purpose` is "value" (held as is), "class" (an instance will be made with
    `__new__`) or "enum"."""

    def lookup(self, module: str, qualname: str, purpose: str) -> Any: ...


SAFE_TYPES = frozenset({
    "builtins:object", "builtins:int", "builtins:float", "builtins:complex", "builtins:str", "builtins:bytes",
    "builtins:bool", "builtins:list", "builtins:tuple", "builtins:dict", "builtins:set", "builtins:frozenset",
    "builtins:bytearray", "collections:OrderedDict", "collections:deque", "collections:defaultdict",
})
"""Classes any reader may name as values (a defaultdict's `list` factory...)."""


def loaded(module: str, qualname: str) -> Any:
    """What `module:qualname` names among modules this process has imported already (a capsule never makes
    Python import anything); None when nothing. Only attributes found in a module's or class's own `__dict__`
    are followed, so no property or `__getattr__` runs."""
    x: Any = sys.modules.get(module)
    if x is None:
        return None
    if not qualname:
        return x
    for part in qualname.split("."):
        d = getattr(x, "__dict__", None)
        if not isinstance(d, (dict, types.MappingProxyType)) or part not in d:
            return None
        x = d[part]
        if isinstance(x, (staticmethod, classmethod)):
            return None
    return x


def names_of(x: Any) -> list[tuple[str, str]]:
    """The (module, qualname) pairs under which a class, function, builtin or module says it lives: the writer
    names `x` by the first that finds it again, and the reader accepts a name only when the object it finds there
    says it lives there (a name re-exported elsewhere, `gymnasium.core:Any` for `typing.Any`, is refused)."""
    if isinstance(x, types.ModuleType):
        return [(x.__name__, "")]
    names: list[tuple[str, str]] = []
    module = getattr(x, "__module__", None)
    owner = getattr(x, "__objclass__", None) or (x.__self__ if isinstance(getattr(x, "__self__", None), type)
                                                 else None)
    if module is None and owner is not None:
        module = owner.__module__
    self_module = getattr(x, "__self__", None)
    if module is None and isinstance(self_module, types.ModuleType):
        module = self_module.__name__
    for name in (getattr(x, "__qualname__", None), getattr(x, "__name__", None)):
        if isinstance(module, str) and isinstance(name, str) and (module, name) not in names:
            names.append((module, name))
    return names


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement, not a C extension's static type
_PLAIN_NEW = frozenset({object.__new__, dict.__new__, list.__new__, set.__new__,
                        *(vars(k)["__new__"] for k in (collections.OrderedDict, collections.defaultdict,
                                                       collections.deque) if "__new__" in vars(k))})


def new_instance(cls: type) -> Any:
    """`cls.__new__(cls)` for a class made by a class statement whose `__new__` is that of `object`, `dict`,
    `list` or `set` (StateDecodeError otherwise): no `__new__` of the class's own runs, and no extension type
    (numpy's bit generators, MuJoCo's structs) is made without its constructor, which could crash the process
    at its first use."""
    if cls is object:  # a bare sentinel
        return object()
    if not isinstance(cls, type) or not cls.__flags__ & _HEAPTYPE or issubclass(cls, (type, types.ModuleType)):
        raise StateDecodeError(f"{getattr(cls, '__qualname__', cls)!r} is a built-in, extension or meta class, "
                               "never made from a capsule's bytes")
    owner = next((k for k in cls.__mro__ if "__new__" in vars(k)), object)
    if owner.__flags__ & _HEAPTYPE or vars(owner)["__new__"] not in _PLAIN_NEW:
        raise StateDecodeError(f"{cls.__qualname__} is made by {owner.__qualname__}.__new__, which a capsule's bytes "
                               "never run")
    try:
        return cls.__new__(cls)
    except TypeError as exc:
        raise StateDecodeError(f"{cls.__qualname__} cannot be made without arguments ({exc})") from None


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _bound_to_instance(f: Any) -> bool:
    s = getattr(f, "__self__", None)
    return s is not None and not isinstance(s, (types.ModuleType, type))


def _is_torch(t: type, names: tuple[str, ...]) -> bool:
    if "torch" not in sys.modules:
        return False
    import torch

    return any(isinstance(getattr(torch, n, None), type) and issubclass(t, getattr(torch, n))
               for n in names) if t.__module__.startswith("torch") else False


def _is_element(t: type) -> bool:
    et = sys.modules.get("xml.etree.ElementTree")
    return et is not None and t is et.Element


@functools.cache
def _slot_names(t: type) -> tuple[str, ...]:
    out = []
    for k in t.__mro__:
        s = vars(k).get("__slots__", ())
        out += [s] if isinstance(s, str) else [n for n in s if n not in ("__dict__", "__weakref__")]
    return tuple(out)


TORCH_DTYPE_NAMES = frozenset({"float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8",
                               "uint8", "bool", "complex64", "complex128"})


def bound_method(owner: Any, name: str) -> Any:
    """`owner`'s method `name`, found only as a function (or a class method, for a class) in its class's own
    dictionaries: no attribute lookup of the owner runs (StateDecodeError otherwise)."""
    if isinstance(owner, type):  # a class method
        for k in owner.__mro__:
            attr = vars(k).get(name)
            if isinstance(attr, classmethod):
                return attr.__get__(None, owner)
            if attr is not None:
                break
        raise StateDecodeError(f"{owner.__qualname__} has no class method {name!r}")
    for k in type(owner).__mro__:
        attr = vars(k).get(name)
        if isinstance(attr, (types.FunctionType, types.MethodDescriptorType, types.WrapperDescriptorType)):
            return attr.__get__(owner, type(owner))
        if attr is not None:
            break
    raise StateDecodeError(f"{type(owner).__qualname__} has no method {name!r}")


def rebuild_object(cls: type, d: dict | None, slots: dict, items: Any) -> Any:
    """An instance as `Decoder` rebuilds one: `new_instance(cls)`, then its attributes, slots and items set."""
    obj = new_instance(cls)
    if d is not None:
        obj.__dict__.update(d)
    for k, v in slots.items():
        object.__setattr__(obj, k, v)
    if items is not None:
        dict.update(obj, items) if isinstance(obj, dict) else list.extend(obj, items)
    return obj


def rebuild_subclass(cls: type, value: Any, d: dict | None) -> Any:
    """A subclass of int, float, str, bytes or tuple as `Decoder` rebuilds one."""
    base = next(b for b in _SUBCLASS_BASES if issubclass(cls, b))
    obj = base.__new__(cls, value)
    if d is not None:
        obj.__dict__.update(d)
    return obj



def encode(value: Any, persistent: Callable[[Any], tuple | None] | None = None) -> bytes:
    """`value` in this format (`StateEncodeError` for what it cannot hold; `state_writer.Encoder`)."""
    from capsule_rollout.capsules.state_writer import Encoder

    return Encoder(persistent).encode(value)


def decode(data: bytes | memoryview, namespace: Namespace, persistent: Callable[[Any], Any] | None = None) -> Any:
    """The value `encode` wrote (`StateDecodeError` for anything refused; `state_reader.Decoder`)."""
    from capsule_rollout.capsules.state_reader import Decoder

    return Decoder(data, namespace, persistent).decode()
