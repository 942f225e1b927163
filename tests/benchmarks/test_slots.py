"""The slots benchmark runs end to end on tiny checkpoints (figures are not asserted: shared machines)."""

import json

from benchmarks.slots import main
from tests.policies.tiny import save_tiny_checkpoints


def test_bench_slots_smoke(tmp_path):
    policy, critic = save_tiny_checkpoints(tmp_path / "ckpt")
    docs, out = tmp_path / "B.md", tmp_path / "b.json"
    docs.write_text("# Benchmarks\n")
    assert main(["--policy", policy, "--critic", critic, "--slots", "3", "--n_exec", "2", "--episodes", "4",
                 "--max_steps", "6", "--rounds", "1", "--branch_items", "1", "--branch_steps", "0", "2",
                 "--branches", "2", "--docs", str(docs), "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["slots"] == 3 and data["rollouts"]["recorded"]["episodes"] == 4
    assert data["branch"]["values_same_with_images_on_demand"] is True
    assert set(data["rollouts"]["not_recorded"]["steps_per_s"]) == {"one_drawn", "one_on_demand", "slots_drawn",
                                                                    "slots_on_demand"}
    rows = data["batch_invariance"]["rows"]
    assert [r["slots"] for r in rows] == [1, 3, 4, 6] and all(r["same_as_one_slot_invariant"] for r in rows)
    assert "<!-- bench_slots:begin -->" in docs.read_text() and "batch-invariant runtimes" in docs.read_text()
    hand = data["hand_written"]  # the hand-written batched loop plays the host's actions
    assert hand["same_actions"] is True and set(hand["steps_per_s"]) == {"hand", "auto", "two", "serial"}
    assert "hand-written batched loop" in docs.read_text()
