"""A package's public names stay what they name after every module of the package is imported: a module named
like a name its package exports lazily (`lazy_exports`) would hide it (the import system binds a submodule on its
package when it is first imported)."""

from __future__ import annotations

import importlib
import pkgutil
import types

import capsule_rollout


def test_every_exported_name_is_itself_after_every_module_is_imported():
    packages = [capsule_rollout.__name__] + [m.name for m in pkgutil.walk_packages(capsule_rollout.__path__,
                                                                                    "capsule_rollout.") if m.ispkg]
    for name in packages:
        package = importlib.import_module(name)
        for submodule in pkgutil.iter_modules(package.__path__, f"{name}."):
            importlib.import_module(submodule.name)
        for exported in getattr(package, "__all__", ()):
            assert not isinstance(getattr(package, exported), types.ModuleType), (
                f"{name}.{exported} is a module once {name}.{exported} is imported: rename the module")
