"""The one import-path resolver: each way a `package.module:name` can fail is named for what it is."""

from __future__ import annotations

import pytest

from capsule_rollout.envs.suites.catalog import make_env, parse_env_id
from capsule_rollout.import_path import ImportPathError, resolve


@pytest.fixture
def lab(tmp_path, monkeypatch):
    """A user's package: one good module, one whose own dependency is missing, one that raises."""
    pkg = tmp_path / "labpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "good.py").write_text("class Maker:\n    @staticmethod\n    def build():\n        return 7\n\n"
                                 "def make_env():\n    return 3\n")
    (pkg / "needs_dep.py").write_text("import not_installed_dependency_xyz\n\ndef make_env():\n    return 1\n")
    (pkg / "broken.py").write_text("raise RuntimeError('the lab module is broken')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "labpkg"


def test_resolves_a_name_and_a_dotted_attribute(lab):
    assert resolve("labpkg.good:make_env")() == 3
    assert resolve("labpkg.good:Maker.build")() == 7


@pytest.mark.parametrize("path, fragment", [
    ("labpkg.good", "give an import path `package.module:name`"),
    ("labpkg.good:", "give an import path"),
    ("labpkg.good:make-env", "give an import path"),
    ("labpkg.nowhere:make_env", "no module 'labpkg.nowhere' on the Python path"),
    ("nowhere_pkg.mod:make_env", "no module 'nowhere_pkg.mod'"),
    ("labpkg.needs_dep:make_env", "failed to import: ModuleNotFoundError: No module named 'not_installed_dependency_xyz'"),
    ("labpkg.broken:make_env", "failed to import: RuntimeError: the lab module is broken"),
    ("labpkg.good:make_evn", "has no attribute 'make_evn'; did you mean make_env?"),
    ("labpkg.good:Maker.biuld", "labpkg.good:Maker has no attribute 'biuld'; did you mean build?"),
])
def test_each_failure_says_what_failed(lab, path, fragment):
    with pytest.raises(ImportPathError) as info:
        resolve(path, "env")
    assert fragment in str(info.value) and str(info.value).startswith(f"env {path!r}")
    assert isinstance(info.value, ValueError)  # callers that catch ValueError keep working


def test_an_env_module_missing_a_dependency_is_reported_as_that_not_as_an_unknown_suite(lab):
    suite, task = parse_env_id("labpkg.needs_dep:make_env")
    assert suite is None
    with pytest.raises(ImportPathError, match="No module named 'not_installed_dependency_xyz'"):
        make_env("labpkg.needs_dep:make_env")
    with pytest.raises(ValueError, match="no suite 'metawrld' \\(did you mean 'metaworld'\\?\\)"):
        parse_env_id("metawrld:pick-place-v3")


@pytest.mark.parametrize("command", ["sim_rollout", "eval_policy"])
def test_an_env_module_that_fails_to_import_is_one_line_before_anything_runs(lab, command, tmp_path, capsys):
    """The entry points check a factory's env module with the rest of their inputs: exit 2, the import error."""
    from capsule_rollout.cli.run import main

    policy = "labpkg.good:make_env"  # importable: the env is what fails
    option = "--policy" if command == "sim_rollout" else "--model.policy"
    code = main([command, "--env", "labpkg.needs_dep:make_env", option, policy, "--out", str(tmp_path / "o")]
                if command == "sim_rollout" else [command, "--env", "labpkg.needs_dep:make_env", option, policy])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "module 'labpkg.needs_dep' was found but failed to import: ModuleNotFoundError" in err
    assert "Traceback" not in err and not (tmp_path / "o").exists()
