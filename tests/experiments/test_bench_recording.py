"""bench_recording at a tiny size: every episode recorded in both modes, and only the sharded driver is spared the
images (no timing is asserted)."""

import json

import pytest

from experiments.run import main

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]


def test_bench_recording_records_every_episode_in_both_modes(tmp_path):
    summary = tmp_path / "b.json"
    assert main(["bench_recording", "--actors", "1", "2", "--episodes", "4", "--steps", "5", "--image_size", "16",
                 "--cameras", "2", "--out", str(tmp_path / "stores"), "--json", str(summary)]) == 0
    data = json.loads(summary.read_text())
    rows = {(r["mode"], r["actors"]): r for r in data["rows"]}
    assert set(rows) == {(m, n) for m in ("single", "sharded") for n in (1, 2)}
    for row in rows.values():
        assert row["recorded"] == 4 and row["steps_per_s"] > 0
    image_mb = 5 * 2 * 16 * 16 * 3 / 1e6  # per episode: 5 steps of two 16x16 cameras
    for n in (1, 2):  # the single writer's driver receives the images, the sharded one never does
        assert rows["single", n]["driver_mb_per_episode"] - rows["sharded", n]["driver_mb_per_episode"] == \
            pytest.approx(image_mb)
    assert list((tmp_path / "stores").iterdir()) == []  # each measured store removed
