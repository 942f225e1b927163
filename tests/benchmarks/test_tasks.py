"""The tasks benchmark runs end to end (figures are not asserted: shared machines); each run a `sim_rollout` process."""

import json

import pytest

from benchmarks.tasks import main
from tests.policies.tiny import save_tiny_checkpoints


@pytest.mark.slow
def test_bench_tasks_smoke(tmp_path):
    policy, critic = save_tiny_checkpoints(tmp_path / "ckpt")
    docs, out = tmp_path / "B.md", tmp_path / "b.json"
    docs.write_text("# Benchmarks\n")
    assert main(["--policy", policy, "--critic", critic, "--n_exec", "2", "--seeds", "1", "--rounds", "1",
                 "--episodes_per_call", "0", "--startup_rounds", "1", "--out", str(tmp_path / "runs"),
                 "--docs", str(docs), "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["episodes"] == 4 and data["env_alone"]["episodes"] == 4 and data["env_alone"]["steps"] > 0
    [mix] = data["mix"]
    assert 0 < mix["models_share"] < 1 and mix["over_env_alone"] > 0 and 0 < mix["rows_filled"] <= 1
    parts = mix["ms_per_step"]  # where an actor's time per step went, from the run's summary
    assert parts["env_step"] > 0 and parts["models"] > 0 and parts["cold_reset"] > 0 and parts["capsule_save"] > 0
    assert mix["core_ms_per_step"] > 0 and mix["env_alone_ms_per_step"] > 0
    assert data["startup"]["now_process_s"] > data["startup"]["now_phases"]["to_actors_ready_s"] > 0
    assert data["startup"]["now_phases"]["after_episodes_s"] > 0
    assert "before_process_s" not in data["startup"] and data["mix_before"] is None
    assert "<!-- bench_tasks:begin -->" in docs.read_text() and "--family all" in docs.read_text()
    assert "ms per step once started" in docs.read_text()
