"""Issue 51, items 1 and 2: a run that cannot work is refused before any actor starts, in one line naming the
user's object (and the user's own frames under it); errors in the episodes travel with the user's frames from
the actor to the driver, the summary and the console, and make the run exit non-zero."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from capsule_rollout.rollout.host_factory import RunSpec
from capsule_rollout.rollout.preflight_checks import PreflightError, preflight
from capsule_rollout.rollout.record import RunError, record_rollouts
from capsule_rollout.user_code import UserCodeError

ROOT = Path(__file__).resolve().parents[2]
LAB = "tests.rollout.lab_parts"
ENV = "examples.own_env_and_policy:make_env"
POLICY = "examples.own_env_and_policy:make_policy"


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.run([sys.executable, "-m", "capsule_rollout", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def _refused(spec: RunSpec, **kwargs) -> PreflightError:
    with pytest.raises(PreflightError) as caught:
        preflight(spec, seed=1, **kwargs)
    return caught.value


def test_n_exec_past_the_chunk_is_one_line_before_any_actor_starts_and_the_rerun_is_accepted(tmp_path):
    out = tmp_path / "run"
    args = ["sim_rollout", "--env", ENV, "--policy", f"{LAB}:make_chunk4", "--seeds.count", "1", "--out", str(out),
            "--no-progress", "--no-video"]
    refused = _cli([*args, "--act.n_exec", "8", "--actors", "2"], tmp_path)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert refused.stderr.strip() == (f"error: n_exec 8 exceeds the chunk length of Chunk4 ({LAB}:make_chunk4), 4 "
                                      "actions: pass --act.n_exec 4 or less, or leave it unset (a factory's policy "
                                      "then executes its whole chunk)")
    assert "Ray" not in refused.stdout + refused.stderr  # no actor, no cluster: refused before either
    assert not (out / "rollout.json").exists()  # nothing that would refuse the corrected run
    accepted = _cli([*args, "--actors", "0", "--json", str(tmp_path / "s.json")], tmp_path)  # n_exec left unset
    assert accepted.returncode == 0, accepted.stdout[-2000:] + accepted.stderr[-3000:]
    assert json.loads((out / "rollout.json").read_text())["host"]["n_exec"] == 4  # the factory's chunk length
    assert json.loads((tmp_path / "s.json").read_text())["episodes"] == 1


def test_a_critic_answering_an_array_is_named_with_the_fix():
    error = _refused(RunSpec(env=ENV, policy=POLICY, critic=f"{LAB}:make_distance_critic"))
    assert error.message == "DistanceCritic.value returned ndarray (1,): return a float"


def test_a_critic_that_raises_is_named_with_the_users_own_frames():
    error = _refused(RunSpec(env=ENV, policy=POLICY, critic=f"{LAB}:make_wrong_key_critic"))
    assert error.message == "WrongKeyCritic.value raised KeyError: 'obs'"
    assert "lab_parts.py" in error.frames and 'obs["obs"]' in error.frames
    assert "capsule_rollout" not in error.frames and "ray" not in error.frames  # the user's frames only


def test_a_factory_that_raises_and_a_policy_answering_strings_are_named():
    error = _refused(RunSpec(env=f"{LAB}:raising_env", policy=POLICY))
    assert error.message == (f"env factory '{LAB}:raising_env' raised RuntimeError: the lab's env could not find "
                             "its assets")
    assert error.frames.count("File ") == 1 and "in raising_env" in error.frames
    error = _refused(RunSpec(env=ENV, policy=f"{LAB}:make_string_policy"))
    assert error.message.startswith("StringPolicy.infer answered list of dtype <U5: answer float actions")


def test_a_factory_policy_executes_its_whole_chunk_unless_told_and_an_env_without_success_is_warned():
    checked = preflight(RunSpec(env=f"{LAB}:no_success_env", policy=f"{LAB}:make_chunk4"), seed=1,
                        n_exec_given=False)
    assert (checked.chunk_length, checked.spec.host.n_exec, checked.policy) == (4, 4, "Chunk4")
    assert len(checked.warnings) == 1 and "no `success` (or `is_success`) key" in checked.warnings[0]
    assert preflight(RunSpec(env=ENV, policy=POLICY), seed=1).warnings == ()


def test_an_env_that_breaks_at_step_3_ends_the_run_with_exit_1_and_the_line(tmp_path):
    out = _cli(["sim_rollout", "--env", f"{LAB}:shrinking_env", "--policy", POLICY, "--actors", "0",
                "--seeds.count", "2", "--out", str(tmp_path / "run"), "--no-progress", "--no-video",
                "--json", str(tmp_path / "s.json")], tmp_path)
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-3000:]
    assert "2 of 2 episodes ended in errors" in out.stdout
    assert "returned an observation of 4 values ((4,)) where its observation_space says 6" in out.stdout
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["ended_in_errors"] == 2 and summary["stop_reasons"] == {"error": 2}


@pytest.mark.ray
def test_an_error_in_an_actor_reaches_the_driver_with_the_users_frames(tmp_path):
    """Past the preflight (the critic fails from step 8 only): each episode ends in an error on the actor; the
    driver's RunError, its cause and the summary carry the line and the user's own frames, never Ray's."""
    with pytest.raises(RunError) as caught:
        record_rollouts(tmp_path / "run", env=ENV, policy=POLICY, critic=f"{LAB}:make_late_failing_critic",
                        seeds=[1, 2], actors=1)
    error = caught.value
    line = "LateFailingCritic.value raised AttributeError: 'LateFailingCritic' object has no attribute 'lookup_table'"
    assert f"2 of 2 episodes ended in errors; the first (examples.own_env_and_policy_make_env-s0000001): {line}" in str(
        error)
    assert "lab_parts.py" in error.traceback and "self.lookup_table[obs" in error.traceback
    assert "ray" not in error.traceback.lower() and "capsule_rollout" not in error.traceback
    assert isinstance(error.__cause__, UserCodeError) and error.__cause__.frames == error.traceback
    first = error.result.summary["first_error"]
    assert first["error"] == line and first["traceback"] == error.traceback
    assert error.result.summary["stop_reasons"] == {"error": 2}  # recorded: the steps before the error


def test_an_actor_whose_host_cannot_be_built_says_why_in_one_line(monkeypatch):
    """What the driver hears from an actor that could not build its host (where the preflight passed: another
    machine, another environment): its `ready` answers the line and the user's frames, not Ray's traceback of
    a constructor that raised."""
    from capsule_rollout.rollout import rollout_actor

    monkeypatch.setattr(rollout_actor, "_in_ray_actor", lambda: True)
    actor = rollout_actor.RolloutActor(RunSpec(env=f"{LAB}:raising_env", policy=POLICY))
    failure = actor.ready()
    assert failure.error == f"env factory '{LAB}:raising_env' raised RuntimeError: the lab's env could not find its assets"
    assert "in raising_env" in failure.traceback
    actor.close()


def test_a_torch_module_answering_nan_is_named_before_the_run():
    error = _refused(RunSpec(env=ENV, policy=f"{LAB}:make_nan_module"))
    assert error.message.startswith(f"NanModule ({LAB}:make_nan_module) on the first observation of seed 1: policy "
                                    "proposed a non-finite action")
