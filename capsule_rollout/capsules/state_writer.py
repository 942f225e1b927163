"""Writing Python state in `capsules.state_codec`'s format: `Encoder`."""

from __future__ import annotations

import collections
import enum
import struct
import types
from collections.abc import Callable
from typing import Any

import numpy as np

from capsule_rollout.capsules.state_codec import (
    _I64,
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
    MEMO,
    METHOD,
    NONE,
    NOTIMPL,
    NPSCALAR,
    OBJECT,
    OBJECT_ARRAY,
    ODICT,
    PACKED_MIN,
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
    StateEncodeError,
    _bound_to_instance,
    _is_element,
    _is_torch,
    _slot_names,
    _varint,
    loaded,
    names_of,
)


def _ref_name(x: Any) -> tuple[str, str] | None:
    """(module, qualname) under which `x` (a class, function, builtin or module) can be found again."""
    for module, name in names_of(x):
        try:
            if loaded(module, name) is x:
                return module, name
        except Exception:  # noqa: BLE001 - a module that cannot be searched does not hold it
            continue
    return None


def _dtype_value(dt: np.dtype) -> Any:
    if dt.hasobject:
        raise StateEncodeError("an array of Python objects (dtype object) cannot be saved by value")
    if dt.fields is None and dt.subdtype is None:
        return dt.str
    return dt.descr


class Encoder:
    """Writes one value. `persistent(obj)` gives an id for the caller's own objects (written as a reference,
    resolved by the reader's `persistent`), or None to write `obj` by value."""

    def __init__(self, persistent: Callable[[Any], tuple | None] | None = None) -> None:
        self.persistent = persistent or (lambda obj: None)
        self.out = bytearray()
        self.memo: dict[int, int] = {}
        self.keep: list[Any] = []  # objects memoised by id stay alive until the end
        self.building: set[int] = set()

    def encode(self, value: Any) -> bytes:
        self.out += MAGIC
        self._value(value, 0)
        return bytes(self.out)

    def _remember(self, x: Any) -> None:
        self.memo[id(x)] = len(self.memo)
        self.keep.append(x)

    def _str(self, s: str) -> None:
        data = s.encode("utf-8", "surrogatepass")
        self.out += _varint(len(data))
        self.out += data

    def _int(self, n: int) -> None:
        data = n.to_bytes((n.bit_length() + 8) // 8 or 1, "little", signed=True)
        self.out += _varint(len(data))
        self.out += data

    def _ref(self, x: Any) -> None:
        name = _ref_name(x)
        if name is None:
            raise StateEncodeError(f"{x!r} cannot be saved: it is not found again by its module and name")
        self.out.append(GLOBAL)
        self._str(name[0])
        self._str(name[1])

    def _value(self, x: Any, depth: int) -> None:  # noqa: C901 - one branch per tag
        if depth > MAX_DEPTH:
            raise StateEncodeError(f"values nested more than {MAX_DEPTH} deep cannot be saved")
        out = self.out
        pid = self.persistent(x)
        if pid is not None:
            out.append(PERSISTENT)
            self._value(pid, depth + 1)
            return
        t = type(x)
        if x is None:
            out.append(NONE)
        elif t is bool:
            out.append(TRUE if x else FALSE)
        elif t is int:
            if -(1 << 62) <= x < (1 << 62):
                out.append(SMALLINT)
                out += _varint((x << 1) ^ (x >> 63))
            else:
                out.append(INT)
                self._int(x)
        elif t is float:
            out.append(FLOAT)
            out += struct.pack("<d", x)
        elif t is complex:
            out.append(COMPLEX)
            out += struct.pack("<dd", x.real, x.imag)
        elif t is str:
            out.append(STR)
            self._str(x)
        elif t is bytes:
            out.append(BYTES)
            out += _varint(len(x))
            out += x
        elif x is Ellipsis:
            out.append(ELLIPSIS)
        elif x is NotImplemented:
            out.append(NOTIMPL)
        elif t in (slice, range):
            out.append(SLICE if t is slice else RANGE)
            for v in (x.start, x.stop, x.step):
                self._value(v, depth + 1)
        elif isinstance(x, enum.Enum):
            out.append(ENUM)
            self._ref(t)
            self._str(x.name)
        elif isinstance(x, np.dtype):
            out.append(DTYPE)
            self._value(_dtype_value(x), depth + 1)
        elif isinstance(x, np.generic) and t.__module__ == "numpy":
            out.append(NPSCALAR)
            self._value(_dtype_value(x.dtype), depth + 1)
            data = x.tobytes()
            out += _varint(len(data))
            out += data
        elif isinstance(x, (type, types.FunctionType, types.BuiltinFunctionType, types.ModuleType,
                            types.MethodDescriptorType, types.WrapperDescriptorType, types.ClassMethodDescriptorType,
                            np.ufunc)) and not (isinstance(x, types.BuiltinFunctionType) and _bound_to_instance(x)):
            self._ref(x)
        elif isinstance(x, (types.MethodType, types.BuiltinMethodType, types.MethodWrapperType)):
            name = _ref_name(x) if isinstance(x, types.BuiltinMethodType) else None
            if name is not None:  # a module's bound function (numpy.random.rand): by name
                self._ref(x)
                return
            out.append(METHOD)
            self._value(x.__self__, depth + 1)
            self._str(x.__name__)
        elif id(x) in self.memo:
            out.append(MEMO)
            out += _varint(self.memo[id(x)])
        else:
            self._by_value(x, t, depth)

    def _by_value(self, x: Any, t: type, depth: int) -> None:  # noqa: C901 - one branch per kind
        out = self.out
        if t in (list, tuple) and len(x) >= PACKED_MIN and self._packed(x, t):
            return
        if t in (list, dict, set, frozenset, collections.OrderedDict, collections.defaultdict, collections.deque,
                 bytearray):
            tag = {list: LIST, dict: DICT, set: SET, frozenset: FROZENSET, collections.OrderedDict: ODICT,
                   collections.defaultdict: DDICT, collections.deque: DEQUE, bytearray: BYTEARRAY}[t]
            out.append(tag)
            self._remember(x)
            if t is bytearray:
                out += _varint(len(x))
                out += x
                return
            if t is collections.defaultdict:
                self._value(x.default_factory, depth + 1)
            if t is collections.deque:
                self._value(x.maxlen, depth + 1)
            if t in (dict, collections.OrderedDict, collections.defaultdict):
                out += _varint(len(x))
                for k, v in x.items():
                    self._value(k, depth + 1)
                    self._value(v, depth + 1)
            else:
                items = list(x)
                out += _varint(len(items))
                for v in items:
                    self._value(v, depth + 1)
        elif t is tuple:
            if id(x) in self.building:
                raise StateEncodeError("a tuple that contains itself (through a container) cannot be saved")
            self.building.add(id(x))
            out.append(TUPLE)
            out += _varint(len(x))
            for v in x:
                self._value(v, depth + 1)
            self.building.discard(id(x))
            self._remember(x)
        elif t is np.ndarray and x.dtype.hasobject and x.dtype.fields is None:
            out.append(OBJECT_ARRAY)
            self._remember(x)
            out += _varint(x.ndim)
            for n in x.shape:
                out += _varint(n)
            out.append(1 if x.flags.writeable else 0)
            self._value(x.ravel(order="C").tolist(), depth + 1)
        elif t is np.ndarray:
            out.append(ARRAY)
            self._remember(x)
            self._value(_dtype_value(x.dtype), depth + 1)
            out += _varint(x.ndim)
            for n in x.shape:
                out += _varint(n)
            out.append(1 if x.flags.writeable else 0)
            data = np.ascontiguousarray(x).tobytes()
            out += _varint(len(data))
            out += data
        elif _is_torch(t, ("Tensor", "Parameter")):
            self._tensor(x, depth)
        elif _is_torch(t, ("Generator",)):
            if x.device.type != "cpu":
                raise StateEncodeError(f"a torch generator on {x.device} cannot be saved (CPU ones only)")
            out.append(TORCH_GEN)
            self._remember(x)
            data = x.get_state().numpy().tobytes()
            out += _varint(len(data))
            out += data
        elif _is_element(t):
            self._element(x, depth)
        elif isinstance(x, _SUBCLASS_BASES):
            base = next(b for b in _SUBCLASS_BASES if isinstance(x, b))
            out.append(SUBCLASS)
            self._ref(t)
            self._value(base(x), depth + 1)
            self._remember(x)
            self._value(dict(x.__dict__) if isinstance(getattr(x, "__dict__", None), dict) else None, depth + 1)
        else:
            self._object(x, t, depth)

    def _packed(self, x: list | tuple, t: type) -> bool:
        """A list or tuple of ints within int64, or of floats, as one packed run (what a `random.Random` state
        is: 625 ints); False when it is neither."""
        first = type(x[0])
        if first is int:
            lo, hi = _I64
            if not all(type(v) is int and lo <= v <= hi for v in x):
                return False
            self.out.append(INTS)
            fmt = "q"
        elif first is float:
            if not all(type(v) is float for v in x):
                return False
            self.out.append(FLOATS)
            fmt = "d"
        else:
            return False
        self.out.append(1 if t is tuple else 0)
        self.out += _varint(len(x))
        self.out += struct.pack(f"<{len(x)}{fmt}", *x)
        self._remember(x)
        return True

    def _tensor(self, x: Any, depth: int) -> None:
        import torch

        if x.device.type != "cpu":
            x = x.detach().to("cpu")
        name = str(x.dtype).removeprefix("torch.")
        if name not in TORCH_DTYPE_NAMES:
            raise StateEncodeError(f"a torch tensor of dtype {x.dtype} cannot be saved")
        self.out.append(TENSOR)
        self._remember(x)
        self._str(name)
        self.out += _varint(x.dim())
        for n in x.shape:
            self.out += _varint(n)
        self.out.append((1 if isinstance(x, torch.nn.Parameter) else 0) | (2 if x.requires_grad else 0))
        data = x.detach().contiguous().view(torch.uint8).numpy().tobytes() if x.numel() else b""
        self.out += _varint(len(data))
        self.out += data

    def _element(self, x: Any, depth: int) -> None:
        self.out.append(ELEMENT)
        self._remember(x)
        self._value(x.tag, depth + 1)
        self._value(dict(x.attrib), depth + 1)
        self._value(x.text, depth + 1)
        self._value(x.tail, depth + 1)
        self._value(list(x), depth + 1)

    def _object(self, x: Any, t: type, depth: int) -> None:
        if not (hasattr(x, "__dict__") or _slot_names(t)) or "<locals>" in t.__qualname__:
            raise StateEncodeError(f"a {t.__module__}.{t.__qualname__} cannot be saved by value (no __dict__ or "
                                   "__slots__ to rebuild it from)")
        self.out.append(OBJECT)
        self._ref(t)
        self._remember(x)
        d = getattr(x, "__dict__", None)
        self._value(dict(d) if isinstance(d, dict) else None, depth + 1)
        slots = {}
        for k in _slot_names(t):
            try:
                slots[k] = object.__getattribute__(x, k)
            except AttributeError:
                continue
        self._value(slots, depth + 1)
        items = dict(x) if isinstance(x, dict) else list(x) if isinstance(x, list) else None
        self._value(items, depth + 1)

