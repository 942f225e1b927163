"""Tiny-budget runs of train_policy, train_critic and eval_policy (2 steps, resume)."""

import json

import numpy as np
import pytest

from capsule_rollout.cli.run import main
from capsule_rollout.learning.policy_data import episode_steps
from capsule_rollout.models.checkpoint import Checkpoint, CheckpointError


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    path = tmp_path_factory.mktemp("demos") / "d.zarr"
    assert main(["collect_demos", "--episodes", "3", "--out", str(path), "--no-progress"]) == 0
    return path


def test_train_policy_resumes_and_eval_policy_reads_it(demos, tmp_path):
    out, summary = tmp_path / "policy", tmp_path / "p.json"
    args = ["train_policy", "--data", str(demos), "--out", str(out), "--batch_size", "4", "--noise_samples", "1",
            "--eval_every", "2", "--eval_episodes", "1", "--checkpoint_every", "2", "--no-progress", "--json", str(summary)]
    assert main([*args, "--steps", "2"]) == 0
    first = json.loads(summary.read_text())
    assert first["resumed_from"] == 0 and [e["step"] for e in first["evals"]] == [2]
    assert main([*args, "--steps", "4"]) == 0
    second = json.loads(summary.read_text())
    assert second["resumed_from"] == 2 and [e["step"] for e in second["evals"]] == [2, 4]
    assert Checkpoint(out).step == 4 and Checkpoint(out).resumable
    with pytest.raises(SystemExit, match="already holds a checkpoint"):
        from capsule_rollout.cli.train_policy import run
        from capsule_rollout.commands.configs import TrainPolicyConfig
        from capsule_rollout.learning.options import Loop

        run(TrainPolicyConfig(data=str(demos), out=str(out), loop=Loop(resume=False, progress=False)))
    evaluation = tmp_path / "e.json"
    assert main(["eval_policy", "--policy", str(out), "--episodes", "2", "--json", str(evaluation)]) == 0
    data = json.loads(evaluation.read_text())
    assert data["policy"]["episodes"] == 2 and data["expert"]["success_rate"] == 1.0
    assert set(data["policy"]) >= {"success_rate", "ci95", "mean_steps_to_success", "failures"}
    # simulated time counts every episode's control steps at 10 Hz: the expert solved both, so its
    # time is twice its mean steps to success
    expert = data["expert"]
    assert expert["sim_seconds"] == pytest.approx(2 * expert["mean_steps_to_success"] / 10)
    assert expert["successes_per_sim_hour"] == pytest.approx(3600 * 2 / expert["sim_seconds"])
    assert data["policy"]["sim_seconds"] > 0


def test_train_critic_reports_held_out_error(demos, tmp_path):
    summary = tmp_path / "c.json"
    assert main(["train_critic", "--data", str(demos), "--out", str(tmp_path / "critic"), "--steps", "2",
                 "--batch_size", "4", "--eval_every", "2", "--val_fraction", "0.34", "--no-progress",
                 "--json", str(summary)]) == 0
    data = json.loads(summary.read_text())
    assert data["evals"][-1]["val_value_mae"] >= 0 and data["episodes"] == 3


def test_train_critic_starts_its_encoders_from_a_policy(demos, tmp_path):
    import torch

    from capsule_rollout.models.checkpoint import save_checkpoint
    from capsule_rollout.tabletop.flow_policy import KIND as POLICY_KIND
    from capsule_rollout.tabletop.flow_policy import FlowPolicy
    from capsule_rollout.tabletop.value_critic import load_critic

    torch.manual_seed(3)
    policy = FlowPolicy()
    save_checkpoint(tmp_path / "policy", kind=POLICY_KIND, model=policy, step=0,
                    config={"model": policy.config.to_json()})
    args = ["train_critic", "--data", str(demos), "--steps", "1", "--batch_size", "4", "--val_fraction", "0.34",
            "--lr", "0", "--no-progress", "--init_policy", str(tmp_path / "policy")]
    assert main([*args, "--out", str(tmp_path / "critic")]) == 0
    critic = load_critic(str(tmp_path / "critic"))  # lr 0: the weights are the starting ones
    for name in ("language", "vision"):
        mine, theirs = getattr(critic, name).state_dict(), getattr(policy, name).state_dict()
        assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    with pytest.raises(CheckpointError, match="not a checkpoint"):  # a policy dir that is not there
        main([*args[:-1], str(tmp_path / "missing"), "--out", str(tmp_path / "c2")])


def test_training_refuses_a_store_without_episodes_or_cameras(demos, tmp_path, capsys):
    with pytest.raises(ValueError, match="no images of camera"):
        from capsule_rollout.cli.train_policy import run
        from capsule_rollout.commands.configs import TrainPolicyConfig
        from capsule_rollout.learning.options import Loop

        run(TrainPolicyConfig(data=str(demos), out=str(tmp_path / "p"), cameras=("top",), loop=Loop(progress=False)))
    with pytest.raises(FileNotFoundError, match="not a zarr store"):
        run(TrainPolicyConfig(data=str(tmp_path), out=str(tmp_path / "p"), loop=Loop(progress=False)))


def test_label_advantages_writes_a_sidecar_that_training_reads(demos, tmp_path):
    from capsule_rollout.models.checkpoint import save_checkpoint
    from capsule_rollout.tabletop.value_critic import KIND as CRITIC_KIND
    from capsule_rollout.tabletop.value_critic import ValueCritic

    critic = tmp_path / "critic"
    save_checkpoint(critic, kind=CRITIC_KIND, model=ValueCritic(), step=0,
                    config={"model": ValueCritic().config.to_json()})
    before = sorted(p.name for p in demos.rglob("*"))
    summary = tmp_path / "l.json"
    assert main(["label_advantages", "--data", str(demos), "--critic", str(critic), "--n", "5",
                 "--json", str(summary)]) == 0
    data = json.loads(summary.read_text())
    assert abs(data["positive_fraction"] - 0.3) < 0.1 and data["episodes"] == 3
    assert sorted(p.name for p in demos.rglob("*")) == before  # the store is untouched
    sidecar = data["sidecar"]
    assert sidecar.endswith("d.advantage.npz")
    out = tmp_path / "policy"
    assert main(["train_policy", "--data", str(demos), "--out", str(out), "--advantage", sidecar, "--steps", "1",
                 "--batch_size", "4", "--noise_samples", "1", "--eval_episodes", "0", "--no-progress"]) == 0
    from capsule_rollout.learning.advantage_labels import load_sidecar

    with pytest.raises(ValueError, match="not the store's"):
        load_sidecar(sidecar, ["other"])


def test_episode_steps_restart_at_every_episode():
    assert episode_steps(np.array([3, 5, 9])).tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 3]
    assert episode_steps(np.array([], np.int64)).tolist() == []


def test_executed_plans_stay_within_their_episode():
    from capsule_rollout.critics.returns import executed_plans

    actions = np.arange(5, dtype=np.float32)[:, None] * np.ones((1, 2), np.float32)  # steps 0-4, two episodes
    plans = executed_plans(actions, np.array([3, 5]), 3)
    assert plans.shape == (5, 3, 2)
    assert plans[:, :, 0].tolist() == [[0, 1, 2], [1, 2, 2], [2, 2, 2], [3, 4, 4], [4, 4, 4]]


def test_a_plan_critic_trains_labels_and_judges_the_policys_chunks(demos, tmp_path):
    """train_critic --plan_steps: held-out error with and without the plan; its labels use the state's
    value (the store is untouched); eval_policy values each chunk start with the chunk about to run."""
    from capsule_rollout.tabletop.value_critic import load_critic

    critic, summary = tmp_path / "critic", tmp_path / "c.json"
    assert main(["train_critic", "--data", str(demos), "--out", str(critic), "--steps", "2", "--plan_steps", "4",
                 "--batch_size", "4", "--eval_every", "2", "--val_fraction", "0.34", "--no-progress",
                 "--json", str(summary)]) == 0
    last = json.loads(summary.read_text())["evals"][-1]
    assert {"val_loss", "val_loss_state_only", "val_value_mae", "val_value_mae_state_only"} <= set(last)
    assert load_critic(str(critic)).config.plan_steps == 4
    labels = tmp_path / "l.json"
    assert main(["label_advantages", "--data", str(demos), "--critic", str(critic), "--n", "5",
                 "--json", str(labels)]) == 0
    judged = tmp_path / "e.json"
    assert main(["eval_policy", "--episodes", "2", "--no-expert", "--critic", str(critic),
                 "checkpoints/critic", "--json", str(judged)]) == 0
    policy = json.loads(judged.read_text())["policy"]
    with_plan, plain = policy["critic_failure_aucs"]
    alone, none = policy["critic_failure_auc_state_only"]
    assert none is None and alone["episodes"] == with_plan["episodes"] == plain["episodes"] >= 1
    assert main(["train_critic", "--data", str(demos), "--out", str(tmp_path / "bad"), "--plan_steps", "-1"]) == 2


def test_a_privileged_critic_trains_on_the_recorded_sim_state_and_labels_with_it(demos, tmp_path, capsys):
    """train_critic --privileged reads the steps' privileged state (the tabletop records it with every step);
    --privileged_noise blurs it in training; a store without it is refused by name, before any training."""
    from capsule_rollout.stores.zarr_recorder import ZarrRecorder
    from capsule_rollout.tabletop.value_critic import load_critic
    from tests.rollout.fakes import fake_episode

    critic = tmp_path / "critic"
    args = ["train_critic", "--data", str(demos), "--steps", "2", "--batch_size", "4", "--eval_every", "2",
            "--val_fraction", "0.34", "--no-progress", "--privileged"]
    assert main([*args, "--out", str(critic), "--privileged_noise", "0.5"]) == 0
    model = load_critic(str(critic))
    assert model.config.privileged_dim == 46 and float(model.privileged_std.min()) > 0
    assert main(["label_advantages", "--data", str(demos), "--critic", str(critic), "--n", "5"]) == 0
    robot = tmp_path / "robot.zarr"  # episodes a robot recorded: no privileged state
    with ZarrRecorder(robot) as recorder:
        recorder.write_many([fake_episode(i, length=6, image_size=64) for i in range(3)])
    capsys.readouterr()
    assert main([*args, "--data", str(robot), "--out", str(tmp_path / "robot_critic")]) == 2
    assert "records no privileged state" in capsys.readouterr().err and not (tmp_path / "robot_critic").exists()
    assert main(["train_critic", "--data", str(demos), "--out", str(tmp_path / "x"), "--privileged_noise", "1"]) == 2
