"""No module of the package pickles: every module parsed (ast), none imports a pickle of any kind or uses the pickle
protocol's hooks to copy or rebuild a value (a restore makes its copies with `capsules.graph.template.Template`). Ray
pickles what it ships between processes, which is Ray's business: a class may define `__reduce__` for that."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import capsule_rollout

PICKLING_MODULES = frozenset({"pickle", "_pickle", "cPickle", "pickletools", "dill", "cloudpickle", "marshal",
                              "copyreg", "shelve", "jsonpickle"})
"""Modules that pickle, or hook into pickling (`copyreg`): never imported by the package."""
PROTOCOL_NAMES = frozenset({"__reduce_ex__", "copyreg", "__getnewargs__", "__getnewargs_ex__"})
"""Names of the pickle protocol a module never uses (a `__reduce__` may be defined, for Ray, never called)."""


def pickling(source: str, filename: str = "<module>") -> list[str]:
    """Where `source` pickles: `line: what`, for an import of a pickling module, a use of the protocol's names, a call
    of `__reduce__`, `torch.load` (a pickle unless told otherwise), or numpy's `allow_pickle` turned on."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            found += [f"{line}: import {a.name}" for a in node.names if a.name.split(".")[0] in PICKLING_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PICKLING_MODULES:
            found.append(f"{line}: from {node.module} import ...")
        elif isinstance(node, ast.ImportFrom):
            found += [f"{line}: from {node.module} import {a.name}" for a in node.names if a.name in PICKLING_MODULES]
        elif isinstance(node, ast.Name) and node.id in PROTOCOL_NAMES:
            found.append(f"{line}: {node.id}")
        elif isinstance(node, ast.Attribute) and (node.attr in PROTOCOL_NAMES or "pickle" in node.attr.lower()):
            found.append(f"{line}: .{node.attr}")
        elif isinstance(node, ast.Constant) and node.value in PROTOCOL_NAMES:
            found.append(f"{line}: {node.value!r}")  # getattr(x, "__reduce_ex__")
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr == "__reduce__":
                found.append(f"{line}: a call of __reduce__")
            if isinstance(f, ast.Attribute) and f.attr == "load" and isinstance(f.value, ast.Name) and \
                    f.value.id == "torch":
                found.append(f"{line}: torch.load")
            for k in node.keywords:
                if k.arg == "allow_pickle" and not (isinstance(k.value, ast.Constant) and k.value.value is False):
                    found.append(f"{line}: allow_pickle={ast.unparse(k.value)}")
    return found


def test_no_module_of_the_package_pickles():
    root = Path(capsule_rollout.__file__).parent
    modules = sorted(root.rglob("*.py"))
    assert len(modules) > 100  # the whole package, not a folder of it
    found = {str(p.relative_to(root.parent)): hits for p in modules
             if (hits := pickling(p.read_text(encoding="utf-8"), str(p)))}
    assert not found, found


@pytest.mark.parametrize("source", [
    "import pickle", "import cloudpickle as cp", "from dill import loads", "import marshal", "from _pickle import Unpickler",
    "import copyreg", "from copy import deepcopy\ncopyreg = None", "y = x.__reduce_ex__(5)", "getattr(x, '__reduce_ex__')",
    "state = obj.__reduce__()", "torch.load(path)", "np.load(path, allow_pickle=True)", "df.to_pickle(path)",
    "from multiprocessing import reduction\nimport shelve",
])
def test_the_scan_finds_each_kind_of_pickle(source):
    assert pickling(source), source


@pytest.mark.parametrize("source", [
    "np.load(path, allow_pickle=False)", "safetensors.torch.load(data)",
    "class E(Exception):\n    def __reduce__(self):\n        return E, (self.args,)",
    '"""read without pickle"""',
])
def test_the_scan_lets_through_what_does_not_pickle(source):
    assert not pickling(source), source
