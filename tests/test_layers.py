"""DESIGN.md section 2: imports go one way; only rollout/ imports ray; capsules/ imports only
torch/numpy/triton/safetensors; commands in experiments/ never import each other."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("capsules", "models", "envs", "policies", "critics", "rollout", "learning", "commands", "benchmarks",
            "experiments")
# package -> project modules it may import (a dotted entry allows that module only)
ALLOWED = {
    "capsules": set(),
    "models": {"capsules"},
    "envs": {"capsules"},
    "policies": {"capsules", "models"},
    "critics": {"capsules", "models"},
    "rollout": {"capsules", "models", "envs", "policies", "critics"},
    "learning": {"capsules", "models", "envs", "policies", "critics", "rollout"},
    "commands": {"capsules", "models", "envs", "policies", "critics", "rollout", "learning"},
    "benchmarks": {"capsules", "models", "envs", "policies", "critics", "rollout", "learning", "commands"},
    "experiments": {"capsules", "models", "envs", "policies", "critics", "rollout", "learning", "commands",
                    "benchmarks"},
}
CAPSULES_THIRD_PARTY = {"torch", "numpy", "triton", "safetensors"}


def imported_modules(source: str, package_path: str) -> list[str]:
    """Absolute names of every module `source` imports (relative imports resolved)."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_path.split(".")[: len(package_path.split(".")) - node.level + 1]
                prefix = ".".join(base)
                mod = f"{prefix}.{node.module}" if node.module else prefix
            else:
                mod = node.module or ""
            names.append(mod)
            names += [f"{mod}.{alias.name}" for alias in node.names]
    return names


def violations(package: str, source: str, package_path: str | None = None) -> list[str]:
    found = []
    for mod in imported_modules(source, package_path or package):
        top = mod.split(".")[0]
        if top == "ray" and package != "rollout":
            found.append(f"{package} imports {mod}: only rollout/ may import ray")
        if top in PACKAGES and top != package:
            allowed = ALLOWED[package]
            if top not in allowed and not any(mod == a or mod.startswith(a + ".") for a in allowed):
                found.append(
                    f"{package} imports {mod}: {package}/ may import only {sorted(allowed) or 'nothing of the project'}"
                )
        if package == "capsules" and top not in PACKAGES and top not in sys.stdlib_module_names:
            if top not in CAPSULES_THIRD_PARTY and top != "__future__":
                found.append(f"capsules imports {mod}: capsules/ may use only {sorted(CAPSULES_THIRD_PARTY)}")
    return found


def test_every_module_respects_the_layers():
    problems = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            package_path = ".".join(parts if parts[-1] == "__init__" else parts[:-1])
            for v in violations(package, path.read_text(), package_path):
                problems.append(f"{path.relative_to(ROOT)}: {v}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "package, source, fragment",
    [
        ("capsules", "import envs.tabletop", "capsules imports envs.tabletop"),
        ("capsules", "from rollout import host", "capsules imports rollout"),
        ("capsules", "import zarr", "may use only"),
        ("policies", "from envs import tabletop", "policies imports envs"),
        ("critics", "import policies.flow", "critics imports policies.flow"),
        ("critics", "from policies.common import encoders", "critics imports policies.common"),
        ("models", "from policies import flow_policy", "models imports policies"),
        ("envs", "import ray", "only rollout/ may import ray"),
        ("experiments", "def f():\n    import ray\n", "only rollout/ may import ray"),
        ("policies", "from . import helpers\nfrom envs.tabletop import Task", "policies imports envs.tabletop"),
    ],
)
def test_checker_flags_wrong_imports(package, source, fragment):
    assert any(fragment in v for v in violations(package, source, f"{package}.sub")), violations(package, source)


@pytest.mark.parametrize(
    "package, source",
    [
        ("critics", "from models.encoders import VisionEncoder"),
        ("policies", "from models.graph_runner import GraphRunner"),
        ("rollout", "import ray\nfrom envs import x\nfrom capsules import Arena"),
        ("capsules", "import torch\nimport numpy as np\nfrom safetensors import torch as st\nimport json"),
        ("capsules", "from .arena import Arena"),
        ("envs", "from ..rollout import recorder"),  # resolves to envs.rollout, inside envs
    ],
)
def test_checker_allows_right_imports(package, source):
    assert violations(package, source, f"{package}.sub") == []


# what every command shares; commands import these, never each other (shared code lives in learning/)
EXPERIMENTS_SHARED = {"console", "paths"}


def test_commands_never_import_each_other():
    problems = []
    for path in sorted((ROOT / "experiments").glob("*.py")):
        for mod in imported_modules(path.read_text(), "experiments"):
            parts = mod.split(".")
            if parts[0] == "experiments" and len(parts) > 1 and parts[1] not in EXPERIMENTS_SHARED:
                if (ROOT / "experiments" / f"{parts[1]}.py").exists() and parts[1] != path.stem:
                    problems.append(f"{path.relative_to(ROOT)} imports {mod}")
    assert not problems, "\n".join(problems)
