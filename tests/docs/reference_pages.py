"""The docs' page generators (docs/hooks/reference.py, an MkDocs hook), loaded as MkDocs loads a hook: by path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HOOK = Path(__file__).resolve().parents[2] / "docs" / "hooks" / "reference.py"


def load():
    name = "docs_reference_hook"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HOOK)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the class is made
        spec.loader.exec_module(module)
    return sys.modules[name]
