"""The remote policy benchmark, tiny: it serves the policy in another process, measures both ways and writes its section."""

from __future__ import annotations

from benchmarks import remote_policy


def test_bench_remote_policy_measures_both_ways_and_writes_its_section(tmp_path):
    docs = tmp_path / "BENCH.md"
    docs.write_text("# Benchmarks\n")
    result = remote_policy.run(remote_policy.BenchRemotePolicyConfig(rounds=3, docs=str(docs)))
    stats = result.summary["stats"]
    assert {k: stats[k]["n"] for k in stats} == {"in_process": 3, "websocket": 3, "server_infer": 3}
    assert result.summary["chunk"] == [16, 4] and result.summary["request_bytes"] > 64 * 64 * 3
    text = docs.read_text()
    assert "<!-- bench_remote_policy:begin -->" in text and "over the websocket" in text
