"""How `envs.object_graph` writes and reads a snapshot's Python state.

Writing is canonical, so that a capsule's bytes are a function of the state alone: arrays in C order whatever
their layout, dtypes as numpy's own instances, every string interned before pickling (pickle shares a string
by identity; Python interns the strings of code, not those an earlier restore made).

Reading resolves only what a snapshot needs (`SafeUnpickler`): numpy's array and scalar reconstructors, dtypes,
generators, plain containers and this package's helpers; the classes the env being restored uses and other
classes of the third-party packages those come from; enums. A capsule can name no other function (no
`os.system`) and no class from elsewhere: either is refused with its name. A class of the env's own packages
may be constructed from a capsule's arguments, so a capsule is as trusted as its source: one from another
machine as its signature says (`save_capsule(..., key=)`). Objects made fresh at a restore come from classes
of modules this process has imported already, by `__new__` alone.
"""

from __future__ import annotations

import collections
import enum
import pickle
import sys
import types
from typing import Any

import numpy as np

PLAIN = (dict, list, tuple, set, frozenset, collections.OrderedDict, collections.defaultdict, collections.deque)


def interned(x: Any, memo: dict[int, Any]) -> Any:
    """`x` with every string inside its plain containers interned (copies of the containers, sharing kept):
    pickle shares a string by identity, so interning them all makes a snapshot's bytes a function of the
    values alone, whether the strings came from the code (interned) or from an earlier restore (not)."""
    t = type(x)
    if t is str:
        return sys.intern(x)
    if t not in PLAIN:
        return x
    done = memo.get(id(x))
    if done is not None:
        return done[1]
    if t in (dict, collections.OrderedDict, collections.defaultdict):
        out: Any = collections.defaultdict(x.default_factory) if t is collections.defaultdict else t()
        memo[id(x)] = (x, out)
        for k, v in x.items():
            out[interned(k, memo)] = interned(v, memo)
    elif t is collections.deque:
        out = collections.deque(maxlen=x.maxlen)
        memo[id(x)] = (x, out)
        out.extend(interned(v, memo) for v in x)
    elif t is list:
        out = []
        memo[id(x)] = (x, out)
        out.extend(interned(v, memo) for v in x)
    else:
        out = t(interned(v, memo) for v in x)
        memo[id(x)] = (x, out)
    return out


class Pickler(pickle.Pickler):
    """Pickles a snapshot's states canonically; objects of the graph go by persistent id (`table`)."""

    def __init__(self, file, table: dict[int, tuple]) -> None:
        super().__init__(file, protocol=5)
        self.table = table
        self.interned: dict[int, Any] = {}  # one memo for every string normalisation of this pickle

    def persistent_id(self, obj: Any) -> tuple | None:
        return self.table.get(id(obj))

    def reducer_override(self, obj: Any) -> Any:
        # arrays in one canonical form (C order, whatever their layout): the same values give the same bytes,
        # so a capsule's bytes depend on the state alone (numpy pickles a Fortran-ordered array otherwise)
        if type(obj) is np.ndarray and obj.dtype != object:
            return _array, (np.ascontiguousarray(obj).tobytes(), obj.dtype.str, obj.shape, bool(obj.flags.writeable))
        if isinstance(obj, np.dtype) and not obj.fields and not obj.metadata:
            return np.dtype, (obj.str,)  # unpickled as numpy's own instance, as the code that made the env holds
        if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType, types.ModuleType)) or \
                type(obj) in PLAIN:
            return NotImplemented
        # any other value (an XML element, a dataclass...): its own reduction, with the strings in it interned
        # (see `_interned`), so that its bytes do not depend on which strings Python happened to share
        try:
            reduced = obj.__reduce_ex__(5)
        except Exception:  # noqa: BLE001 - let pickle raise its own error for it
            return NotImplemented
        if not isinstance(reduced, tuple):
            return NotImplemented
        return (reduced[0], *(interned(part, self.interned) for part in reduced[1:]))


def _array(data: bytes, dtype: str, shape: tuple, writeable: bool) -> np.ndarray:
    out = np.frombuffer(data, dtype).reshape(shape).copy()
    out.flags.writeable = writeable
    return out


def type_key(t: type) -> str:
    """A class by name (some suites make classes at run time that pickle cannot find by reference: Meta-World's
    goal-observable envs): objects are paired by it, and only an object made fresh needs the class itself."""
    return f"{t.__module__}:{t.__qualname__}"


def type_of(key: str) -> type:
    """The class `type_key` named, from a module this process has imported already (a capsule never makes
    Python import anything); LookupError when there is none."""
    module, _, qualname = key.partition(":")
    x: Any = sys.modules.get(module)
    for part in qualname.split(".") if x is not None else ():
        x = getattr(x, part, None)
    if not isinstance(x, type):
        raise LookupError(key)
    return x


SAFE_GLOBALS = frozenset({
    "builtins:object", "builtins:set", "builtins:frozenset", "builtins:bytearray", "builtins:complex",
    "builtins:slice", "builtins:range", "builtins:list", "builtins:dict", "builtins:tuple", "builtins:getattr",
    "copyreg:_reconstructor", "copyreg:__newobj__", "copyreg:__newobj_ex__",
    "collections:OrderedDict", "collections:defaultdict", "collections:deque",
    "numpy:ndarray", "numpy:dtype", "numpy.core.multiarray:_reconstruct", "numpy._core.multiarray:_reconstruct",
    "numpy.core.multiarray:scalar", "numpy._core.multiarray:scalar", "numpy.dtypes:Float64DType",
    "numpy.random._generator:Generator", "numpy.random.mtrand:RandomState", "numpy.random._pcg64:PCG64",
    "numpy.random._pcg64:PCG64DXSM", "numpy.random._mt19937:MT19937", "numpy.random._philox:Philox",
    "numpy.random._sfc64:SFC64", "numpy.random._pickle:__generator_ctor", "numpy.random._pickle:__randomstate_ctor",
    "numpy.random._pickle:__bit_generator_ctor", "random:Random",
    "capsule_rollout.envs.graph_codec:_array", "capsule_rollout.envs.object_graph:_Plan",
    "torch._utils:_rebuild_tensor_v2", "torch._utils:_rebuild_parameter", "torch.storage:_load_from_bytes",
})
"""Globals any snapshot may name."""


class SafeUnpickler(pickle.Unpickler):
    """Reads a snapshot, resolving persistent ids through `resolved` and globals only as the module says."""

    def __init__(self, data: bytes, resolved: dict[tuple, Any] | None = None, known: frozenset[str] = frozenset()):
        import io

        super().__init__(io.BytesIO(data))
        self.resolved, self.known = resolved or {}, known
        # the env's own packages (dm_control, robosuite...): their classes too (an object the env makes later,
        # as dm_control's render contexts); never the standard library's, numpy's or torch's beyond the above
        self.packages = {k.split(":")[0].split(".")[0] for k in known} - set(sys.stdlib_module_names) - {
            "builtins", "numpy", "torch", "mujoco", "capsule_rollout"}

    def persistent_load(self, pid: tuple) -> Any:
        try:
            return self.resolved[pid]
        except (KeyError, TypeError):
            raise pickle.UnpicklingError(f"the snapshot refers to {pid!r}, which it does not define") from None

    def find_class(self, module: str, name: str) -> Any:
        key = f"{module}:{name}"
        found = super().find_class(module, name) if key in SAFE_GLOBALS or key in self.known or \
            module in sys.modules else None
        if key in SAFE_GLOBALS or key in self.known or isinstance(found, type) and (
                issubclass(found, enum.Enum) or module.split(".")[0] in self.packages):
            return found
        raise pickle.UnpicklingError(f"a capsule's Python state names {key}, which is neither one of the globals a "
                                     "snapshot uses nor a class of the env being restored: refused (is the capsule "
                                     "from an env built differently, or not from this framework?)")


def safe_loads(data: bytes, known: frozenset[str] = frozenset()) -> Any:
    return SafeUnpickler(data, known=known).load()
