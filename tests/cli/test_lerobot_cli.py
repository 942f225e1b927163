"""export_lerobot and import_lerobot from the command line: store -> LeRobot -> store, and training on it."""

import json

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("av")

from capsule_rollout.cli.run import main  # noqa: E402
from capsule_rollout.stores.lerobot_checksums import CHECKSUMS_PATH, INFO_KEY  # noqa: E402
from capsule_rollout.stores.lerobot_writer import LeRobotExportError  # noqa: E402
from capsule_rollout.stores.zarr_reader import ZarrEpisodeReader  # noqa: E402
from tests.rollout.fakes import assert_same_episode  # noqa: E402


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    path = tmp_path_factory.mktemp("demos") / "d.zarr"
    assert main(["collect_demos", "--episodes", "2", "--out", str(path), "--no-progress"]) == 0
    return path


def test_store_to_lerobot_to_store_is_the_same_and_trains(demos, tmp_path):
    dataset, store, summary = tmp_path / "ds", tmp_path / "back.zarr", tmp_path / "export.json"
    assert main(["export_lerobot", "--store", str(demos), "--out", str(dataset), "--no-video", "--no-progress",
                 "--json", str(summary)]) == 0
    source = ZarrEpisodeReader(demos)
    result = json.loads(summary.read_text())
    assert (result["episodes"], result["frames"], result["video"], result["fps"]) == (2, source.n_steps, False, 10)
    info = json.loads((dataset / "meta/info.json").read_text())
    # the names and rate the tabletop env says of itself, kept with the store by collect_demos
    from capsule_rollout.tabletop.tabletop_env import DIMENSION_NAMES

    assert info["features"]["observation.state"]["names"] == list(DIMENSION_NAMES["state"])
    assert info["features"]["action"]["names"] == list(DIMENSION_NAMES["action"]) and info["fps"] == 10
    assert info["features"]["observation.images.front"]["dtype"] == "image"

    imported = tmp_path / "import.json"
    assert main(["import_lerobot", "--src", str(dataset), "--out", str(store), "--no-progress",
                 "--json", str(imported)]) == 0
    assert json.loads(imported.read_text())["episodes"] == 2
    back = ZarrEpisodeReader(store)
    assert back.episode_ids == source.episode_ids
    for i in range(len(source)):
        assert_same_episode(back.episode(i), source.episode(i))
    assert main(["import_lerobot", "--src", str(dataset), "--out", str(store), "--no-progress",
                 "--json", str(imported)]) == 0  # resumed: nothing new
    assert json.loads(imported.read_text())["skipped_already_recorded"] == 2 and len(ZarrEpisodeReader(store)) == 2

    assert main(["train_policy", "--data", str(store), "--out", str(tmp_path / "policy"), "--steps", "1",
                 "--batch_size", "4", "--noise_samples", "1", "--eval_episodes", "0", "--no-progress"]) == 0


def test_export_chooses_episodes_and_refuses_to_overwrite(demos, tmp_path):
    dataset = tmp_path / "ds"
    args = ["export_lerobot", "--store", str(demos), "--out", str(dataset), "--episodes", "1", "--no-progress"]
    assert main(args) == 0
    info = json.loads((dataset / "meta/info.json").read_text())
    assert info["total_episodes"] == 1 and info["features"]["observation.images.front"]["dtype"] == "video"
    with pytest.raises(LeRobotExportError, match="already exists"):
        main(args)
    assert main([*args[:-2], "--overwrite", "--no-progress"]) == 0
    assert json.loads((dataset / "meta/info.json").read_text())["total_episodes"] == 2
    with pytest.raises(LeRobotExportError, match="cannot read"):
        main(["export_lerobot", "--store", str(tmp_path / "none.zarr"), "--out", str(tmp_path / "x")])
    assert main(["export_lerobot", "--store", str(demos), "--out", ""]) == 2  # a config error, before any work


def test_import_refuses_a_dataset_without_checksums_unless_told(demos, tmp_path, capsys):
    dataset, store = tmp_path / "ds", tmp_path / "back.zarr"
    assert main(["export_lerobot", "--store", str(demos), "--out", str(dataset), "--no-video", "--no-progress"]) == 0
    (dataset / CHECKSUMS_PATH).unlink()  # what LeRobot's own tools write: no sidecar, none named in info.json
    info = json.loads((dataset / "meta/info.json").read_text())
    (dataset / "meta/info.json").write_text(json.dumps({k: v for k, v in info.items() if k != INFO_KEY}))
    args = ["import_lerobot", "--src", str(dataset), "--out", str(store), "--no-progress"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "2 of its 2 episodes were recorded without checksums" in err and err.count("\n") == 1
    assert not store.exists()
    assert main([*args, "--allow_unverified", "true"]) == 0 and len(ZarrEpisodeReader(store)) == 2
