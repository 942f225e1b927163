"""The robot bridge benchmark, tiny: every request kind timed, its section written."""

import json

from benchmarks.bridge import main


def test_bench_bridge_smoke(tmp_path):
    out, docs = tmp_path / "b.json", tmp_path / "B.md"
    assert main(["--rounds", "12", "--image_size", "32", "--json", str(out), "--docs", str(docs)]) == 0
    assert set(json.loads(out.read_text())["latency_us"]) == {"heartbeat", "action", "observe"}
    assert "<!-- bench_bridge:begin -->" in docs.read_text() and "| observe |" in docs.read_text()
