"""Entry points over a registered third-party env: sim_rollout with a TorchPolicy, replay, verify, scan (its benchmark:
tests/benchmarks/test_env.py)."""

from __future__ import annotations

import json

import pytest
import torch

from capsule_rollout.cli.run import main
from capsule_rollout.policies.rollout_policy import PolicySpec
from capsule_rollout.policies.state_mlp import StateMLP
from capsule_rollout.policies.torch_policy import save_torch_policy

ENV = "gymnasium:Reacher-v5"  # 50-step episodes, state (10,), action (2,)


def test_sim_rollout_and_replay_with_a_torch_policy(tmp_path):
    torch.manual_seed(0)
    save_torch_policy(tmp_path / "policy", StateMLP(10, 2, 4, hidden=16),
                      factory="capsule_rollout.policies.state_mlp:StateMLP",
                      kwargs={"state_dim": 10, "action_dim": 2, "chunk_length": 4, "hidden": 16},
                      spec=PolicySpec(4, 2, ("state",)), shapes={"state": ((10,), "float32")})
    out = tmp_path / "run"
    assert main(["sim_rollout", "--env", ENV, "--policy", str(tmp_path / "policy"), "--critic", "", "--actors", "0",
                 "--episodes", "2", "--repeats", "2", "--n_exec", "4", "--out", str(out), "--no-progress",
                 "--json", str(tmp_path / "s.json")]) == 0
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["episodes"] == 4 and summary["reset_kinds"] == {"cold": 2, "restore": 2}
    assert main(["replay", "--store", str(out / "episodes.zarr"), "--episode", "gymnasium_Reacher-v5-s1000001-r1",
                 "--json", str(tmp_path / "r.json")]) == 0
    replay = json.loads((tmp_path / "r.json").read_text())
    assert replay["exact"] and "image_free" not in replay["checks"]  # it reads the state only: nothing rendered
    # exported with the horizon it is deployed with, it runs without --n_exec (the default 8 exceeds its chunk of 4)
    deployed = tmp_path / "deployed"
    assert main(["export_checkpoint", "--src", str(tmp_path / "policy"), "--out", str(deployed), "--n_exec", "4"]) == 0
    assert main(["sim_rollout", "--env", ENV, "--policy", str(deployed), "--critic", "", "--actors", "0",
                 "--episodes", "1", "--out", str(tmp_path / "deployed_run"), "--no-progress"]) == 0
    assert main(["export_checkpoint", "--src", str(tmp_path / "policy"), "--out", str(tmp_path / "x"),
                 "--n_exec", "5"]) == 2  # longer than its chunk
    # the flow policy's noise scale is refused, not ignored (and not recorded)
    assert main(["export_checkpoint", "--src", str(tmp_path / "policy"), "--out", str(tmp_path / "x"),
                 "--noise_scale", "0.5"]) == 2
    assert not (tmp_path / "x").exists()
    assert main(["sim_rollout", "--env", ENV, "--policy", str(tmp_path / "policy"), "--critic", "", "--actors", "0",
                 "--episodes", "1", "--n_exec", "4", "--act.noise_scale", "0.5", "--out", str(tmp_path / "scaled"),
                 "--no-progress"]) == 2


def test_verify_scan_and_bad_ids(tmp_path, capsys):
    assert main(["verify_capsule", "--env", ENV, "--steps", "4", "--json", str(tmp_path / "v.json")]) == 0
    assert json.loads((tmp_path / "v.json").read_text())["all_bit_exact"]
    assert main(["scan_env", "--env", ENV, "--steps", "5", "--json", str(tmp_path / "scan.json")]) == 0
    scan = json.loads((tmp_path / "scan.json").read_text())
    assert scan["seed_honoured"] and any("TimeLimit._elapsed_steps" in c for c in scan["declared"])
    assert main(["verify_capsule", "--env", "gymnasium:Reachr-v5"]) == 2
    assert "did you mean Reacher-v5" in capsys.readouterr().err


def test_a_foreign_env_needs_its_own_policy_and_gets_no_tabletop_critic(tmp_path, capsys):
    assert main(["sim_rollout", "--env", ENV, "--out", str(tmp_path / "run"), "--actors", "0"]) == 2
    assert "give its policy (--policy" in capsys.readouterr().err


class ZeroAction:
    """A deterministic infer() policy whose chunks have the wrong length: every episode fails at its first act."""

    deterministic = True
    chunk_length = 4

    def infer(self, obs):
        return {"actions": [[0.0, 0.0]] * 3}


def make_broken_policy():
    return ZeroAction()


def test_a_policy_answering_a_wrong_chunk_is_refused_before_the_run_starts_naming_it(tmp_path, capsys):
    summary = tmp_path / "s.json"
    code = main(["sim_rollout", "--env", ENV, "--policy", "tests.cli.test_suite_env_cli:make_broken_policy",
                 "--n_exec", "4", "--actors", "0", "--episodes", "2", "--out", str(tmp_path / "run"), "--no-progress",
                 "--video", "false", "--json", str(summary)])
    assert code == 2  # the preflight's probe: before any episode, one line
    err = capsys.readouterr().err
    assert err.startswith("error: ZeroAction.infer answered a chunk of shape (3, 2)") and "Traceback" not in err
    assert not summary.exists() and not (tmp_path / "run" / "rollout.json").exists()


@pytest.mark.parametrize("command, extra", [("eval_policy", []),
                                            ("value_ceiling", ["--branches", "2", "--act.noise_scale", "1"])])
def test_an_evaluation_with_a_policy_answering_a_wrong_chunk_is_refused_in_one_line(command, extra, capsys):
    code = 2  # the preflight's probe: before any episode
    got = main([command, "--env", ENV, "--model.policy", "tests.cli.test_suite_env_cli:make_broken_policy",
                "--act.n_exec", "4", "--episodes", "2", *extra])
    err = capsys.readouterr().err
    assert got == code and "answered a chunk of shape (3, 2)" in err and "Traceback" not in err
