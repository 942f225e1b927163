"""The scripts in examples/ run as a user runs them: on 2 Ray actors, with capsule resets, recording and a
bit-exact replay; and the same env and policy through sim_rollout and replay on the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from capsule_rollout.stores.sharded_reader import open_episode_reader

pytestmark = pytest.mark.ray
ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = "examples.own_env_and_policy"


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_own_env_and_policy_example_within_70_lines():
    assert len((ROOT / "examples/own_env_and_policy.py").read_text().splitlines()) <= 70


def test_own_env_and_policy_example_runs_on_two_actors_and_replays_bit_for_bit(tmp_path):
    out = _run(["-m", EXAMPLE], tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "resets {'cold': 3, 'restore': 3}" in out.stdout
    assert "replay bit-identical: True" in out.stdout
    reader = open_episode_reader(tmp_path / "runs/example/episodes.zarr")
    assert len(reader) == 6 and {reader.meta(i).repeat for i in range(6)} == {0, 1}


def test_the_same_through_sim_rollout_and_replay(tmp_path):
    run = tmp_path / "cli"
    out = _run(["-m", "capsule_rollout", "sim_rollout", "--env", f"{EXAMPLE}:make_env", "--policy",
                f"{EXAMPLE}:make_policy", "--actors", "2", "--seeds.first", "0", "--episodes", "2",
                "--repeats", "2", "--out", str(run), "--json", str(tmp_path / "s.json"), "--no-progress"], tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["episodes"] == 4 and summary["reset_kinds"] == {"cold": 2, "restore": 2}
    spec = json.loads((run / "rollout.json").read_text())
    assert spec["policy"] == f"{EXAMPLE}:make_policy" and spec["critic"] == ""  # the tabletop critic is not a default here
    episode = f"{EXAMPLE}_make_env-s0000001-r1"  # file-system-safe: no colon
    ids = open_episode_reader(run / "episodes.zarr").episode_ids
    assert episode in ids, ids
    out = _run(["-m", "capsule_rollout", "replay", "--store", str(run / "episodes.zarr"), "--episode", episode,
                "--json", str(tmp_path / "r.json")], tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert json.loads((tmp_path / "r.json").read_text())["exact"] is True


def test_eval_policy_takes_the_users_env_and_policy_by_import_path_on_ray_too(tmp_path):
    """The evaluation entry point plays a foreign env and policy through the one loop: the same successes per
    seed in this process and on 2 Ray actors."""
    results = {}
    for actors in (0, 2):
        out = _run(["-m", "capsule_rollout", "eval_policy", "--env", f"{EXAMPLE}:make_env", "--model.policy",
                    f"{EXAMPLE}:make_policy", "--seeds.first", "0", "--episodes", "4", "--actors", str(actors),
                    "--json", str(tmp_path / f"e{actors}.json")], tmp_path)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
        results[actors] = json.loads((tmp_path / f"e{actors}.json").read_text())["policy"]
    assert results[0]["episodes"] == 4 and results[0]["success_by_seed"] == results[2]["success_by_seed"]
    assert results[0]["sim_seconds"] is None  # the env tells no control rate: no simulated-time figures
    out = _run(["-m", "capsule_rollout", "eval_policy", "--env", f"{EXAMPLE}:make_env", "--coach", "true"], tmp_path)
    assert out.returncode == 2 and "--env: give the policy to evaluate" in out.stderr, out.stderr[-2000:]


def test_value_ceiling_judges_the_users_env_and_policy(tmp_path):
    out = _run(["-m", "capsule_rollout", "value_ceiling", "--env", f"{EXAMPLE}:make_env", "--model.policy",
                f"{EXAMPLE}:make_policy", "--seeds.first", "0", "--episodes", "2", "--branches", "2",
                "--at_step", "5", "--json", str(tmp_path / "v.json")], tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    summary = json.loads((tmp_path / "v.json").read_text())
    assert summary["env"] == f"{EXAMPLE}:make_env" and summary["judged_episodes"] == len(summary["episodes"])
    assert all(0.0 <= row["branch_success"] <= 1.0 and row["step"] <= 5 for row in summary["episodes"])


def test_stateful_policy_example_forks_mid_queue_into_another_slot_bit_for_bit(tmp_path):
    out = _run(["-m", "examples.stateful_policy"], tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "a fork into slot 3 plays slot 1's episode on bit for bit: True" in out.stdout


def test_branching_from_python_example_within_40_lines_forks_into_slots_and_replays(tmp_path):
    assert len((ROOT / "examples/branch_from_python.py").read_text().splitlines()) <= 40
    out = _run(["-m", "examples.branch_from_python"], tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "continuation 0 replays the episode bit for bit: True" in out.stdout
    assert out.stdout.count("more steps") == 3  # K - 1 continuations with noise of their own, side by side


def test_recap_recipe_skeleton_names_every_method_the_loop_calls():
    import inspect

    from capsule_rollout.learning.recap_recipe import RecapRecipe, load_recipe

    recipe = load_recipe("examples.recap_recipe:MyRecipe")
    wanted = {n for n, _ in inspect.getmembers(RecapRecipe, inspect.isfunction) if not n.startswith("_")}
    for name in wanted:
        mine, theirs = inspect.signature(getattr(recipe, name)), inspect.signature(getattr(RecapRecipe, name))
        assert list(mine.parameters) == [p for p in theirs.parameters if p != "self"], name
    assert recipe.rollout_spec(None).env and recipe.episode_limit(None) > 0


def test_objects_defined_in_a_script_run_on_two_actors_and_replay_bit_for_bit(tmp_path):
    """`record_rollouts(env=make_env, policy=Nudge)` with a script's own function and class (no import path): 2 Ray
    actors, a replay with them given again; without them, a replay says so in one line."""
    out = _run([str(ROOT / "examples/objects_not_paths.py")], tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "episodes 4 resets {'cold': 2, 'restore': 2}" in out.stdout
    assert "replay bit-identical: True" in out.stdout
    spec = json.loads((tmp_path / "runs/objects/rollout.json").read_text())
    assert spec["env"] == "__objects__:make_env" and spec["policy"] == "__objects__:Nudge" and "objects" not in spec
    episode = open_episode_reader(tmp_path / "runs/objects/episodes.zarr").episode_ids[0]
    refused = _run(["-m", "capsule_rollout", "replay", "--store", "runs/objects/episodes.zarr", "--episode", episode],
                   tmp_path)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert refused.stderr.strip().startswith("error: env '__objects__:make_env' was an object handed over in Python")
    assert len(refused.stderr.strip().splitlines()) == 1
