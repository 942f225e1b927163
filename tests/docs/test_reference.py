"""The reference pages made at every docs build list what the code has: every registered command with every
option (and its old names), every public name of every package that has an `__all__`, every module."""

from __future__ import annotations

import importlib
import re
import types

import pytest

from capsule_rollout.commands import registry
from capsule_rollout.commands.option_parsing import flat_fields, old_names
from tests.docs.reference_pages import load

ref = load()


@pytest.fixture(scope="module")
def commands_page() -> str:
    return ref.render_commands()


def _section(page: str, name: str) -> str:
    start = page.index(f"\n## {name}\n")
    end = page.find("\n## ", start + 1)
    return page[start:] if end < 0 else page[start:end]


def test_every_registered_command_has_a_section(commands_page):
    names = registry.names()
    assert len(names) >= 20
    headings = re.findall(r"^## (\S+)$", commands_page, re.M)
    assert headings == names  # each once, in the registry's order
    for name in names:
        assert f"| [`{name}`](#{name}) |" in commands_page


@pytest.mark.parametrize("name", registry.names())
def test_every_option_of_a_command_is_listed_with_its_old_names(commands_page, name):
    section = _section(commands_page, name)
    config = registry.get(name).config
    listed = re.findall(r"^\s*- `--([\w.]+)` ", section, re.M)
    assert listed == [option for option, _, _ in flat_fields(config)]
    for option, olds in old_names(config).items():
        line = next(ln for ln in section.splitlines() if ln.lstrip().startswith(f"- `--{option}` "))
        assert all(f"`{old}`" in line for old in olds), line


def test_an_option_shows_its_type_default_and_docstring(commands_page):
    section = _section(commands_page, "replay")
    assert "- `--store` `STR` (default `runs/sim_rollout/episodes.zarr`): Zarr store written by sim_rollout" in section
    assert "- `--trust` `[BOOL]` (default `false`)" in section
    assert "- `--slots` `INT|none` (default `none`)" in section
    sim = _section(commands_page, "sim_rollout")
    assert "- **`--seeds.*`**: A block of consecutive episode seeds" in sim
    assert "    - `--seeds.count` `INT` (default `8`) (old name `--episodes`)" in sim
    assert "`{pick_place,stack,arrange,sort,all}`" in sim


def test_a_group_without_a_docstring_shows_its_comment_not_a_signature(commands_page):
    study = _section(commands_page, "recap_study")
    group = next(line for line in study.splitlines() if line.startswith("- **`--recap.*`**"))
    assert "RecapConfig(" not in group


def test_prose_is_escaped_outside_code_spans_only():
    assert ref._md("a <store>.npz and `<store>` --x.*") == r"a &lt;store&gt;.npz and `<store>` --x.\*"


def test_every_public_name_has_an_api_entry():
    modules = ref.public_modules()
    assert {"capsule_rollout.rollout", "capsule_rollout.capsules", "capsule_rollout.envs", "capsule_rollout.stores",
            "capsule_rollout.policies", "capsule_rollout.critics", "capsule_rollout.contracts"} <= set(modules)
    pages = ref.api_pages()
    for module, (names, _) in modules.items():
        imported = importlib.import_module(module)
        assert sorted(names) == sorted(imported.__all__), module
        page = pages[f"reference/api/{module.removeprefix('capsule_rollout.')}.md"]
        for name in imported.__all__:
            assert re.search(rf"^::: [\w.]+\.{name}$", page, re.M), f"{module}.{name}"
            target = re.search(rf"^::: ([\w.]+)\.{name}$", page, re.M).group(1)
            documented = getattr(importlib.import_module(target), name)  # what griffe reads there
            assert not isinstance(documented, types.ModuleType), (name, target)


def test_every_package_with_an_all_is_documented():
    documented = set(ref.public_modules())
    for path in sorted(ref.PACKAGE.iterdir()):
        if path.name.startswith("_") or not ((path / "__init__.py").exists() or path.suffix == ".py"):
            continue
        module = importlib.import_module(f"capsule_rollout.{path.stem}")
        assert (hasattr(module, "__all__")) == (module.__name__ in documented), module.__name__


def test_every_module_is_in_the_modules_page():
    page = ref.render_modules()
    for path in ref.PACKAGE.rglob("*.py"):
        if path.name != "__init__.py" and "checkpoints" not in path.parts:
            assert f"- `{path.name}`: " in page, path
    assert "## `capsule_rollout.rollout`" in page
