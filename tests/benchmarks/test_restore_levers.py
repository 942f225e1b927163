"""The restore-against-reset benchmark runs end to end with every lever turned off in turn, and puts each back
(figures are not asserted: shared machines)."""

import json

from benchmarks.restore_levers import LEVERS, main
from capsule_rollout.capsules.graph import state as graph_state
from capsule_rollout.envs import mujoco_capsule

ENV = "tests.envs.broken_envs:make_counter"  # graph-captured: nothing declared


def test_restore_levers_smoke(tmp_path):
    quick, compile_template = graph_state.quick_state, graph_state.compile_template
    compile_direct, kept_arrays = graph_state.compile_direct, mujoco_capsule.host_arrays
    out, docs = tmp_path / "b.json", tmp_path / "B.md"
    assert main(["--env", ENV, "--rounds", "3", "--json", str(out), "--docs", str(docs)]) == 0
    got = json.loads(out.read_text())[ENV]
    assert set(got) == {"all", *LEVERS} and got["all"]["graph"] and got["all"]["file_bytes"] > 0
    assert all(got[k]["restore_med"] > 0 and got[k]["reset_med"] > 0 for k in got)
    assert graph_state.quick_state is quick and graph_state.compile_template is compile_template
    assert graph_state.compile_direct is compile_direct and mujoco_capsule.host_arrays is kept_arrays
    text = docs.read_text()
    assert "<!-- restore_levers:begin -->" in text and f"| `{ENV}` (graph) |" in text
    assert "without templates" in text and "without generator words copied" in text


def test_without_levers_an_env_is_measured_once(tmp_path):
    out = tmp_path / "b.json"
    assert main(["--env", ENV, "--rounds", "3", "--no-levers", "--json", str(out)]) == 0
    assert set(json.loads(out.read_text())[ENV]) == {"all"}
