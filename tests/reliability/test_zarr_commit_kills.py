"""A process killed before each filesystem operation of a zarr append: every reader sees the episodes
from before the batch or all of them, never a partial or repeated one, and resuming gives the store an
uninterrupted run gives.

Readers: this project's `ZarrEpisodeReader`, plain zarr (format 2 store, read with zarr-python 3 here and
with zarr 2 in the slow test) and diffusion_policy's `ReplayBuffer` logic (`read_store.py`). The default
run kills before every operation that can change what a reader sees (renames and links: zarr writes
each key to a temp file and renames it; the commit is a link swap) at the start of the append and through
its commit; the slow run kills before every operation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

from capsule_rollout.stores.zarr_reader import ZarrEpisodeReader
from capsule_rollout.stores.zarr_recorder import ZarrRecorder
from tests.reliability import read_store
from tests.rollout.fakes import fake_episode

ROOT = Path(__file__).resolve().parents[2]
KILLER = ROOT / "tests/reliability/commit_killer.py"
BASE, BATCH = 2, 2  # episodes in the store, episodes in the killed append
VISIBLE = ("replace", "rename", "link", "symlink", "rmdir")


def _episode(i):
    return fake_episode(i, length=5 + i % 4, image_size=16)  # as commit_killer.py makes them


def _killer(base: Path, workdir: Path, kills: list[int]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(KILLER), str(base), str(workdir), str(BASE), str(BATCH),
                          *map(str, kills)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _default_kills(kinds: list[str]) -> list[int]:
    """Before the first 3 and the last 12 operations that can change a path a reader sees (renames, links,
    the first removal of a run): the start of the append and the whole commit at its end."""
    first = lambda i: kinds[i] == "unlink" and (i == 0 or kinds[i - 1] != "unlink")  # noqa: E731
    visible = [i for i, kind in enumerate(kinds) if kind.split()[0] in VISIBLE or first(i)]
    return sorted(set(visible[:3] + visible[-12:]))


def _kill_run(tmp_path_factory, every_op: bool) -> dict:
    work = tmp_path_factory.mktemp("kills")
    base = work / "base.zarr"
    with ZarrRecorder(base) as rec:
        for i in range(BASE):
            rec.write(_episode(i))
    counted = _killer(base, work, [-1])
    kinds = counted["kinds"]
    kills = list(range(len(kinds))) if every_op else _default_kills(kinds)
    status = _killer(base, work, kills)["status"]
    assert all(code == 9 for code in status.values()), status  # each one died where it was told to
    return {"work": work, "kills": kills, "ops": len(kinds), "complete": work / "count",
            "stores": [work / f"k{k}" for k in kills]}


@pytest.fixture(scope="module")
def kill_run(tmp_path_factory):
    return _kill_run(tmp_path_factory, every_op=False)


BEFORE = [f"ep-{i:05d}" for i in range(BASE)]
AFTER = [f"ep-{i:05d}" for i in range(BASE + BATCH)]


def _project_ids(path: Path) -> list[str] | str:
    try:
        reader = ZarrEpisodeReader(path)
        ids = reader.episode_ids
        for i, ep in enumerate(reader.episodes(keys=["state"])):  # the rows are the episode's own
            assert (ep.steps["state"][:, 0] == int(ids[i][3:])).all()
            assert np.array_equal(ep.steps["state"][:, 1], np.arange(ep.length))
        return ids
    except Exception as exc:  # noqa: BLE001 - what the reader saw is the result
        return f"{type(exc).__name__}: {exc}"


def _tally(report, section: str, seen: dict[Path, dict[str, object]]) -> None:
    """Count stores where every reader saw the episodes before or after the batch, and partial/duplicate ones."""
    whole = sum(all(v in (BEFORE, AFTER) for v in readers.values()) for readers in seen.values())
    partial = sum(any(isinstance(v, list) and v not in (BEFORE, AFTER) and len(set(v)) == len(v)
                      for v in readers.values()) for readers in seen.values())
    duplicates = sum(any(isinstance(v, list) and len(set(v)) != len(v) for v in readers.values())
                     for readers in seen.values())
    report.add(section, kills=len(seen), stores_every_reader_opens=whole, partial_episodes=partial,
               duplicates=duplicates)


def test_every_reader_sees_the_episodes_before_or_after_the_killed_batch(kill_run, report):
    seen = {}
    for path in kill_run["stores"]:
        readers = {"project": _project_ids(path)}
        for name, read in (("plain zarr 3", read_store.read_plain), ("diffusion_policy", read_store.read_diffusion_policy)):
            try:
                readers[name] = read(str(path))
            except Exception as exc:  # noqa: BLE001
                readers[name] = f"{type(exc).__name__}: {exc}"
        seen[path] = readers
    _tally(report, "zarr kill-during-commit (zarr 3 readers)", seen)
    bad = {p.name: r for p, r in seen.items() if not all(v in (BEFORE, AFTER) for v in r.values())}
    assert not bad, bad
    outcomes = {tuple(r["project"]) for r in seen.values()}
    assert outcomes == {tuple(BEFORE), tuple(AFTER)}  # kills fell on both sides of the commit


def _arrays(path: Path) -> dict[str, np.ndarray]:
    root = zarr.open_group(str(path), mode="r")
    return {f"{g}/{k}": np.asarray(a[:]) for g in ("data", "meta") for k, a in root[g].arrays()}


def test_a_killed_append_resumes_to_what_an_uninterrupted_run_writes(kill_run, report):
    expected = _arrays(kill_run["complete"])
    resumed = kill_run["stores"][::2]  # every other one: a resume costs a recorder
    report.add("zarr kill-during-commit (zarr 3 readers)", resumed=len(resumed))
    for path in resumed:
        with ZarrRecorder(path) as rec:
            for i in range(BASE + BATCH):
                if f"ep-{i:05d}" not in rec:
                    rec.write(_episode(i))
        got = _arrays(path)
        assert set(got) == set(expected), path.name
        for key, value in expected.items():
            assert np.array_equal(got[key], value, equal_nan=value.dtype.kind == "f"), (path.name, key)
        report.add("zarr kill-during-commit (zarr 3 readers)", resumed_identical=1)


@pytest.mark.slow
def test_a_kill_before_any_operation_leaves_a_store_zarr_2_readers_open_whole(tmp_path_factory, report):
    """Every operation, and the readers run with zarr 2 (a venv made for it; skipped if it cannot be)."""
    run = _kill_run(tmp_path_factory, every_op=True)
    python = _zarr2_python(tmp_path_factory)
    out = subprocess.run([python, str(ROOT / "tests/reliability/read_store.py"), *map(str, run["stores"])],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    assert result["zarr"].startswith("2.")
    seen = {}
    for path in run["stores"]:
        readers = {f"{k} (zarr 2)": v.get("ids", v.get("error")) for k, v in result["stores"][str(path)].items()}
        readers["project"] = _project_ids(path)
        seen[path] = readers
    _tally(report, "zarr kill-during-commit, every operation (zarr 2 readers)", seen)
    bad = {p.name: r for p, r in seen.items() if not all(v in (BEFORE, AFTER) for v in r.values())}
    assert not bad, bad


def _zarr2_python(tmp_path_factory) -> str:
    """A Python with zarr 2: $ZARR2_PYTHON, else a venv made here (needs the package index)."""
    given = os.environ.get("ZARR2_PYTHON")
    if given:
        return given
    venv = tmp_path_factory.mktemp("zarr2") / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True)
    install = subprocess.run([str(venv / "bin/pip"), "install", "-q", "zarr>=2.18,<3", "numpy"], capture_output=True,
                             text=True)
    if made.returncode or install.returncode:
        pytest.skip(f"could not install zarr 2 in a venv: {install.stderr[-300:]}")
    return str(venv / "bin/python")
