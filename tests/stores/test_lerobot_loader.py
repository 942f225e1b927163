"""An export opened by LeRobot 0.4.4's own `LeRobotDataset` (in its venv, `make lerobot-venv`), offline:
frames, decoded video, action chunks from `delta_timestamps`, tasks and subtasks equal the store's."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("av")

from capsule_rollout.cli.run import main  # noqa: E402
from capsule_rollout.stores import episode_schema as S  # noqa: E402
from capsule_rollout.stores.lerobot_writer import LeRobotWriterOptions, export_lerobot, open_store  # noqa: E402
from capsule_rollout.stores.zarr_reader import store_episodes  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
LEROBOT_PYTHON = Path(os.environ.get("LEROBOT_PYTHON", ROOT / ".venv-lerobot" / "bin" / "python"))
PROBE = Path(__file__).with_name("lerobot_probe.py")
HORIZON = 6


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    if not LEROBOT_PYTHON.exists():
        pytest.skip(f"LeRobot 0.4.4's venv is missing ({LEROBOT_PYTHON}): `make lerobot-venv` builds it "
                    "(`make test-slow` does), or set LEROBOT_PYTHON")
    path = tmp_path_factory.mktemp("demos") / "d.zarr"
    assert main(["collect_demos", "--episodes", "3", "--out", str(path), "--no-progress"]) == 0
    return open_store(path)


def probe(root: Path, backend: str, tmp_path: Path) -> tuple[dict, dict]:
    out = tmp_path / f"probe-{backend}.npz"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": ""}
    done = subprocess.run([str(LEROBOT_PYTHON), str(PROBE), str(root), backend, str(HORIZON), str(out)],
                          env=env, capture_output=True, text=True, timeout=600)
    if done.returncode == 3:
        pytest.skip(done.stdout.strip() + " (apt-get install ffmpeg; PyAV decoding is tested beside it)")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return dict(np.load(out)), json.loads(out.with_suffix(".json").read_text())


EXPORTS = {  # name -> writer options: video, images, and video with every episode in files of its own
    "video": LeRobotWriterOptions(fps=10),
    "images": LeRobotWriterOptions(fps=10, video=False),
    "small-files": LeRobotWriterOptions(fps=10, data_file_mb=0.002, video_file_mb=0.005),
}


@pytest.fixture(scope="module")
def exports(store, tmp_path_factory):
    base = tmp_path_factory.mktemp("lerobot")
    for name, options in EXPORTS.items():
        export_lerobot(store_episodes(store, range(len(store))), base / name, options)
    files = list((base / "small-files").glob("**/file-*.*"))
    assert len(files) >= 2 * len(store), "the small-files export should spread episodes over several files"
    return base


def expected(store) -> dict[str, np.ndarray]:
    """What LeRobot should return for every frame: the store's fields and its action chunks."""
    arrays = store.load()
    chunk, pad, tasks, subtasks = [], [], [], []
    for i in range(len(store)):
        lo, hi, meta = int(store.starts[i]), int(store.ends[i]), store.meta(i)
        for t in range(lo, hi):
            steps = t + np.arange(HORIZON)
            chunk.append(arrays[S.ACTION][np.minimum(steps, hi - 1)])  # LeRobot repeats the last action
            pad.append(steps >= hi)
            tasks.append(meta.instruction)
            subtasks.append(meta.subtask_texts[arrays[S.SUBTASK_ID][t]])
    return {**arrays, "action_chunk": np.stack(chunk), "action_is_pad": np.stack(pad), "tasks": tasks,
            "subtasks": subtasks}


@pytest.mark.parametrize(("export", "backend"), [("video", "torchcodec"), ("video", "pyav"), ("images", "-"),
                                                ("small-files", "torchcodec"), ("small-files", "pyav")])
def test_lerobot_loads_the_export(store, exports, export, backend, tmp_path):
    got, info = probe(exports / export, backend, tmp_path)
    want = expected(store)
    assert info["lerobot"] == "0.4.4" and info["camera"] == "observation.images.front"
    assert (info["num_episodes"], info["num_frames"]) == (len(store), store.n_steps)
    np.testing.assert_array_equal(got["state"], want[S.STATE])
    np.testing.assert_array_equal(got["action_chunk"], want["action_chunk"])
    np.testing.assert_array_equal(got["action_is_pad"], want["action_is_pad"])
    np.testing.assert_array_equal(got["reward"], want[S.REWARD])
    np.testing.assert_array_equal(got["value"], want[S.VALUE])  # NaN: no critic ran in the demos
    np.testing.assert_array_equal(got["intervention"], want[S.INTERVENTION])
    np.testing.assert_array_equal(got["subtask_id"], want[S.SUBTASK_ID])
    np.testing.assert_array_equal(got["index"], np.arange(store.n_steps))
    np.testing.assert_allclose(got["timestamp"], got["frame_index"] / 10, rtol=1e-6)
    assert info["tasks"] == want["tasks"] and info["subtasks"] == want["subtasks"]
    assert "observation.images.front" in info["stats_keys"] and info["batch_action_shape"] == [4, HORIZON, 4]
    images = got["image"].transpose(0, 2, 3, 1).astype(int)  # LeRobot gives (C, H, W) in [0, 1]
    source = want["image_front"].astype(int)
    # the frame 0.1 s back (delta_timestamps on the camera): the episode's first frame where there is none
    first = np.repeat(store.starts, store.ends - store.starts)
    previous = np.maximum(np.arange(store.n_steps) - 1, first)
    np.testing.assert_array_equal(got["previous_is_pad"], np.arange(store.n_steps) == first)
    previous_images = got["previous_image"].transpose(0, 2, 3, 1).astype(int)
    if backend == "-":
        np.testing.assert_array_equal(images, source)  # PNG: lossless
        np.testing.assert_array_equal(previous_images, source[previous])
        return
    np.testing.assert_array_equal(previous_images, images[previous])  # the same decoded frame either way
    assert np.abs(images - source).mean() < 4  # h264 at crf 18
    # each frame is the store's frame at its own time, not its predecessor: where the scene moved
    # (pixels that changed by more than 30), the decoded frame is nearer to its own source frame
    moved = np.abs(source[1:] - source[:-1]) > 30
    own = (np.abs(images[1:] - source[1:]) * moved).sum(axis=(1, 2, 3))
    previous = (np.abs(images[1:] - source[:-1]) * moved).sum(axis=(1, 2, 3))
    checked = moved.sum(axis=(1, 2, 3)) >= 20
    assert checked.sum() > len(checked) // 2 and (own[checked] < previous[checked]).all()


def test_lerobot_trains_a_policy_on_the_export(exports, tmp_path):
    """`lerobot-train` (ACT, one step on the CPU, no pretrained backbone to download) reads the export:
    its features, normalisation stats and action chunks."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": ""}
    done = subprocess.run(
        [str(LEROBOT_PYTHON), "-m", "lerobot.scripts.lerobot_train", "--dataset.repo_id=capsule-rollout/export",
         f"--dataset.root={exports / 'video'}", "--policy.type=act", "--policy.device=cpu",
         "--policy.push_to_hub=false", "--policy.pretrained_backbone_weights=null", "--steps=1", "--batch_size=2",
         "--num_workers=0", "--save_checkpoint=false", "--eval_freq=0", "--wandb.enable=false",
         f"--output_dir={tmp_path / 'train'}"],
        env=env, capture_output=True, text=True, timeout=600)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "dataset.num_episodes=3" in log and "End of training" in log
