"""Inputs bounded before work starts: each bad one is refused in one line with exit status 2, before anything is
built or written (the process's peak memory stays what importing the commands takes).

The command lines run in a child process (`bad_inputs.py`), so its peak memory is the commands' own, and a
command that starts to build what it was asked for (10**12 work items, 100,000 env slots) runs out of time
there instead of stalling the suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from capsule_rollout.input_bounds import SEED_LIMIT

ROOT = Path(__file__).resolve().parents[2]
CHILD = ROOT / "tests/cli/bad_inputs.py"
PEAK_MB = 1500  # importing torch, MuJoCo and the commands: about 350 MB here; 10**12 items pass 6 GB in a minute


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}


def _refused(cases: list[list[str]], **run) -> list[dict]:
    """Each command line's exit status and stderr lines, from one child process; every one refused in one line."""
    run = {"env": _env(), **run}
    child = subprocess.run([sys.executable, str(CHILD), *map(json.dumps, cases)], cwd=ROOT, capture_output=True,
                           text=True, timeout=300, **run)
    assert child.returncode == 0, child.stderr[-3000:]
    results = [json.loads(line) for line in child.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(cases), child.stdout[-3000:]
    for result in results:
        assert result["code"] == 2 and len(result["stderr"]) == 1, result
        assert result["stderr"][0].startswith("error: "), result
    return results


def test_non_finite_options_seeds_out_of_range_and_counts_past_the_machine_are_refused_in_one_line(tmp_path):
    out = str(tmp_path / "run")
    cases = {
        "--value_threshold must be a finite number, got nan (none: no low-value stop)":
            ["sim_rollout", "--value_threshold", "nan", "--out", out],
        "--episode_timeout_s must be a finite number, got inf (0: no deadline; none: derived per phase)":
            ["sim_rollout", "--episode_timeout_s", "inf", "--out", out],
        "--seconds must be a finite number, got inf":  # any float option, through the CLI's one check
            ["sim_robot_server", "--seconds", "inf"],
        "--act.*: beta must be a finite number, got inf": ["sim_rollout", "--act.beta", "inf", "--out", out],
        f"--seeds.*: first {2**70}: seeds are 0 .. {SEED_LIMIT - 1} (numpy's seeding range":
            ["sim_rollout", "--seed", str(2**70), "--out", out],
        f"--seed {2**70}: seeds are 0 .. {SEED_LIMIT - 1}": ["collect_demos", "--seed", str(2**70), "--out", out],
        f"count {10**12:,}: at most {SEED_LIMIT:,} seeds": ["sim_rollout", "--episodes", str(10**12), "--out", out],
        "--seeds.count (--episodes): 4,000,000,000 episodes in one run; its driver keeps about 16 KB per episode":
            ["sim_rollout", "--episodes", "4000000000", "--out", out],
        "--seeds.count (--episodes) x --repeats 1000: 1,000,000,000 episodes":
            ["sim_rollout", "--episodes", "1000000", "--repeats", "1000", "--out", out],
        "--slots 100,000: an actor of 100,000 env slots needs about": ["sim_rollout", "--slots", "100000", "--out", out],
        "--slots 1,000,000: an actor of 1,000,000 env slots needs about":  # before any store is opened
            ["replay", "--store", out, "--episode", "x-s1", "--slots", "1000000"],
        "--actors 100,000: one driver records for about 1,000 actors": ["sim_rollout", "--actors", "100000", "--out",
                                                                        out],
        "--seeds.count (--episodes): 4,000,000,000 episodes": ["eval_policy", "--episodes", "4000000000"],
    }
    results = _refused(list(cases.values()))
    for expected, result in zip(cases, results, strict=True):
        assert expected in result["stderr"][0], result
    assert max(r["peak_mb"] for r in results) < PEAK_MB  # nothing was built for them
    assert not Path(out).exists()  # nor written


def test_an_output_path_that_is_a_file_or_under_one_is_refused_before_anything_runs(tmp_path):
    file = tmp_path / "file"
    file.write_text("not a directory\n")
    store = str(tmp_path / "store.zarr")  # consolidate and export_lerobot check --out before they read it
    commands = {"sim_rollout": [], "collect_demos": ["--episodes", "1"], "consolidate": ["--store", store],
                "export_lerobot": ["--store", store]}
    cases = [[name, *extra, "--out", out] for name, extra in commands.items()
             for out in (str(file), str(file / "sub"))]
    results = _refused(cases)
    for case, result in zip(cases, results, strict=True):
        line = result["stderr"][0]
        if case[-1] == str(file):
            assert line == f"error: --out {file} is a file; give a directory (new, or one to add to)", result
        else:
            assert f"{file} is a file, not a directory" in line, result
    assert file.read_text() == "not a directory\n"


def test_a_read_only_output_directory_is_refused_before_anything_runs(tmp_path):
    read_only = tmp_path / "ro"
    read_only.mkdir()
    read_only.chmod(0o555)
    # root writes anywhere: the child then sees the directory as another user would (`bad_inputs.py`)
    env = {"READ_ONLY_DIR": str(read_only)} if os.geteuid() == 0 else {}
    commands = {"sim_rollout": [], "collect_demos": ["--episodes", "1"],
                "consolidate": ["--store", str(tmp_path / "store.zarr")], "export_lerobot": ["--store", str(tmp_path)]}
    cases = [[name, *extra, "--out", str(read_only / "out")] for name, extra in commands.items()]
    try:
        for result in _refused(cases, env={**_env(), **env}):
            assert f"{read_only} (where {read_only / 'out'} would be made) is not writable by this user" in \
                result["stderr"][0], result
        assert list(read_only.iterdir()) == []
    finally:
        read_only.chmod(0o755)


@pytest.mark.parametrize("kind", ["directory in its place"])
def test_a_writer_lock_that_cannot_be_opened_is_one_line_and_no_noise_at_exit(tmp_path, kind):
    store = tmp_path / "demos.zarr"
    (store / ".writer.lock").mkdir(parents=True)  # what a user's mistake, or another tool, left there
    run = subprocess.run([sys.executable, "-m", "capsule_rollout", "collect_demos", "--episodes", "1", "--out",
                          str(store), "--no-progress"], cwd=ROOT, env=_env(), capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 2, run.stderr[-3000:]
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert lines == [f"error: cannot open the zarr store's writer lock {store / '.writer.lock'}: Is a directory; "
                     "record to a directory you can write (another --out), or remove what is in the lock file's "
                     "place"], run.stderr[-3000:]  # no traceback, no "Exception ignored ... '_fd'"
