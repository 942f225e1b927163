"""Run directories written before the package was grouped by concept (tests/data/old_runs, made by `sim_rollout`
at commit 79008e7 under /tmp/oldrun, signed with the key below): copied anywhere, each replays bit for bit from
its old capsule and resumes where it stopped, with the command that made it. The tabletop run names the shipped
checkpoints where they lay then (`.../capsule_rollout/experiments/checkpoints/policy`). Their capsules hold the MuJoCo
they were made on (MADE_ON): another one is refused, by name, and never replayed as if it were the same."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mujoco
import pytest

from capsule_rollout.cli.run import main
from capsule_rollout.rollout import replay_episode
from capsule_rollout.shipped import SHIPPED, shipped_path
from capsule_rollout.stores import open_episode_reader

DATA = Path(__file__).resolve().parents[1] / "data" / "old_runs"
KEY = "old-run-fixture-key-2026-12"
MADE_ON = "4.0.0"  # the Makefile's MUJOCO_SPEC
OWN_ENV = 'examples.own_env_and_policy:make_env={"steps": 20}'
COMMANDS = {
    "tabletop_run": ["--family", "pick_place", "--max_steps", "12"],
    "own_env_run": ["--env", OWN_ENV, "--policy", "examples.own_env_and_policy:make_policy"],
}


@pytest.fixture
def old_run(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPSULE_ROLLOUT_KEY", KEY)

    def copy(name: str) -> Path:
        return Path(shutil.copytree(DATA / name, tmp_path / "moved" / name, symlinks=True))  # as cp -r and mv do

    return copy


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_an_old_run_moved_elsewhere_replays_and_resumes(old_run, name):
    assert mujoco.__version__ == MADE_ON, (
        f"the old runs were made on mujoco {MADE_ON}, this venv has {mujoco.__version__}: `make install` installs "
        f"the Makefile's MUJOCO_SPEC")
    run = old_run(name)
    recorded = json.loads((run / "rollout.json").read_text())
    assert recorded["capsule_dir"].startswith("/tmp/oldrun/")  # written where it was made, not where it is now
    [old_id] = open_episode_reader(run / "episodes.zarr").episode_ids
    before = replay_episode(run, old_id)
    assert before.exact and before.reset_kind == "restore", before.checks

    code = main(["sim_rollout", "--actors", "0", "--seeds.count", "2", "--out", str(run), *COMMANDS[name]])
    assert code == 0
    ids = open_episode_reader(run / "episodes.zarr").episode_ids
    assert ids[0] == old_id and len(ids) == 2  # the old episode kept, the next seed played
    assert replay_episode(run, ids[1]).exact


def test_an_old_run_on_another_mujoco_is_refused_by_name(old_run, monkeypatch):
    run = old_run("own_env_run")
    [old_id] = open_episode_reader(run / "episodes.zarr").episode_ids
    monkeypatch.setattr(mujoco, "__version__", "4.0.1")  # what an upgraded install reports
    with pytest.raises(RuntimeError, match=r"'env/mujoco': capsule has 4\.0\.0, arena has 4\.0\.1") as refused:
        replay_episode(run, old_id)
    assert "take a new snapshot" in str(refused.value)
    assert open_episode_reader(run / "episodes.zarr").episode_ids == [old_id]  # nothing recorded is lost


def test_the_shipped_checkpoints_are_found_as_any_install_named_them(tmp_path):
    for name in ("policy", "critic"):
        ours = str(SHIPPED / name)
        assert shipped_path(f"checkpoints/{name}") == ours
        assert shipped_path(f"experiments/checkpoints/{name}") == ours  # the place before
        assert shipped_path(f"/elsewhere/site-packages/capsule_rollout/experiments/checkpoints/{name}") == ours
        assert shipped_path(ours) == ours
    # a user's own path is never swapped for ours, found or not
    assert shipped_path("runs/train/checkpoints/policy") == "runs/train/checkpoints/policy"
    assert shipped_path("/data/checkpoints/policy") == "/data/checkpoints/policy"
    own = tmp_path / "checkpoints" / "policy"
    own.mkdir(parents=True)
    assert shipped_path(str(own)) == str(own)
