"""The LeRobot dataset benchmark on a tiny store, and its frame-fidelity measure."""

import json

import numpy as np
import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("av")

from benchmarks.lerobot_dataset import frame_fidelity, main  # noqa: E402
from capsule_rollout.stores.zarr_recorder import ZarrRecorder  # noqa: E402
from tests.rollout.fakes import fake_episode  # noqa: E402


def moving_frames(n: int = 12) -> np.ndarray:
    """A bright square moving 4 px per frame across a dark 32x32 image."""
    frames = np.zeros((n, 32, 32, 3), np.uint8)
    for t in range(n):
        frames[t, 8:16, 2 * t:2 * t + 8] = 200
    return frames


def test_frame_fidelity_tells_a_frame_from_its_predecessor():
    frames = moving_frames()
    exact = frame_fidelity(frames, frames)
    assert exact == {"mean_abs_error": 0.0, "frames_in_place": 1.0, "frames_checked": 11}
    stale = frames.copy()
    stale[1::2] = frames[0:-1:2]  # every other frame repeats its predecessor
    assert frame_fidelity(frames, stale)["frames_in_place"] == pytest.approx(5 / 11)


def test_bench_lerobot_reports_every_method(tmp_path):
    store, docs, summary = tmp_path / "s.zarr", tmp_path / "B.md", tmp_path / "b.json"
    with ZarrRecorder(store) as recorder:
        for i in range(2):
            recorder.write(fake_episode(i, length=6))
    docs.write_text("# Benchmarks\n")
    assert main(["--store", str(store), "--rounds", "1", "--vcodecs", "h264", "--docs", str(docs),
                 "--json", str(summary)]) == 0
    result = json.loads(summary.read_text())
    assert result["frames"] == 12 and set(result["methods"]) == {"no video (PNG)", "video h264"}
    assert result["methods"]["no video (PNG)"]["mean_abs_error"] == 0.0
    assert all(m["export_frames_per_s"] > 0 and m["dataset_mb"] > 0 for m in result["methods"].values())
    text = docs.read_text()
    assert "<!-- bench_lerobot:begin -->" in text and "| video h264 |" in text
