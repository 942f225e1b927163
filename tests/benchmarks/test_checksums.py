"""The checksums benchmark at a tiny budget: every figure it reports is there and finite."""

from __future__ import annotations

import json
import math

from benchmarks.checksums import main


def test_bench_checksums_reports_recording_and_reading_with_and_without(tmp_path):
    out, docs = tmp_path / "b.json", tmp_path / "B.md"
    assert main(["--episodes", "3", "--steps", "4", "--image_size", "8", "--rounds", "2", "--read_repeats", "1",
                 "--images", "smooth", "--docs", str(docs), "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["images"] == "smooth" and row["rounds"] == 2 and row["episodes"] == 3
    for what in ("record", "read blocks", "read one by one"):
        assert all(math.isfinite(v) and v > 0 for v in row[what].values()), row[what]
    assert row["hash"]["ms/episode"] > 0 and 0 < row["hash"]["share of recording"] < 1
    text = docs.read_text()
    assert "<!-- bench_checksums:begin -->" in text and "| smooth | record (steps/s) |" in text
