"""The names a capsule of an object graph (`capsules.graph.state`: an env's, a policy object's) may use, read
by `capsules.state_codec`, a format that cannot run code when it is read.

A capsule's Python state may name (never call) only:

- the classes, functions and modules the object graph holds now (`graph.walk.walk(..., refs=)`), each as the
  object itself: a capsule cannot bring a name the graph does not already use (no `os.system`, no `getattr`);
- classes and functions of the graph's own third-party packages (the top-level packages of those classes, less
  the standard library, numpy, torch, mujoco and this project) and of the third-party packages their modules
  import: an object the env makes later, as dm_control's render contexts, or a value it holds only at some
  steps, as dm_env's `StepType` in a dm_control env's last time step;
- the containers and random generators `state_codec.SAFE_TYPES` and `GENERATOR_TYPES` list.

Instances are rebuilt from such a class by `__new__` alone, and only from modules this process has imported
already. Everything a capsule can set is then a value of those kinds: a capsule from elsewhere can still put
the env in a state it would not reach by itself, which is why such a file is trusted by its signature
(`capsules.signing_key`).
"""

from __future__ import annotations

import sys
import types
from typing import Any

from capsule_rollout.capsules.state_codec import SAFE_TYPES, StateNameError, loaded, names_of

GENERATOR_TYPES = frozenset({
    "numpy.random._generator:Generator", "numpy.random.mtrand:RandomState", "numpy.random._pcg64:PCG64",
    "numpy.random._pcg64:PCG64DXSM", "numpy.random._mt19937:MT19937", "numpy.random._philox:Philox",
    "numpy.random._sfc64:SFC64", "random:Random",
})
OPAQUE_MODULES = ("logging", "threading", "socket", "io", "_io", "subprocess", "multiprocessing", "concurrent",
                  "asyncio", "ctypes", "OpenGL", "weakref", "queue", "selectors", "mujoco")
"""Instances of classes from these modules are never copied (loggers, files, sockets, GL bindings, MuJoCo's C
structs...), nor made from a capsule."""
NOT_ENV_PACKAGES = frozenset({"builtins", "numpy", "torch", "mujoco", "capsule_rollout"})


def type_key(t: type) -> str:
    """A class by name (some suites make classes at run time that cannot be found by reference elsewhere:
    Meta-World's goal-observable envs): objects are paired by it, and only an object made fresh needs the class
    itself."""
    return f"{t.__module__}:{t.__qualname__}"


def ref_key(x: Any) -> str | None:
    """`module:qualname` of a class, function or module (a module as `name:`); None for anything else."""
    if isinstance(x, types.ModuleType):
        return f"{x.__name__}:"
    module = getattr(x, "__module__", None)
    if module is None:
        owner = getattr(x, "__objclass__", None)
        module = getattr(owner, "__module__", None)
    name = getattr(x, "__qualname__", None) or getattr(x, "__name__", None)
    return f"{module}:{name}" if isinstance(module, str) and isinstance(name, str) else None


def type_of(key: str) -> type:
    """The class `type_key` named, from a module this process has imported already; LookupError when none."""
    module, _, qualname = key.partition(":")
    x = loaded(module, qualname)
    if not isinstance(x, type):
        raise LookupError(key)
    return x


def buildable(t: type) -> bool:
    """Whether an instance of `t` may be made from a capsule: not a resource (its module among `OPAQUE_MODULES`,
    or a class with `__del__` that would free what it holds)."""
    return (t.__module__ or "").split(".")[0] not in OPAQUE_MODULES and not any(
        "__del__" in vars(k) for k in t.__mro__ if k is not object)


def _imported_by(packages: set[str]) -> set[str]:
    """The third-party packages the modules of `packages` have imported (a module or a class in their globals): a
    value the env holds only at some steps may be of one of them (dm_control's time steps are dm_env's)."""
    found: set[str] = set()
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] not in packages or module is None:
            continue
        for value in list(vars(module).values()):
            if isinstance(value, types.ModuleType):
                found.add(value.__name__.split(".")[0])
            elif isinstance(value, type) and isinstance(value.__module__, str):
                found.add(value.__module__.split(".")[0])
    return found - set(sys.stdlib_module_names) - NOT_ENV_PACKAGES - {k for k in OPAQUE_MODULES}


class GraphNamespace:
    """The names one env's capsule may use (see the module docstring); `known` are the `ref_key`s of the
    classes, functions and modules its graph holds."""

    def __init__(self, known: frozenset[str]) -> None:
        self.known = known
        own = {k.split(":")[0].split(".")[0] for k in known} - set(sys.stdlib_module_names) - NOT_ENV_PACKAGES
        self.packages = own | _imported_by(own)

    def lookup(self, module: str, qualname: str, purpose: str) -> Any:
        key = f"{module}:{qualname}"
        found = loaded(module, qualname)
        if found is not None and (module, qualname) not in names_of(found):
            # a name re-exported elsewhere (`gymnasium.core:Any` is `typing.Any`): the allow-list would be checked
            # against the module the capsule wrote, not the one the object lives in
            lives = ", ".join(f"{m}:{q}" for m, q in names_of(found)) or "nowhere it names"
            raise StateNameError(f"a capsule's Python state names {key}, which lives at {lives}: refused (a name is "
                                 "accepted only where the object itself says it lives)")
        ok = found is not None and (
            key in self.known or key in SAFE_TYPES or key in GENERATOR_TYPES
            or module.split(".")[0] in self.packages and isinstance(found, (type, types.FunctionType)))
        if ok and purpose == "class" and not (isinstance(found, type) and buildable(found)):
            raise StateNameError(f"a capsule's Python state makes a {key}, which is never made from a capsule "
                                   "(a resource: a lock, logger, file, socket or a class with __del__): refused")
        if not ok:
            raise StateNameError(f"a capsule's Python state names {key}, which is neither one of the names the "
                                   "env being restored holds nor a class of its packages: refused (is the capsule "
                                   "from an env built differently, or not from this framework?)")
        return found
