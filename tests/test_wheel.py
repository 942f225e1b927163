"""The wheel ships the package alone (no `benchmarks`, `tests` or `examples` module: those live in the repository)
and still carries the shipped checkpoints (`capsule_rollout/checkpoints`)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel_files(tmp_path_factory) -> list[str]:
    """The file list of a wheel built offline from a copy of the sources (the repository's own build/ may hold files
    of an older tree, which setuptools would pack)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("capsule_rollout", "benchmarks", "tests", "examples"):  # what must stay out is there to leave out
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                           "-q", "-w", str(tmp / "dist"), str(src)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [wheel] = (tmp / "dist").glob("capsule_rollout-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


@pytest.mark.slow
def test_the_wheel_ships_the_package_alone(wheel_files):
    tops = {name.split("/")[0] for name in wheel_files}
    assert {t for t in tops if not t.endswith((".dist-info", ".data"))} == {"capsule_rollout"}, sorted(tops)
    assert not any(name.split("/")[1] == "benchmarks" for name in wheel_files if name.count("/") > 1)
    assert "capsule_rollout/__main__.py" in wheel_files and "capsule_rollout/cli/run.py" in wheel_files


@pytest.mark.slow
def test_the_wheel_carries_the_shipped_checkpoints(wheel_files):
    shipped = {p.relative_to(ROOT).as_posix() for p in (ROOT / "capsule_rollout/checkpoints").glob("*/*")
               if p.is_file()}
    assert shipped and shipped <= set(wheel_files), sorted(shipped - set(wheel_files))
    assert {name.split("/")[2] for name in shipped} == {"policy", "critic"}
    assert "capsule_rollout/models/exact_kernel.cpp" in wheel_files  # the exact linear operator's source (built here)
