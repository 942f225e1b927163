"""A tiny-budget run of the RECAP loop end to end (the figures are measured by the real run, not here)."""

import json
import re

import numpy as np
import pytest

from capsule_rollout.cli.run import main
from capsule_rollout.learning.branch_values import BranchTable
from capsule_rollout.learning.policy_data import episode_actor
from capsule_rollout.stores.zarr_reader import ZarrEpisodeReader
from capsule_rollout.tabletop.value_critic import ACTOR_DEMONSTRATOR, ACTOR_POLICY


@pytest.mark.slow  # a minute: the whole loop, every stage (CI runs it with the slow tests)
def test_recap_loop_runs_every_stage_and_reports_each_iteration(tmp_path):
    out, summary = tmp_path / "recap", tmp_path / "r.json"
    args = ["recap", "--iterations", "1", "--out", str(out), "--demo_episodes", "10", "--bc_steps", "2",
            "--policy_steps", "2", "--critic_steps", "2", "--rollout_episodes", "2", "--eval_episodes", "2",
            "--batch_size", "4", "--takeover_threshold", "0.5", "--takeover_steps", "3", "--no-progress",
            "--critic_cameras", "front", "top", "--critic_actor_input", "--critic_plan_steps", "2", "--betas", "3", "1.5",
            "--select_episodes", "2"]
    assert main([*args, "--json", str(summary)]) == 0
    data = json.loads(summary.read_text())
    its = data["iterations"]
    assert [it["iteration"] for it in its] == [0, 1]
    for it in its:
        assert {"success_rate", "ci95", "mean_steps_to_success", "interventions_per_episode"} <= set(it)
    # threshold 0.5 is above every value: the simulated operator took over in every rollout
    assert its[1]["interventions_per_episode"] >= 1.0 and its[1]["rollout_episodes"] == 2
    reader = ZarrEpisodeReader(data["store"])
    ids = reader.episode_ids
    assert len(ids) == 12 and sum(i.startswith("recap1-") for i in ids) == 2
    rollout = reader.episode(ids.index(next(i for i in ids if i.startswith("recap1-"))))
    assert rollout.steps["intervention"].any() and np.isfinite(rollout.steps["value"]).any()
    # the critic sees both cameras, the policy the front one: demos and rollouts record both
    assert {"image_front", "image_top"} <= set(reader.keys)
    critic_model = json.loads((out / "critic_1" / "checkpoint.json").read_text())["config"]["model"]
    assert critic_model["cameras"] == ["front", "top"] and critic_model["actor_input"]
    assert critic_model["plan_steps"] == 2  # and it judged the held-out states with the policy's chunks
    assert its[1]["critic_failure_auc_eval"]["episodes"] == its[1]["critic_failure_auc_state_only_eval"]["episodes"] == 2
    # critic_0 saw demonstrations only: one actor, so no actor input (it is asked for the policy's value)
    assert not json.loads((out / "critic_0" / "checkpoint.json").read_text())["config"]["model"]["actor_input"]
    # who acted: the demonstrations are the demonstrator's, the rollouts the policy's (takeovers included)
    actors = {reader.meta(i).episode_id: episode_actor(reader.meta(i)) for i in range(len(reader))}
    assert {a for i, a in actors.items() if i.startswith("recap1-")} == {ACTOR_POLICY}
    assert {a for i, a in actors.items() if not i.startswith("recap1-")} == {ACTOR_DEMONSTRATOR}
    assert (out / "episodes.advantage.npz").exists() and (out / "policy_1").is_dir() and (out / "critic_1").is_dir()
    # the control arm: same data and steps without labels, compared seed by seed on the same held-out seeds
    control = its[1]["control"]
    assert (out / "control_1").is_dir() and len(control["success_by_seed"]) == 2
    assert control["paired"]["seeds"] == 2 and 0.0 <= control["paired"]["p_value"] <= 1.0
    assert data["gain_over_control_points"] == 100 * (its[1]["success_rate"] - control["success_rate"])
    for it in its:  # each iteration's critic judged on the held-out evaluation episodes
        assert it["critic_failure_auc_eval"]["episodes"] == 2
        assert it["phase_alone_failure_auc_eval"]["episodes"] == 2
        assert sum(p["states"] for p in it["critic_phases_eval"].values()) == 2
        assert it["successes_per_sim_hour"] >= 0
    # the guidance weight: chosen on the selection seeds among none and --betas (weak to strong), then the
    # held-out figures use it; the indicator alone is measured on the held-out seeds as well
    guidance = its[1]["guidance"]
    assert [t["beta"] for t in guidance["trials"]] == [None, 1.5, 3.0]
    assert guidance["select_seeds"] == [1_500_000, 1_500_001] and its[1]["beta"] == guidance["beta"]
    best = max(t["successes"] for t in guidance["trials"])
    assert guidance["beta"] == next(t["beta"] for t in guidance["trials"] if t["successes"] == best)
    assert len(guidance["indicator_alone"]["success_by_seed"]) == 2 and guidance["paired"]["seeds"] == 2
    # the policy records how it was evaluated: the commands that deploy it act the same by default
    info = json.loads((out / "policy_1" / "checkpoint.json").read_text())["info"]
    assert info["conditioning"] == {"advantage": "positive", "beta": its[1]["beta"]} and info["acting"] == {"n_exec": 8}
    if its[0]["successes_per_sim_hour"]:
        assert data["successes_per_sim_hour_ratio"] == its[1]["successes_per_sim_hour"] / its[0]["successes_per_sim_hour"]
    assert its[1]["critic_failure_auc_rollouts"]["episodes"] <= 2
    # run again: everything resumes, nothing is re-collected, and the iteration still reports its rollouts
    again = tmp_path / "again.json"
    assert main([*args, "--json", str(again)]) == 0
    assert len(ZarrEpisodeReader(data["store"])) == 12
    redo = json.loads(again.read_text())["iterations"][1]
    for key in ("rollout_episodes", "rollout_success_rate", "interventions_per_episode", "critic_failure_auc_rollouts"):
        assert redo[key] == its[1][key], key


def test_recap_refuses_seeds_that_overlap_the_held_out_ones(capsys):
    assert main(["recap", "--seed", "10"]) == 2  # demonstrations from 1000000: the held-out block
    assert "overlap the held-out evaluation seeds" in capsys.readouterr().err
    assert main(["recap", "--betas", "2", "--select_seed", "1000100"]) == 2
    assert "guidance selection seeds 1000100..1000299 overlap the held-out evaluation seeds" in capsys.readouterr().err
    assert main(["recap", "--betas", "2", "--select_seed", "0"]) == 2  # the demonstrations of seed 0
    assert "demonstration seeds 0..299 overlap the guidance selection seeds" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--beta", "2", "--betas", "1.5", "3"], "not both"),
    (["--betas", "0"], "must be > 0"),
    (["--beta", "-1"], "must be > 0"),
    (["--betas", "2", "--select_episodes", "0"], "--select_episodes"),
])
def test_recap_refuses_bad_guidance_settings(args, message, capsys):
    assert main(["recap", *args]) == 2
    assert message in capsys.readouterr().err


def test_recap_refuses_a_store_without_the_critics_cameras(tmp_path):
    out = tmp_path / "recap"
    assert main(["collect_demos", "--episodes", "1", "--out", str(out / "episodes.zarr"), "--no-progress"]) == 0
    with pytest.raises(SystemExit, match=r"no images of camera\(s\) \['top'\]"):
        main(["recap", "--out", str(out), "--critic_cameras", "top", "--no-progress"])
    assert len(ZarrEpisodeReader(out / "episodes.zarr")) == 1  # what was recorded is untouched


def test_recap_refuses_a_plan_longer_than_the_executed_chunk(capsys):
    assert main(["recap", "--critic_plan_steps", "9"]) == 2  # n_exec 8
    assert "--critic_plan_steps" in capsys.readouterr().err


@pytest.mark.parametrize("source, actors, select", [
    pytest.param("branches", "2", "random", marks=pytest.mark.slow),  # Ray actors: 40 s (with the slow tests)
    ("distilled", "0", "random"), ("combined", "0", "unsure")])
def test_recap_with_branch_advantages_branches_on_the_actors_and_resumes(tmp_path, source, actors, select, capsys):
    out, summary = tmp_path / "recap", tmp_path / "r.json"
    args = ["recap", "--iterations", "1", "--out", str(out), "--demo_episodes", "6", "--bc_steps", "2",
            "--policy_steps", "2", "--critic_steps", "2", "--rollout_episodes", "3", "--eval_episodes", "2",
            "--batch_size", "4", "--takeover_threshold", "-2", "--no-progress", "--advantage_source", source,
            "--branches", "2", "--branch_rate", "0.3", "--branch_select", select, "--actors", actors]
    assert main([*args, "--json", str(summary)]) == 0
    printed = capsys.readouterr().out
    assert "branching 3 episodes" in printed
    it = json.loads(summary.read_text())["iterations"][1]
    branching, sim = it["branching"], it["simulated_steps"]
    assert it["advantage_source"] == source and branching["episodes_branched"] >= 1 and branching["boundaries"] >= 2
    assert sim["rollouts"] == 3 * 80  # untrained: every rollout runs to the limit
    assert sim["branches"] == branching["steps"] > sim["rollouts"]  # the replays and 2 continuations per boundary
    table = BranchTable.load(out / "episodes.branches.npz")
    assert sorted(table.done) == [f"recap1-pick_place-s{s:07d}" for s in range(2_100_000, 2_100_003)]
    assert len(table.steps) == branching["boundaries"]
    labels = np.load(out / "episodes.advantage.npz")["indicator"]
    if source == "branches":  # only the branched chunks (no takeovers here) carry a label
        assert 0 < it["labelled_fraction"] == np.mean(labels != 0) < 0.5
    elif source == "distilled":  # the critic is distilled from the branch values, then labels every step
        assert it["labelled_fraction"] == 1.0 and (labels != 0).all()
        assert f"{branching['boundaries']} states take their branch value as the target" in printed
    else:  # the critic labels every step, the branched chunks' advantages in place of its own there
        assert it["labelled_fraction"] == 1.0 and (labels != 0).all() and 0 < branching["branch_fraction"] < 1
        assert branching["select"] == "unsure" and "chunks unsure" in printed
        assert json.loads(str(np.load(out / "episodes.advantage.npz")["meta"]))["source"] == "combined"
    again = tmp_path / "again.json"
    assert main([*args, "--json", str(again)]) == 0  # resumed: no branch is played again
    assert "branching " not in capsys.readouterr().out
    assert json.loads(again.read_text())["iterations"][1]["simulated_steps"] == sim


def test_recap_open_branch_selection_screens_then_deepens_and_resumes(tmp_path, capsys):
    """`--branch_select open` end to end: the screening pass's sidecar and report beside the main one. The
    untrained policy fails every continuation, so no chunk is open and nothing is deepened: the plumbing only
    (which chunks are deepened is tests/learning/test_branch_values.py's)."""
    out, summary = tmp_path / "recap", tmp_path / "r.json"
    args = ["recap", "--iterations", "1", "--out", str(out), "--demo_episodes", "6", "--bc_steps", "2",
            "--policy_steps", "2", "--critic_steps", "2", "--rollout_episodes", "3", "--eval_episodes", "2",
            "--batch_size", "4", "--takeover_threshold", "-2", "--no-progress", "--advantage_source", "combined",
            "--branches", "4", "--branch_rate", "0.3", "--branch_select", "open", "--branch_screen", "2",
            "--actors", "0"]
    assert main([*args, "--json", str(summary)]) == 0
    printed = capsys.readouterr().out
    it = json.loads(summary.read_text())["iterations"][1]
    branching = it["branching"]
    assert branching["select"] == "open" and branching["screen"] == 2 and branching["screened_boundaries"] >= 2
    screen = BranchTable.load(out / "episodes.branches_screen.npz")
    assert set(screen.branches) == {2} and set(screen.success_fractions) == {0.0}  # nothing open
    assert branching["boundaries"] == 0 and it["simulated_steps"]["branches"] == sum(screen.done.values()) > 0
    assert f"{branching['screened_boundaries']} boundaries screened with 2 continuations" in printed
    assert main([*args, "--json", str(tmp_path / "again.json")]) == 0  # resumed: no branch is played again
    assert "branching " not in capsys.readouterr().out
    assert main([*args[:-4], "--branch_screen", "1", "--actors", "0"]) == 2  # must be able to disagree
    assert "--branch_screen" in capsys.readouterr().err


@pytest.mark.parametrize("recipe, message", [
    ("nosuch", "no RECAP recipe 'nosuch' (registered: tabletop)"),
    ("capsule_rollout.tabletop.tabletop_recipe:NoSuchRecipe", "has no attribute 'NoSuchRecipe'"),
])
def test_recap_refuses_an_unknown_recipe_before_anything_runs(tmp_path, recipe, message):
    out = tmp_path / "recap"
    with pytest.raises(SystemExit, match=re.escape(message)):
        main(["recap", "--out", str(out), "--recipe", recipe, "--no-progress"])
    assert not (out / "episodes.zarr").exists()  # nothing was collected


def test_a_recipe_is_found_by_its_registered_name_or_import_path():
    from capsule_rollout.learning.recap_recipe import load_recipe
    from capsule_rollout.tabletop.tabletop_recipe import TabletopRecipe

    assert isinstance(load_recipe("tabletop"), TabletopRecipe)  # the example's entry point
    assert isinstance(load_recipe("capsule_rollout.tabletop.tabletop_recipe:TabletopRecipe"), TabletopRecipe)


def test_label_advantages_takes_the_critics_recipe(capsys):
    assert main(["label_advantages", "--recipe", "nosuch"]) == 2
    assert "no RECAP recipe 'nosuch'" in capsys.readouterr().err
