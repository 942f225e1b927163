"""`resolve(path)`: the object an import path `package.module:name` names, the one resolver every layer uses
(envs, policies, critics, observers, runners and torch module factories given on a command line or in a
checkpoint), or an object handed over in Python (`object_source`, `__objects__:<name>`). A factory named with
keyword arguments is `package.module:factory={JSON object}` (`split_kwargs`, `with_kwargs`), on the command line
and in Python alike. Standard library only, so any layer may import it."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import json
import re
from collections.abc import Iterable
from typing import Any

KWARGS_SEP = "="
OBJECTS = "__objects__"
"""The module part of a source that names an object handed over in Python (`object_source`), not an import path."""
_OBJECTS: dict[str, Any] = {}


class ImportPathError(ValueError):
    """An import path that names nothing importable; the message says which part failed and what to write."""


def split_kwargs(source: str, what: str = "factory") -> tuple[str, dict[str, Any]]:
    """(`package.module:factory`, its keyword arguments) of `package.module:factory={JSON object}`; a source
    without `=` has none. A malformed object is an `ImportPathError` naming the source."""
    path, sep, raw = source.partition(KWARGS_SEP)
    if not sep:
        return source, {}
    try:
        kwargs = json.loads(raw)
    except ValueError as exc:
        raise ImportPathError(f"{what} {source!r}: the keyword arguments after '=' must be a JSON object "
                              f"({exc}), e.g. {path}={{\"size\": 3}}") from None
    if not isinstance(kwargs, dict):
        raise ImportPathError(f"{what} {source!r}: the keyword arguments after '=' must be a JSON object, "
                              f"e.g. {path}={{\"size\": 3}}")
    return path, kwargs


def with_kwargs(path: str, **kwargs: Any) -> str:
    """The source naming factory `path` called with `kwargs` (JSON values): `package.module:factory={...}`, what
    `split_kwargs` reads back (and what a run's `rollout.json` records)."""
    return f"{path}{KWARGS_SEP}{json.dumps(kwargs, sort_keys=True, separators=(',', ':'))}" if kwargs else path


def object_source(obj: Any) -> str:
    """A source naming `obj` (a factory, a class: any callable Ray can ship), `__objects__:<its name>`, resolved by
    `resolve` in every process that registered it (`register_objects`): a run's spec carries the objects beside it
    (`RunSpec.objects`), so its actors have them too."""
    base = re.sub(r"\W+", "_", getattr(obj, "__qualname__", None) or type(obj).__name__).strip("_") or "object"
    name, n = base, 1
    while _OBJECTS.get(name, obj) is not obj:
        n += 1
        name = f"{base}_{n}"
    _OBJECTS[name] = obj
    return f"{OBJECTS}:{name}"


def register_objects(objects: Iterable[tuple[str, Any]]) -> None:
    """Make `(source, object)` pairs resolvable in this process (a spec's `objects`, on an actor)."""
    for source, obj in objects:
        _OBJECTS[source.partition(":")[2]] = obj


def resolve(path: str, what: str = "object") -> Any:
    """The attribute `name` of module `package.module` for `path = "package.module:name"` (`name` may be dotted:
    `module:Class.method`). `what` names the thing in errors ("env", "policy", "observer").

    Raises `ImportPathError`: for a malformed path; for a module that does not exist; for a module that exists
    but fails to import (the error it raised, with its cause: a missing dependency of the user's module is
    reported as that, not as a missing module); for a missing attribute (with close names)."""
    module_name, sep, attr = path.partition(":")
    if module_name == OBJECTS:
        if attr not in _OBJECTS:
            raise ImportPathError(f"{what} {path!r} was an object handed over in Python to the process that made the "
                                  "run: give it again (replay_episode(..., named={'env': make_env, ...})), or name "
                                  f"an import path `package.module:name` (replay --{what} ...)")
        return _OBJECTS[attr]
    if not sep or not module_name or not attr or not all(p.isidentifier() for p in attr.split(".")):
        raise ImportPathError(f"{what} {path!r}: give an import path `package.module:name`")
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError) as exc:  # a parent package that fails to import, or a malformed name
        spec, parent_error = None, exc
    else:
        parent_error = None
    if spec is None:
        if parent_error is not None and not isinstance(parent_error, ModuleNotFoundError):
            raise ImportPathError(f"{what} {path!r}: importing {module_name!r} failed: "
                                  f"{type(parent_error).__name__}: {parent_error}") from parent_error
        raise ImportPathError(f"{what} {path!r}: no module {module_name!r} on the Python path (is its package "
                              "installed, or its directory on PYTHONPATH?)")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # the module exists and raised while importing: that error is the cause
        raise ImportPathError(f"{what} {path!r}: module {module_name!r} was found but failed to import: "
                              f"{type(exc).__name__}: {exc}") from exc
    for i, part in enumerate(attr.split(".")):
        if not hasattr(obj, part):
            owner = module_name if i == 0 else f"{module_name}:{'.'.join(attr.split('.')[:i])}"
            public = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, public, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ImportPathError(f"{what} {path!r}: {owner} has no attribute {part!r}{hint}")
        obj = getattr(obj, part)
    return obj
