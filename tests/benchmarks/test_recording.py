"""The recording benchmark at a tiny size: every episode recorded in both modes, and only the sharded driver is spared the
images (no timing is asserted)."""

import json

import pytest

from benchmarks.recording import main, summarize

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]


def test_bench_recording_records_every_episode_in_both_modes(tmp_path):
    summary, docs = tmp_path / "b.json", tmp_path / "B.md"
    assert main(["--actors", "1", "2", "--episodes", "5", "--steps", "5", "--image_size", "16",
                 "--cameras", "2", "--rounds", "1", "--episodes_per_call", "1", "3", "--out", str(tmp_path / "stores"),
                 "--json", str(summary), "--docs", str(docs)]) == 0
    data = json.loads(summary.read_text())
    rows = {(r["mode"], r["actors"], r["per_call"]): r for r in data["rows"]}
    assert set(rows) == {(m, n, k) for m in ("single", "sharded") for n in (1, 2) for k in (1, 3)}
    for row in rows.values():
        assert row["recorded"] == 5 and row["rounds"] == 1 and row["steps_per_s"] > 0
    assert len(data["measurements"]) == 8  # 2 actor counts x 2 calls x 2 stores
    assert [(r["actors"], r["per_call"]) for r in data["driver_cpu_ratios"]] == [(1, 1), (1, 3), (2, 1), (2, 3)]
    image_mb = 5 * 2 * 16 * 16 * 3 / 1e6  # per episode: 5 steps of two 16x16 cameras
    for n in (1, 2):  # the single writer's driver receives the images, the sharded one never does
        for k in (1, 3):
            assert rows["single", n, k]["driver_mb_per_episode"] - rows["sharded", n, k]["driver_mb_per_episode"] == \
                pytest.approx(image_mb)
    assert list((tmp_path / "stores").iterdir()) == []  # each measured store removed
    assert "<!-- bench_recording:begin -->" in docs.read_text() and "| 2 | 3 | sharded | 5/5 |" in docs.read_text()


def test_rounds_are_summarized_by_medians_and_paired_ratios():
    def m(mode, cpu, rate, k=1):
        return {"mode": mode, "actors": 2, "per_call": k, "episodes": 10, "recorded": 10, "steps_per_s": rate,
                "driver_cpu_s_per_episode": cpu, "driver_mb_per_episode": 1.0, "wall_s": 1.0}

    measured = [m("single", 4.0, 100), m("sharded", 1.0, 90),   # round 0: ratio 4
                m("single", 2.0, 100, 8), m("sharded", 0.5, 90, 8),
                m("sharded", 0.5, 80), m("single", 10.0, 300),  # round 1: ratio 20
                m("sharded", 0.25, 80, 8), m("single", 5.0, 300, 8),
                m("single", 6.0, 200), m("sharded", 3.0, 70),   # round 2: ratio 2
                m("single", 3.0, 200, 8), m("sharded", 1.0, 70, 8)]
    rows, ratios = summarize(measured, (2,), (1, 8))
    by = {(r["mode"], r["per_call"]): r for r in rows}
    assert by["single", 1]["steps_per_s"] == 200 and by["sharded", 1]["steps_per_s"] == 80
    assert by["single", 1]["driver_cpu_s_per_episode"] == 6.0 and by["sharded", 8]["rounds"] == 3
    one, eight = ratios
    assert one["same_call"] == 4.0  # the median of the rounds' ratios (4, 20, 2), not 6.0 / 1.0
    assert eight["same_call"] == 4.0 and eight["vs_default_single"] == 8.0  # (8, 20, 3) and (8, 40, 6)
