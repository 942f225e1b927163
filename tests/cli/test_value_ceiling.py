"""value_ceiling: branches from restored mid-episode capsules, with the shipped policy and critic."""

import json

import pytest

from capsule_rollout.cli import value_ceiling
from capsule_rollout.cli.run import main
from capsule_rollout.commands.configs import ValueCeilingConfig
from capsule_rollout.learning.options import Seeds
from capsule_rollout.rollout.branching import ReplayDivergedError


def test_branches_from_the_mid_episode_capsule_and_scores_the_critic_there(tmp_path):
    out = tmp_path / "c.json"
    assert main(["value_ceiling", "--episodes", "4", "--branches", "3", "--at_step", "16",
                 "--critic", "checkpoints/critic", "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    rows = summary["episodes"]
    assert summary["at_step"] == 16 and summary["judged_episodes"] == len(rows) >= 1
    for row in rows:
        assert row["length"] > 16 and 0 <= row["step"] <= 16  # the last chunk start at or before the step
        assert row["branch_success"] in (0.0, 1 / 3, 2 / 3, 1.0) and -1.0 <= row["critic_value"] <= 0.0
    # the shipped policy solves most layouts: its continuations from a live mid-episode state mostly succeed
    assert summary["mean_branch_success"] > 0.5
    assert summary["critic_failure_auc"]["episodes"] == len(rows)
    # every judged state has a task phase; the phases partition them, each scored within
    phases = summary["phases"]
    assert all(row["phase"] in phases and row["phase"].startswith("subtask ") for row in rows)
    assert sum(p["states"] for p in phases.values()) == len(rows)
    assert sum(p["successes"] for p in phases.values()) == sum(row["success"] for row in rows)
    assert all({"branch_success", "critic_value"} <= set(p) for p in phases.values())
    assert summary["phase_alone_failure_auc"]["episodes"] == len(rows)
    # the judged episodes are eval_policy's own (same seeds, same noise): branching leaves them alone
    # (branches sample at noise scale 1 whatever the checkpoint is deployed with: eval_policy is told the same)
    plain = tmp_path / "plain.json"
    assert main(["eval_policy", "--episodes", "4", "--no-expert", "--act.noise_scale", "1", "--json", str(plain)]) == 0
    outcomes = json.loads(plain.read_text())["policy"]["success_by_seed"]
    assert [int(row["success"]) for row in rows] == [outcomes[row["seed"] - 1_000_000] for row in rows]


def test_a_restore_that_is_not_exact_is_caught_before_any_branch_counts(monkeypatch):
    from capsule_rollout.rollout import rollout_host

    monkeypatch.setattr(rollout_host, "restore", lambda arena, capsule: None)  # branches go on from the end
    with pytest.raises(ReplayDivergedError, match="did not end as the episode did"):
        value_ceiling.run(ValueCeilingConfig(seeds=Seeds(count=1), branches=1, at_step=8))


def test_bad_settings_are_refused_with_what_to_fix(capsys):
    assert main(["value_ceiling", "--branches", "0"]) == 2
    assert "--branches" in capsys.readouterr().err
    assert main(["value_ceiling", "--beta", "2"]) == 2  # guidance over no indicator
    assert "--advantage positive" in capsys.readouterr().err
    assert main(["value_ceiling", "--act.noise_scale", "0"]) == 2  # every branch the same
    assert "scale > 0" in capsys.readouterr().err
    with pytest.raises(ValueError, match="episode limit"):
        value_ceiling.run(ValueCeilingConfig(seeds=Seeds(count=1), at_step=80))
