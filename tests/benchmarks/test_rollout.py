"""The rollout benchmark runs end to end on tiny checkpoints (figures are not asserted: shared machines)."""

import json

from benchmarks.rollout import main
from tests.policies.tiny import save_tiny_checkpoints


def test_bench_rollout_smoke(tmp_path):
    policy, critic = save_tiny_checkpoints(tmp_path / "ckpt")
    docs, out = tmp_path / "B.md", tmp_path / "b.json"
    docs.write_text("# Benchmarks\n")
    assert main(["--policy", policy, "--critic", critic, "--n_exec", "2", "--max_steps", "6",
                 "--reset_rounds", "3", "--cold_rounds", "1", "--record_rounds", "1", "--handoff_samples", "20",
                 "--actors_check", "false", "--docs", str(docs), "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["reset"]["speedup"] > 0 and data["recording"]["steps_per_episode"] == 6
    assert 0 < data["handoff"]["cross_process_us"]["n"] <= 20 and data["scaling"] is None  # missed ones are skipped
    assert "<!-- bench_rollout:begin -->" in docs.read_text()
