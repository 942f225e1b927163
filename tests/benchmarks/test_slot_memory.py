"""The slot memory benchmark, tiny: each layout measured in a process of its own (figures are not asserted)."""

import json

from benchmarks.slot_memory import main


def test_bench_slot_memory_smoke(tmp_path):
    out, docs = tmp_path / "b.json", tmp_path / "B.md"
    assert main(["--slots", "2", "--weights_mb", "4", "--episodes", "1", "--rounds", "1", "--json", str(out),
                 "--docs", str(docs)]) == 0
    data = json.loads(out.read_text())
    assert set(data["rss_mb"]) == {"batchingx1", "batchingx2", "loopingx2"} and all(v > 0 for v in data["rss_mb"].values())
    assert data["instances"] == {"batchingx1": 1, "batchingx2": 1, "loopingx2": 2}
    assert all(run["errors"] == 0 for runs in data["runs"].values() for run in runs)
    assert "<!-- bench_slot_memory:begin -->" in docs.read_text()
