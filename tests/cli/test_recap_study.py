"""A tiny-budget recap_study: seeds x arms of `recap`, each seed's BC shared by its arms, resumable, history JSON."""

import json

import numpy as np
import pytest

from capsule_rollout.cli.run import main
from capsule_rollout.stores.zarr_reader import ZarrEpisodeReader

TINY = ["--recap.iterations", "2", "--recap.demo_episodes", "6", "--recap.bc_steps", "2", "--recap.policy_steps", "2",
        "--recap.critic_steps", "2", "--recap.rollout_episodes", "3", "--recap.eval.count", "3",
        "--recap.batch_size", "4", "--recap.progress", "False", "--recap.actors", "1", "--recap.slots", "2",
        "--ceiling_branches", "2"]


@pytest.mark.slow  # three minutes: a seed's base, two arms to iteration 2 and their ceilings on Ray
def test_a_study_shares_each_seeds_bc_with_its_arms_and_resumes_without_replaying(tmp_path):
    root, history = tmp_path / "study", tmp_path / "history"
    args = ["recap_study", "--root", str(root), "--history", str(history), "--seeds", "3", "--arms", "critic",
            "privileged", *TINY]
    assert main(args) == 0
    assert sorted(p.name for p in history.iterdir()) == [
        "s3_base.json", "s3_critic.json", "s3_critic_ceiling.json", "s3_privileged.json", "s3_privileged_ceiling.json",
        "yardstick.md"]
    table, sizes = (history / "yardstick.md").read_text().strip().split("\n\n")
    assert [line.split(" | ")[:2] for line in table.splitlines()[2:]] == [["| critic", str(k)] for k in range(3)] + [
        ["| privileged", str(k)] for k in range(3)]
    # the evaluation sizes: iterations 1 and 2 of the critic arm (with its control), 50-400 seeds each
    assert [line.split(" | ")[:3] for line in sizes.splitlines()[2:]] == [
        ["| " + str(k), "3", str(n)] for k in (1, 2) for n in (50, 100, 200, 400)]
    base = json.loads((history / "s3_base.json").read_text())
    arms = {arm: json.loads((history / f"s3_{arm}.json").read_text()) for arm in ("critic", "privileged")}
    for arm, result in arms.items():
        assert result["complete"] and result["arm"] == arm and result["seed"] == 3
        its = result["iterations"]
        assert [it["iteration"] for it in its] == [0, 1, 2] and len(its[2]["control"]["success_by_seed"]) == 3
        # the arms went side by side: iteration 2 resumed through 0 and 1, which replayed to the same outcomes
        assert its[0]["replayed_same"] and its[1]["replayed_same"] and "replayed_same" not in its[2]
        # the seed's BC policy, evaluated again in the arm's copy: the same outcome seed by seed
        assert its[0]["success_by_seed"] == base["iterations"][0]["success_by_seed"]
        ceiling = json.loads((history / f"s3_{arm}_ceiling.json").read_text())
        assert ceiling["policy_checkpoint"] == its[2]["policy"] and ceiling["critic_checkpoint"] == its[2]["critic"]
        assert ceiling["branches"] == 2
    # the privileged arm's critics read the sim's state (critic 0 is the seed's, shared); the critic arm's do not
    model = {arm: json.loads((root / "s3" / arm / "critic_1" / "checkpoint.json").read_text())["config"]["model"]
             for arm in arms}
    assert model["privileged"]["privileged_dim"] == 46 and model["critic"].get("privileged_dim", 0) == 0
    critic_0 = json.loads((root / "s3" / "privileged" / "critic_0" / "checkpoint.json").read_text())
    assert critic_0["config"]["model"].get("privileged_dim", 0) == 0
    # the arms share the first iteration's rollouts: the same policy 0 and critic 0, the same seeds, step for step
    readers = {arm: ZarrEpisodeReader(str(root / "s3" / arm / "episodes.zarr")) for arm in arms}
    for episode_id in (i for i in readers["critic"].episode_ids if i.startswith("recap1-")):
        a, b = (r.episode(r.episode_ids.index(episode_id), ["action", "privileged"]) for r in readers.values())
        assert np.array_equal(a.steps["action"], b.steps["action"]) and a.steps["privileged"].shape[1] == 46
    # run again: every stage is done, nothing is played again, the history is rewritten the same
    before = {p.name: p.read_text() for p in history.iterdir()}
    stamps = {arm: (root / "s3" / arm / "arm.json").stat().st_mtime_ns for arm in arms}
    assert main(args) == 0
    assert {p.name: p.read_text() for p in history.iterdir()} == before
    assert {arm: (root / "s3" / arm / "arm.json").stat().st_mtime_ns for arm in arms} == stamps


def test_the_yardstick_pools_the_seeds_pairs_and_measures_the_critic_against_the_ceiling(tmp_path):
    from capsule_rollout.learning.yardstick import load_history, yardstick

    def it(k, rate, outcomes, control=None):
        out = {"iteration": k, "success_rate": rate, "successes_per_sim_hour": 100 * rate, "success_by_seed": outcomes,
               "critic_failure_auc_eval": {"auc": 0.7}}
        if k:
            out.update(simulated_steps={"rollouts": 10, "branches": 0}, wall_s={"iteration": 1.0})
        if control is not None:
            out.update(control={"success_rate": sum(control) / 4, "success_by_seed": control,
                                "paired": {"only_a": 0, "only_b": 0, "p_value": 1.0}})
        return out

    for seed, (bc, last, control) in {0: ([1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 0, 0]),
                                      1: ([0, 0, 0, 1], [1, 0, 1, 1], [0, 0, 0, 1])}.items():
        runs = {"seed": seed, "complete": True,
                "iterations": [it(0, sum(bc) / 4, bc), it(1, sum(last) / 4, last, control)]}
        (tmp_path / f"s{seed}_critic.json").write_text(json.dumps(runs))
        (tmp_path / f"s{seed}_critic_ceiling.json").write_text(json.dumps(
            {"branch_failure_auc": {"auc": 0.9}, "critic_failure_auc": {"auc": 0.7 + 0.1 * seed}}))
    (tmp_path / "s0_base.json").write_text("{}")  # not an arm
    rows = yardstick(load_history(tmp_path)["critic"])
    assert [r["iteration"] for r in rows] == [0, 1]
    last = rows[1]
    assert last["success_mean"] == pytest.approx(0.625) and last["control_mean"] == 0.25
    assert last["sim_hour_ratio"] == [2.0, 3.0] and last["failure_ratio"] == [pytest.approx(2 / 3), pytest.approx(1 / 3)]
    # pooled over both seeds' 8 held-out pairs: 3 only RECAP, none only the control
    assert (last["pooled"]["only_a"], last["pooled"]["only_b"], last["pooled"]["seeds"]) == (3, 0, 8)
    assert last["critic_margin"] == [pytest.approx(0.5), pytest.approx(0.75)]
    # an arm without a control (`rollouts_x4`), one seed so far: paired with the critic arm where both are
    other = {"seed": 0, "complete": False, "iterations": [it(0, 0.25, [1, 0, 0, 0]), it(1, 0.75, [1, 1, 1, 0])]}
    (tmp_path / "s0_other.json").write_text(json.dumps(other))
    arms = load_history(tmp_path)
    row = yardstick(arms["other"], arms["critic"])[1]
    assert "control" not in row and "pooled" not in row
    assert (row["vs_reference"]["only_a"], row["vs_reference"]["only_b"], row["vs_reference"]["run_seeds"]) == (1, 0, 1)
    from capsule_rollout.learning.yardstick import markdown

    assert "| other | 1 | 0 | 75.0%; **75.0%** | - | - | 1 / 0, p = 1 |" in markdown(arms)
    # a seed that has only its BC so far: iteration 0 over three seeds, the later ones over the two that reached them
    (tmp_path / "s2_critic.json").write_text(json.dumps({"seed": 2, "complete": False,
                                                         "iterations": [it(0, 0.5, [1, 1, 0, 0])]}))
    rows = yardstick(load_history(tmp_path)["critic"])
    assert [(r["iteration"], r["seeds"]) for r in rows] == [(0, [0, 1, 2]), (1, [0, 1])]
    assert rows[1]["critic_margin"] == [pytest.approx(0.5), pytest.approx(0.75)]  # the seeds that finished


def test_a_study_refuses_repeated_seeds_or_arms(capsys):
    assert main(["recap_study", "--seeds", "1", "1"]) == 2
    assert "distinct run seeds" in capsys.readouterr().err
    assert main(["recap_study", "--arms", "critic", "critic"]) == 2
    assert "distinct arms" in capsys.readouterr().err


def test_every_arm_the_cli_offers_changes_recap_as_it_says():
    from capsule_rollout.cli.recap_study import ARMS
    from capsule_rollout.commands.study_configs import STUDY_ARMS
    from capsule_rollout.learning.options import RecapConfig

    assert tuple(ARMS) == STUDY_ARMS  # the CLI's choices are the arms the study can run
    recap = RecapConfig(policy_steps=3000, rollout_episodes=200)
    assert ARMS["critic"](recap) == {}
    assert ARMS["finetune_x3"](recap) == {"policy_steps": 9000, "control": False}
    assert ARMS["finetune_third"](recap) == {"policy_steps": 1000, "control": False}
    assert ARMS["rollouts_x4"](recap) == {"rollout_episodes": 800, "control": False}
    for arm in ARMS.values():  # each arm is a valid `recap` run
        RecapConfig(**{**arm(recap), "out": "x"})


def test_evaluation_sizes_resample_each_seeds_pairs_with_its_control():
    from capsule_rollout.learning.yardstick import evaluation_sizes

    def run(recap, control):
        bc = {"iteration": 0, "success_by_seed": [0] * 40}
        return {"iterations": [bc, {"iteration": 1, "success_by_seed": recap, "wall_s": {"evaluation_s": 4.0},
                                    "control": {"success_by_seed": control}}]}

    always = {0: run([1] * 40, [0] * 40), 1: run([1] * 40, [0] * 40)}  # RECAP solves what the control never does
    rows = evaluation_sizes(always, sizes=(5, 20), draws=50)
    assert [(r["n"], r["power"]) for r in rows] == [(5, 1.0), (20, 1.0)]
    assert rows[1]["evaluation_s"] == pytest.approx(2.0) and rows[1]["half_width"] == 0.0  # 0.1 s per seed
    same = {0: run([1, 0] * 20, [1, 0] * 20)}  # no discordant pair: never significant
    assert [r["power"] for r in evaluation_sizes(same, sizes=(40,), draws=50)] == [0.0]
    assert evaluation_sizes({0: {"iterations": [{"iteration": 0, "success_by_seed": [1]}]}}) == []  # BC only
