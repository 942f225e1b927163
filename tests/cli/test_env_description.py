"""Issue 51, item 3: the env describes itself. Its control rate, dimension names and cameras are kept with the
store (`env.json`) and `export_lerobot` takes them from there (no tabletop default outside the tabletop);
cameras by the model's names, the image size and "no images" are options of the entry points."""

from __future__ import annotations

import json

import pytest

from capsule_rollout.cli.run import main
from capsule_rollout.envs.suites import catalog as registry
from capsule_rollout.rollout import record_rollouts
from capsule_rollout.stores import open_episode_reader, read_env_description

pytest.importorskip("pyarrow")
pytest.importorskip("av")

LAB = "tests.rollout.lab_parts"
NOISE = "tests.envs.user_factories:make_noise_policy"
PUSHER_ACTUATORS = ["r_shoulder_pan_joint", "r_shoulder_lift_joint", "r_upper_arm_roll_joint", "r_elbow_flex_joint",
                    "r_forearm_roll_joint", "r_wrist_flex_joint", "r_wrist_roll_joint"]


def _export(store, out, json_path) -> dict:
    assert main(["export_lerobot", "--store", str(store), "--out", str(out), "--no-video", "--no-progress",
                 "--json", str(json_path)]) == 0
    return json.loads((out / "meta/info.json").read_text())


def test_export_of_a_gymnasium_envs_store_needs_no_option_and_writes_its_real_fps(tmp_path):
    run = tmp_path / "run"
    assert main(["sim_rollout", "--env", "gymnasium:Pusher-v5", "--policy", NOISE, "--actors", "0",
                 "--seeds.count", "1", "--max_steps", "4", "--out", str(run), "--no-progress", "--no-video"]) == 0
    described = read_env_description(run / "episodes.zarr")
    assert (described.control_hz, described.env) == (20.0, "gymnasium:Pusher-v5")  # dt 0.05 s, not the tabletop's 10
    info = _export(run / "episodes.zarr", tmp_path / "ds", tmp_path / "e.json")
    assert info["fps"] == 20
    assert info["features"]["action"]["names"] == PUSHER_ACTUATORS  # the model's actuators, one for one
    assert info["features"]["observation.state"]["names"] is None  # the env tells none: none, not 8 tabletop names


def test_export_of_a_third_party_suites_store_needs_no_option_and_writes_its_real_fps(tmp_path, monkeypatch):
    monkeypatch.setitem(registry.SUITES, "labsuite", registry.Suite("labsuite", "tests.rollout.lab_suite",
                                                                     "installed with the lab", "a lab's suite"))
    run = record_rollouts(tmp_path / "run", env="labsuite:puck-v1", policy=f"{LAB}:GainPolicy", seeds=[1], actors=0,
                          recording={"cameras": ()})  # no images
    info = _export(run.store, tmp_path / "ds", tmp_path / "e.json")
    assert info["fps"] == 25 and info["features"]["action"]["names"] == ["x", "y"]  # its dt; the joints its motors drive
    assert not [k for k in info["features"] if k.startswith("observation.images")]  # --cameras with none: no images


def test_a_store_that_records_no_rate_asks_for_fps_in_one_line(tmp_path, capsys):
    run = record_rollouts(tmp_path / "run", env=f"{LAB}:rateless_env", policy="examples.own_env_and_policy:make_policy",
                          seeds=[1], actors=0)
    assert read_env_description(run.store).control_hz is None  # a plain gym.Env: no dt, no render_fps
    code = main(["export_lerobot", "--store", str(run.store), "--out", str(tmp_path / "ds"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "records no control rate" in err and "pass --fps" in err and "Traceback" not in err
    assert main(["export_lerobot", "--store", str(run.store), "--out", str(tmp_path / "ds"), "--fps", "30",
                 "--no-video", "--no-progress"]) == 0
    assert json.loads((tmp_path / "ds/meta/info.json").read_text())["fps"] == 30


def test_cameras_by_the_models_own_names_and_the_image_size(tmp_path):
    run = tmp_path / "run"
    assert main(["sim_rollout", "--env", f"{LAB}:sized_env", "--policy", f"{LAB}:GainPolicy", "--actors", "0",
                 "--seeds.count", "1", "--max_steps", "3", "--cameras", "top", "free", "--image_size", "32",
                 "--out", str(run), "--no-progress", "--no-video"]) == 0
    episode = open_episode_reader(run / "episodes.zarr").episode(0)
    assert sorted(episode.image_keys) == ["image_free", "image_top"]
    assert episode.steps["image_top"].shape[1:] == (32, 32, 3)
    described = read_env_description(run / "episodes.zarr")
    assert described.cameras == ("top", "free") and described.image_size == (32, 32) and described.control_hz == 100
