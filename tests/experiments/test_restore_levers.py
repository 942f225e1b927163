"""The restore-against-reset benchmark runs end to end with every lever turned off in turn, and puts each back
(figures are not asserted: shared machines)."""

from capsule_rollout.benchmarks.restore_levers import LEVERS, main
from capsule_rollout.capsules import graph_read, graph_state


def test_restore_levers_smoke():
    quick, persistent_id = graph_state.quick_state, graph_read._Freezer.persistent_id
    out = main(["3", "--levers", "tests.envs.broken_envs:make_counter"])
    got = out["tests.envs.broken_envs:make_counter"]
    assert set(got) == {"all", *LEVERS} and got["all"]["graph"] and got["all"]["file_bytes"] > 0
    assert all(got[k]["restore_med"] > 0 and got[k]["reset_med"] > 0 for k in got)
    assert graph_state.quick_state is quick and graph_read._Freezer.persistent_id is persistent_id
