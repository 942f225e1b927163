"""A tiny-budget run of the RECAP loop end to end (the figures are measured by the real run, not here)."""

import json

import numpy as np

from experiments.run import main
from rollout.zarr_reader import ZarrEpisodeReader


def test_recap_loop_runs_every_stage_and_reports_each_iteration(tmp_path):
    out, summary = tmp_path / "recap", tmp_path / "r.json"
    assert main(["recap", "--iterations", "1", "--out", str(out), "--demo_episodes", "10", "--bc_steps", "2",
                 "--policy_steps", "2", "--critic_steps", "2", "--rollout_episodes", "2", "--eval_episodes", "2",
                 "--batch_size", "4", "--takeover_threshold", "0.5", "--takeover_steps", "3", "--no-progress",
                 "--json", str(summary)]) == 0
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
    assert (out / "episodes.advantage.npz").exists() and (out / "policy_1").is_dir() and (out / "critic_1").is_dir()


def test_failure_auc_and_mid_episode_value_by_hand():
    from experiments.recap import failure_auc, mid_episode_value

    assert failure_auc([(-0.9, False), (-0.8, False), (-0.2, True), (-0.85, True)]) == 0.75
    assert failure_auc([(-0.5, True)]) is None
    nan = float("nan")
    assert mid_episode_value(np.array([-0.7, nan, -0.6, nan, -0.3, nan])) == -0.6
    assert mid_episode_value(np.array([nan, nan])) is None
