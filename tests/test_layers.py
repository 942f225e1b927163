"""DESIGN.md section 2: imports go one way; only rollout/ imports ray; capsules/ imports only
torch/numpy/triton/safetensors; commands in cli/ never import each other; the repository's benchmarks/
(not shipped) import the package, which never imports them."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

NS = "capsule_rollout"  # the one import namespace; its layers are subpackages
ROOT = Path(__file__).resolve().parents[1] / NS
PACKAGES = ("capsules", "models", "envs", "policies", "critics", "stores", "rollout", "learning", "tabletop", "commands",
            "cli", "robot_side")
# the repository's, beside the package and never shipped with it: benchmarks/ imports the package; the package
# imports none of them
REPOSITORY_ONLY = ("benchmarks", "tests", "examples")
BENCHMARKS = ROOT.parent / "benchmarks"
# The core: knows nothing of the tabletop example, which plugs into it as a user's package does (entry points)
CORE = ("capsules", "models", "envs", "policies", "critics", "stores", "rollout", "learning", "robot_side")
# package -> project modules it may import (a dotted entry allows that module only)
ALLOWED = {
    "capsules": set(),
    "models": {"capsules"},
    # the host's side of the robot bridge (envs.robot_client, robot_env) speaks the robot side's protocol
    "envs": {"capsules", "robot_side"},
    "policies": {"capsules", "models"},
    "critics": {"capsules", "models"},
    "stores": set(),  # episodes and their store formats: numpy, zarr, pyarrow; no other layer
    "rollout": {"capsules", "models", "envs", "policies", "critics", "stores", "robot_side"},
    # learning's loops run over the protocols (a RECAP recipe supplies the trainers); the example builds on them
    "learning": {"capsules", "models", "envs", "policies", "critics", "stores", "rollout", "robot_side"},
    "tabletop": {"capsules", "models", "envs", "policies", "critics", "stores", "rollout", "learning", "robot_side"},
    "commands": {"capsules", "models", "envs", "policies", "critics", "stores", "rollout", "learning", "robot_side"},
    "cli": {"capsules", "models", "envs", "policies", "critics", "stores", "rollout", "tabletop", "learning",
                    "commands", "robot_side"},
    # what runs on the robot's computer (numpy alone, LeRobot inside functions): the whole package, nothing else
    "robot_side": set(),
}
CAPSULES_THIRD_PARTY = {"torch", "numpy", "triton", "safetensors"}
# modules at the namespace's root that every layer may import: standard library only, importing no layer
ROOT_MODULES = {"contracts", "extras", "import_path", "input_bounds", "lazy_exports", "shipped", "user_code"}


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


def layer_of(mod: str) -> str | None:
    """`capsule_rollout.envs.x` -> `envs.x`; None for a module outside the namespace."""
    if mod == NS:
        return ""
    return mod[len(NS) + 1:] if mod.startswith(NS + ".") else None


def violations(package: str, source: str, package_path: str | None = None) -> list[str]:
    found = []
    for absolute in imported_modules(source, package_path or f"{NS}.{package}"):
        top = absolute.split(".")[0]
        if top == "ray" and package != "rollout":
            found.append(f"{package} imports {absolute}: only rollout/ may import ray")
        if top in PACKAGES:
            found.append(f"{package} imports {absolute}: the project's layers are imported as {NS}.{absolute}")
            continue
        if top in REPOSITORY_ONLY:
            found.append(f"{package} imports {absolute}: the package never imports the repository's {top}/ (not shipped)")
            continue
        mod = layer_of(absolute)
        if mod is None:
            if package == "capsules" and top not in sys.stdlib_module_names:
                if top not in CAPSULES_THIRD_PARTY and top != "__future__":
                    found.append(f"capsules imports {absolute}: capsules/ may use only {sorted(CAPSULES_THIRD_PARTY)}")
            continue
        layer = mod.split(".")[0]
        if layer in ROOT_MODULES:
            continue
        if layer and layer != package:
            allowed = ALLOWED[package]
            if layer not in allowed and not any(mod == a or mod.startswith(a + ".") for a in allowed):
                found.append(
                    f"{package} imports {mod}: {package}/ may import only {sorted(allowed) or 'nothing of the project'}"
                )
    return found


def test_every_module_respects_the_layers():
    problems = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT.parent).with_suffix("")
            parts = list(rel.parts)
            package_path = ".".join(parts if parts[-1] == "__init__" else parts[:-1])
            for v in violations(package, path.read_text(), package_path):
                problems.append(f"{path.relative_to(ROOT.parent)}: {v}")
    assert not problems, "\n".join(problems)


def test_the_core_imports_nothing_of_the_tabletop_example():
    for package in CORE:
        assert "tabletop" not in ALLOWED[package]
    assert violations("rollout", "from capsule_rollout.tabletop.flow_policy import load_policy", f"{NS}.rollout.x")


def test_root_modules_use_the_standard_library_only():
    """The standard library, and each other (`contracts` raises `user_code`'s error): never a layer."""
    assert {p.stem for p in ROOT.glob("*.py")} == ROOT_MODULES | {"__init__", "__main__"}
    for name in ROOT_MODULES:
        imported = imported_modules((ROOT / f"{name}.py").read_text(), NS)
        tops = {m.split(".")[0] for m in imported if m.split(".")[:2] not in ([NS, r] for r in ROOT_MODULES)}
        assert tops <= set(sys.stdlib_module_names) | {"__future__"}, (name, tops)


def test_the_namespace_root_imports_no_layer():
    """`import capsule_rollout` defines the version and nothing else: no layer (and so no torch, mujoco or ray)
    is loaded by it."""
    for path in (ROOT / "__init__.py", ROOT / "__main__.py"):
        mods = [layer_of(m) for m in imported_modules(path.read_text(), NS)]
        if path.name == "__init__.py":
            assert [m for m in mods if m] == [], f"{path.name} imports {mods}"
        else:  # the CLI: the entry point's module only
            assert {m.split(".")[0] for m in mods if m} <= {"cli"}


@pytest.mark.parametrize(
    "package, source, fragment",
    [
        ("capsules", "import capsule_rollout.envs.tabletop", "capsules imports envs.tabletop"),
        ("capsules", "from capsule_rollout.rollout import host", "capsules imports rollout"),
        ("capsules", "import zarr", "may use only"),
        ("policies", "from capsule_rollout.envs import tabletop", "policies imports envs"),
        ("critics", "import capsule_rollout.policies.flow", "critics imports policies.flow"),
        ("critics", "from capsule_rollout.policies.common import encoders", "critics imports policies.common"),
        ("models", "from capsule_rollout.policies import rollout_policy", "models imports policies"),
        ("policies", "from capsule_rollout.tabletop import flow_policy", "policies imports tabletop"),
        ("envs", "import ray", "only rollout/ may import ray"),
        ("cli", "def f():\n    import ray\n", "only rollout/ may import ray"),
        ("policies", "from . import helpers\nfrom capsule_rollout.envs.tabletop import Task",
         "policies imports envs.tabletop"),
        ("rollout", "import envs.tabletop", "imported as capsule_rollout.envs.tabletop"),
        ("rollout", "from capsule_rollout import learning", "rollout imports learning"),
        ("cli", "from benchmarks.capsules import run", "never imports the repository's benchmarks/"),
        ("commands", "def f():\n    import benchmarks.harness\n", "never imports the repository's benchmarks/"),
        ("rollout", "from tests.rollout.fakes import fake_episode", "never imports the repository's tests/"),
    ],
)
def test_checker_flags_wrong_imports(package, source, fragment):
    assert any(fragment in v for v in violations(package, source, f"{NS}.{package}.sub")), violations(package, source)


@pytest.mark.parametrize(
    "package, source",
    [
        ("critics", "from capsule_rollout.models.graph_runner import GraphRunner"),
        ("policies", "from capsule_rollout.models.graph_runner import GraphRunner"),
        ("rollout", "import ray\nfrom capsule_rollout.envs import x\nfrom capsule_rollout.capsules import Arena"),
        ("capsules", "import torch\nimport numpy as np\nfrom safetensors import torch as st\nimport json"),
        ("capsules", "from .arena import Arena"),
        ("envs", "from ..rollout import recorder"),  # resolves to envs.rollout, inside envs
    ],
)
def test_checker_allows_right_imports(package, source):
    assert violations(package, source, f"{NS}.{package}.sub") == []


def test_nothing_in_the_package_imports_the_repositorys_benchmarks_tests_or_examples():
    """Every module of the package, its root modules and `__main__` included: a wheel has no benchmarks/, tests/ or
    examples/ to import."""
    problems = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        package_path = ".".join(rel.parts if rel.parts[-1] == "__init__" else rel.parts[:-1])
        problems += [f"{rel}: imports {m}" for m in imported_modules(path.read_text(), package_path)
                     if m.split(".")[0] in REPOSITORY_ONLY]
    assert not problems, "\n".join(problems)


def test_the_benchmarks_import_the_package_by_its_name_and_nothing_of_the_repository():
    """benchmarks/ may import anything of the package (as `capsule_rollout.*`) and each other's shared modules; never
    a bare layer name, tests/ or examples/ (an example env is named by its import path, as a user names theirs), nor
    ray (rollout/ starts it)."""
    assert sorted(p.stem for p in BENCHMARKS.glob("*.py"))  # the directory is where this test looks
    problems = []
    for path in sorted(BENCHMARKS.glob("*.py")):
        for mod in imported_modules(path.read_text(), "benchmarks"):
            top = mod.split(".")[0]
            if top in PACKAGES or top in ("tests", "examples", "ray"):
                problems.append(f"benchmarks/{path.name} imports {mod}")
    assert not problems, "\n".join(problems)


# what every command shares; commands import these, never each other (shared code lives in learning/)
EXPERIMENTS_SHARED = {"console", "paths", "recap_report"}


def test_commands_never_import_each_other():
    problems = []
    for path in sorted((ROOT / "cli").glob("*.py")):
        for mod in imported_modules(path.read_text(), f"{NS}.cli"):
            parts = (layer_of(mod) or "").split(".")
            if parts[0] == "cli" and len(parts) > 1 and parts[1] not in EXPERIMENTS_SHARED:
                if (ROOT / "cli" / f"{parts[1]}.py").exists() and parts[1] != path.stem:
                    problems.append(f"{path.relative_to(ROOT)} imports {mod}")
    assert not problems, "\n".join(problems)


def _imports_by_depth(source: str, package_path: str) -> tuple[list[str], list[str]]:
    """(modules imported when the module is imported, modules imported inside its functions); what an
    `if TYPE_CHECKING:` block imports is neither."""
    top, inner = [], []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                (inner if in_function else top).extend(imported_modules(ast.unparse(child), package_path))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(source), False)
    return top, inner


def _project_module(name: str) -> str | None:
    """`capsule_rollout.robot_side.server` for any name under it that is a module file of the project."""
    parts = name.split(".")
    while parts and parts[0] == NS:
        path = ROOT.parent.joinpath(*parts)
        if path.with_suffix(".py").is_file() or (path / "__init__.py").is_file():
            return ".".join(parts)
        parts = parts[:-1]
    return None


def robot_side_closure() -> tuple[set[str], set[str], set[str]]:
    """(project modules the robot side imports, transitively; third-party packages they import at module level;
    third-party packages they import inside functions)."""
    todo = [f"{NS}.robot_side.{p.stem}" for p in (ROOT / "robot_side").glob("*.py") if p.stem != "__init__"]
    seen, top_level, in_functions = set(), set(), set()
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        path = ROOT.parent.joinpath(*mod.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        package_path = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        top, inner = _imports_by_depth(path.read_text(), package_path)
        for names, third in ((top, top_level), (inner, in_functions)):
            for name in names:
                project = _project_module(name)
                if project is not None:
                    todo.append(project)
                elif name.split(".")[0] not in (NS, "__future__") and name.split(".")[0] not in sys.stdlib_module_names:
                    third.add(name.split(".")[0])
        parent = mod.rpartition(".")[0]
        while parent:  # importing a module imports its packages
            todo.append(parent)
            parent = parent.rpartition(".")[0]
    return seen, top_level, in_functions


def test_the_robot_side_imports_numpy_alone_and_ships_all_it_imports():
    """The robot side (the package robot_side/, whole) imports numpy alone when imported, LeRobot and its parser
    (draccus) only inside the functions that build a LeRobot robot, and of the project only itself and the
    namespace's root modules; its distribution (packaging/robot) ships the package and exactly those root modules."""
    import tomllib

    modules, top_level, in_functions = robot_side_closure()
    assert top_level == {"numpy"}, top_level
    assert in_functions <= {"numpy", "lerobot", "draccus"}, in_functions
    layers = {m[len(NS) + 1:] for m in modules if m != NS}
    assert not {m.split(".")[0] for m in layers} - {"robot_side"} - ROOT_MODULES, sorted(layers)
    project = tomllib.loads((ROOT.parent / "packaging" / "robot" / "pyproject.toml").read_text())
    setup = project["tool"]["setuptools"]
    assert setup["packages"] == [f"{NS}.robot_side"]
    whole = {f"{NS}.robot_side.{p.stem}" for p in (ROOT / "robot_side").glob("*.py") if p.stem != "__init__"}
    assert whole <= modules
    roots = {m for m in modules if m.split(".")[1:2] and m.split(".")[1] in ROOT_MODULES}
    assert set(setup["py-modules"]) == roots, (sorted(setup["py-modules"]), sorted(roots))
    main = tomllib.loads((ROOT.parent / "pyproject.toml").read_text())
    assert project["project"]["version"] == main["project"]["version"]
    assert project["project"]["dependencies"] == ["numpy>=1.26"]


def test_a_missing_extra_says_the_command_a_wheel_user_runs(monkeypatch):
    """Extras are named the way that works where the user stands (a wheel: the distribution's extra)."""
    import sys

    from capsule_rollout.extras import MissingExtraError
    from capsule_rollout.stores import lerobot_format

    monkeypatch.setitem(sys.modules, "av", None)  # as if PyAV were not installed
    with pytest.raises(MissingExtraError) as caught:
        lerobot_format.require_optional()
    message = str(caught.value)
    assert 'pip install "capsule-rollout[lerobot]"' in message and "\n" not in message
    assert isinstance(caught.value, ImportError) and caught.value.__cause__ is None


def test_designs_map_names_every_package_and_root_module_and_no_module_name_is_twice():
    """docs/DESIGN.md section 2's map of packages is the tree: each of its rows names a package (or the shipped
    checkpoints' folder, or a module at the namespace's root), every one is named; and no two modules of the
    package share a name (one package per concept)."""
    text = (ROOT.parent / "docs" / "DESIGN.md").read_text()
    block = text[text.index("## 2. Layers"):text.index("## 3.")].split("```")[1]
    named = {line.split()[0].rstrip("/") for line in block.splitlines() if line.strip() and line[0] not in " -"}
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    roots = {p.stem for p in ROOT.glob("*.py") if p.stem not in ("__init__", "__main__")}
    assert named == packages | roots | {"checkpoints", "benchmarks"}, (sorted(named - packages - roots),
                                                                       sorted(packages | roots - named))
    assert (ROOT / "checkpoints").is_dir() and not list((ROOT / "checkpoints").rglob("*.py"))  # data, no code
    stems = [p.stem for p in ROOT.rglob("*.py") if p.stem != "__init__"]
    assert not {s for s in stems if stems.count(s) > 1}, sorted({s for s in stems if stems.count(s) > 1})
