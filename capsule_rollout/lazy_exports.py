"""A package's public names loaded on first use (PEP 562): importing the package imports nothing more.

    __all__, __getattr__, __dir__ = lazy_exports(__name__, {"make_env": "capsule_rollout.envs.suites", ...})

Standard library only; every layer's `__init__` uses it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[list[str], Callable[[str], object],
                                                                       Callable[[], list[str]]]:
    """`__all__` (the names of `exports`, sorted), `__getattr__` (a name from the module `exports` gives for it,
    imported then) and `__dir__` for the package named `package`."""
    names = sorted(exports)

    def __getattr__(name: str) -> object:
        if name in exports:
            return getattr(importlib.import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *names})

    return names, __getattr__, __dir__
