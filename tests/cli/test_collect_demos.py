import json

import numpy as np

from capsule_rollout.cli.run import main
from capsule_rollout.stores.npz_recorder import NpzRecorder, read_npz_episode
from capsule_rollout.stores.zarr_reader import ZarrEpisodeReader


def test_collect_to_zarr_then_resume(tmp_path):
    store, summary = tmp_path / "demos.zarr", tmp_path / "c.json"
    assert main(["collect_demos", "--episodes", "3", "--out", str(store), "--no-progress", "--json", str(summary)]) == 0
    data = json.loads(summary.read_text())
    assert data["episodes"] == 3 and data["successes"] == 3 and data["success_rate"] == 1.0
    assert data["steps_per_s"] > 0 and data["store"] == str(store)
    reader = ZarrEpisodeReader(store)
    assert reader.episode_ids == ["pick_place-s0000000", "pick_place-s0000001", "pick_place-s0000002"]
    ep = reader.episode(0)
    assert ep.meta.success and ep.meta.stop_reason == "success" and ep.steps["image_front"].shape[1:] == (64, 64, 3)
    # the expert's own proposal is recorded; without noise it is what was executed
    assert np.array_equal(ep.steps["policy_action"], ep.steps["action"])
    # a second run over seeds 0..4 records only the two new ones
    assert main(["collect_demos", "--episodes", "5", "--out", str(store), "--no-progress", "--json", str(summary)]) == 0
    data = json.loads(summary.read_text())
    assert data["episodes"] == 2 and data["skipped_already_recorded"] == 3
    assert len(ZarrEpisodeReader(store)) == 5


def test_collect_npz_state_only_with_noise(tmp_path):
    out = tmp_path / "npz"
    args = ["collect_demos", "--episodes", "2", "--format", "npz", "--out", str(out), "--cameras",
            "--family", "stack", "--noise", "0.3", "--seed", "10", "--no-progress"]
    assert main(args) == 0
    paths = NpzRecorder(out).episode_paths()
    assert [p.name for p in paths] == ["stack-s0000010.npz", "stack-s0000011.npz"]
    ep = read_npz_episode(paths[0])
    assert ep.meta.task == "stack" and ep.meta.seed == 10 and not ep.image_keys
    # with noise, the executed actions differ from the expert's intent (DART labels)
    assert not np.array_equal(ep.steps["policy_action"], ep.steps["action"])


def test_bad_arguments(capsys):
    assert main(["collect_demos", "--family", "stak"]) == 2
    assert "did you mean 'stack'" in capsys.readouterr().err
    assert main(["collect_demos", "--noise", "-1"]) == 2
    assert "--noise must be within" in capsys.readouterr().err
    assert main(["collect_demos", "--cameras", "wrist"]) == 2
    assert "--cameras ['wrist'] unknown" in capsys.readouterr().err
