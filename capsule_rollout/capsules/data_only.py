"""The data level of a restore (`capsules.trust.Trust.DATA`, `--trust`): a capsule's Python state, read and resolved in
the env built here (`capsules.graph.state.GraphState.prepare`), checked place by place against what that env holds
now, before anything is set.

Data goes anywhere: numbers, strings, bytes, arrays, tensors, enum members, numpy dtypes and scalar types, the
built-in container and scalar classes, numpy's and random's own generators (made by their constructors, set
through their state API), and lists, tuples, dicts, sets and deques of them. Anything else must be
what the env built here already holds at that place:

- a class, function, module or bound method: that very object (a bound method: the same function bound to the
  same object);
- an object of the env's graph (resolved by its path): one where the env holds an object of the same class;
- an instance the capsule itself makes (a named tuple, an int flag): where the env holds one of the same class;
  any other instance made from the capsule only when its class was declared safe (`capsules.trust.add_safe_types`).

So a file from elsewhere can change the env's data, never which code runs: it cannot put a callable where the env
will call it, nor an object of its choosing where the env will call a method. Every refusal names the place, what
the capsule holds there and what the env holds.
"""

from __future__ import annotations

import collections
import enum
import random
import types
from typing import Any

import numpy as np

from capsule_rollout.capsules.graph.apply import MISSING
from capsule_rollout.capsules.graph.walk import Path, fmt
from capsule_rollout.capsules.state_codec import _SUBCLASS_BASES, SAFE_TYPES, loaded
from capsule_rollout.capsules.trust import safe_type

HOW_TO_TRUST = ("Restore it with --trust-code only if you would run this file as code, or declare the class safe "
                "(capsules.add_safe_types) if it is a plain record")
"""The end of every data-level refusal: what the user can do instead."""


class DataOnlyError(ValueError):
    """A capsule restored at the data level holds more than data at a place; the message names it."""


_ABSENT = object()  # the env built here holds nothing at that place
_LEAVES = frozenset({type(None), bool, int, float, complex, str, bytes, bytearray, slice, range, type(Ellipsis),
                     type(NotImplemented), np.ndarray, np.random.Generator, np.random.RandomState, np.random.PCG64,
                     np.random.PCG64DXSM, np.random.MT19937, np.random.Philox, np.random.SFC64, random.Random})
"""Values that are data; numpy's and random's generators among them (of these very classes: made by their own
constructors and set through their state API, `graph.read.new_generator`)."""
_SEQUENCES = (list, tuple, collections.deque)
_MAPPINGS = (dict, collections.OrderedDict, collections.defaultdict)
_HARMLESS_CLASSES = frozenset(t for t in (loaded(*k.split(":")) for k in SAFE_TYPES) if isinstance(t, type))
"""Classes a capsule may hold as values anywhere: calling one makes a number, a string or an empty container."""


def _leaf(x: Any) -> bool:
    t = type(x)
    if t in _LEAVES:
        return t is not np.ndarray or x.dtype != object
    if x is MISSING or isinstance(x, (np.generic, np.dtype, enum.Enum)):
        return True
    module = t.__module__ or ""
    if module.startswith("torch") and t.__name__ in ("Tensor", "Parameter", "Generator"):
        return True  # made by the reader from bytes (a tensor's, a generator's state through its API)
    if module == "xml.etree.ElementTree" and t.__name__ == "Element":
        return True
    return isinstance(x, type) and (x in _HARMLESS_CLASSES or issubclass(x, np.generic))


def _describe(x: Any) -> str:
    if x is _ABSENT:
        return "nothing"
    if isinstance(x, (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)):
        return f"{type(x).__name__} {getattr(x, '__module__', '') or ''}.{getattr(x, '__qualname__', x)!s}".replace(
            " .", " ")
    if isinstance(x, types.MethodType):
        return f"a method {type(x.__self__).__qualname__}.{x.__func__.__name__}"
    return f"a {type(x).__module__}.{type(x).__qualname__}"


class DataOnlyCheck:
    """Checks a prepared snapshot's states (`check_object`, `check_data`); `graph` holds the ids of the env's own
    objects the states refer to (their targets, resolved by path)."""

    def __init__(self, graph: set[int]) -> None:
        self.graph = graph
        self.seen: set[int] = set()

    def check_object(self, target: Any, state: tuple[dict | None, dict, Any], path: Path) -> None:
        """One object's attributes, slots and items against the target's own, at its path."""
        d, slots, items = state
        where = fmt(path)
        if d is not None:
            own = getattr(target, "__dict__", None) or {}
            for k, v in d.items():
                self._check(v, own.get(k, _ABSENT), f"{where}.{k}")
        for k, v in slots.items():
            self._check(v, getattr(target, k, _ABSENT), f"{where}.{k}")
        if items is not None:
            self._check(items, dict(target) if isinstance(target, dict) else list(target) if isinstance(
                target, list) else _ABSENT, f"{where}[...]")

    def check_data(self, value: Any, where: str) -> None:
        """A value with no counterpart in the env (a generator's state, a struct's fields): data alone."""
        self._check(value, _ABSENT, where)

    def _check(self, new: Any, old: Any, where: str) -> None:  # noqa: C901 - one branch per kind of value
        if _leaf(new):
            return
        t = type(new)
        if t in _SEQUENCES or t in _MAPPINGS or t in (set, frozenset) or t is np.ndarray:
            if id(new) in self.seen:
                return
            self.seen.add(id(new))
            if t in _MAPPINGS:
                if t is collections.defaultdict:
                    self._reference(new.default_factory, old.default_factory if type(old) is t else _ABSENT,
                                    f"{where}.default_factory")
                olds = old if isinstance(old, dict) else {}
                for k, v in new.items():
                    self._check(k, _ABSENT, f"{where} key {k!r}")
                    self._check(v, olds.get(k, _ABSENT), f"{where}[{k!r}]")
            elif t in (set, frozenset):
                for v in new:
                    self._check(v, _ABSENT, f"{where} member")
            else:
                items = new.reshape(-1) if t is np.ndarray else new
                olds = (old.reshape(-1) if type(old) is np.ndarray and old.dtype == object and old.shape == new.shape
                        else old if type(old) is t else ())
                for i, v in enumerate(items):
                    self._check(v, olds[i] if i < len(olds) else _ABSENT, f"{where}[{i}]")
            return
        if new is old:
            return
        if id(new) in self.graph:  # an object of the env built here, placed where it holds one of its class
            if type(old) is not t and not safe_type(t):
                self._refuse(new, old, where)
            return
        if isinstance(new, (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
                            types.MethodType, types.MethodWrapperType, types.MethodDescriptorType,
                            types.WrapperDescriptorType, types.BuiltinMethodType)) or not hasattr(new, "__dict__") \
                and not isinstance(new, _SUBCLASS_BASES) and callable(new):
            self._reference(new, old, where)
            return
        # an instance the capsule makes: a value-like one (a named tuple, an int flag) where the env holds its class,
        # any other only of a class declared safe; its contents are data
        if not (safe_type(t) or isinstance(new, _SUBCLASS_BASES) and type(old) is t):
            self._refuse(new, old, where)
        if id(new) in self.seen:
            return
        self.seen.add(id(new))
        if isinstance(new, tuple):
            for i, v in enumerate(new):
                self._check(v, old[i] if type(old) is t and i < len(old) else _ABSENT, f"{where}[{i}]")
        own = getattr(old, "__dict__", None) or {}
        for k, v in (getattr(new, "__dict__", None) or {}).items():
            self._check(v, own.get(k, _ABSENT), f"{where}.{k}")

    def _reference(self, new: Any, old: Any, where: str) -> None:
        """A class, function, module or bound method: the very one the env holds there."""
        if new is None or new is old or _leaf(new):
            return
        if isinstance(new, types.MethodType) and isinstance(old, types.MethodType) and \
                new.__func__ is old.__func__ and new.__self__ is old.__self__:
            return
        if type(new) is type(old) and isinstance(new, types.BuiltinMethodType) and \
                getattr(new, "__self__", None) is getattr(old, "__self__", _ABSENT) and new.__name__ == old.__name__:
            return
        self._refuse(new, old, where)

    @staticmethod
    def _refuse(new: Any, old: Any, where: str) -> None:
        raise DataOnlyError(f"the capsule puts {_describe(new)} at {where}, where the env built here holds "
                            f"{_describe(old)}: a capsule restored as data (--trust) sets data only. {HOW_TO_TRUST}")
