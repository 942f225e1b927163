"""The evaluation statistics on hand-made inputs with known answers, and eval_policy's critic AUC."""

import json

import numpy as np
import pytest

from capsule_rollout.learning.stats import (
    auc_interval,
    failure_auc,
    failure_auc_summary,
    mid_episode_step,
    mid_episode_value,
    paired_comparison,
    phase_breakdown,
    wilson_interval,
)


def test_wilson_interval_known_values():
    lo, hi = wilson_interval(10, 50)
    assert (round(lo, 3), round(hi, 3)) == (0.112, 0.330)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert wilson_interval(0, 20)[0] == 0.0 and wilson_interval(20, 20)[1] == 1.0


def test_failure_auc_and_mid_episode_value_by_hand():
    # failures at -0.9, -0.8; successes at -0.2, -0.85: 3 of 4 pairs ordered right
    assert failure_auc([(-0.9, False), (-0.8, False), (-0.2, True), (-0.85, True)]) == 0.75
    assert failure_auc([(-0.5, True), (-0.5, False)]) == 0.5  # a tie counts half
    assert failure_auc([(-0.5, True)]) is None
    nan = float("nan")
    values = np.array([-0.7, nan, -0.6, nan, -0.3, nan])
    assert mid_episode_value(values, 3) == -0.6 and mid_episode_value(values, 2) == -0.6
    assert mid_episode_value(values, 0) == -0.7 and mid_episode_value(values, 5) == -0.3
    assert mid_episode_value(values, 6) is None  # ended before step 6: not judged there
    assert mid_episode_step(values, 3) == 2 and mid_episode_step(values, 6) is None  # the step judged
    assert mid_episode_value(np.array([nan, nan]), 1) is None
    with pytest.raises(ValueError, match="at_step"):
        mid_episode_value(values, -1)


def test_auc_interval_narrows_with_more_episodes_and_stays_in_range():
    small, large = auc_interval(0.8, 10, 10), auc_interval(0.8, 200, 200)
    assert small[0] < large[0] < 0.8 < large[1] < small[1]
    assert auc_interval(1.0, 5, 5) == (1.0, 1.0) and 0.0 <= auc_interval(0.02, 3, 3)[0]
    summary = failure_auc_summary([(-0.9, False), (-0.1, True), (-0.2, True)])
    assert summary["auc"] == 1.0 and (summary["failures"], summary["successes"], summary["episodes"]) == (1, 2, 3)
    assert failure_auc_summary([(-0.1, True)])["auc"] is None


def test_paired_comparison_exact_mcnemar():
    a = [1] * 7 + [0] * 3 + [1] * 5
    b = [0] * 7 + [0] * 3 + [1] * 5
    result = paired_comparison(a, b)
    assert (result["only_a"], result["only_b"], result["both"], result["seeds"]) == (7, 0, 5, 15)
    assert result["p_value"] == pytest.approx(2 / 2**7)  # all 7 discordant seeds one way
    assert paired_comparison(b, a)["p_value"] == result["p_value"]
    # 6 vs 4 discordant: P(X <= 4 | n=10) * 2 = 2 * 386/1024
    assert paired_comparison([1] * 6 + [0] * 4, [0] * 6 + [1] * 4)["p_value"] == pytest.approx(2 * 386 / 1024)
    assert paired_comparison([1, 0], [1, 0])["p_value"] == 1.0
    with pytest.raises(ValueError, match="same seeds"):
        paired_comparison([1], [1, 0])


def test_eval_policy_reports_the_critics_failure_auc_without_changing_the_policy(tmp_path):
    from capsule_rollout.cli.paths import resolve_input
    from capsule_rollout.cli.run import main

    plain, judged = tmp_path / "plain.json", tmp_path / "judged.json"
    base = ["eval_policy", "--episodes", "4", "--no-expert"]
    assert main([*base, "--json", str(plain)]) == 0
    assert main([*base, "--critic", "checkpoints/critic", "--json", str(judged)]) == 0
    plain, judged = (json.loads(p.read_text())["policy"] for p in (plain, judged))
    assert judged["success_by_seed"] == plain["success_by_seed"] and len(plain["success_by_seed"]) == 4
    auc = judged["critic_failure_auc"]
    assert auc["episodes"] == 4 and auc["successes"] == plain["successes"] and "critic_failure_auc" not in plain
    # the same states by task phase: the phases partition them, and the phase alone is scored too
    phases = judged["critic_phases"]
    assert all(name.startswith("subtask ") for name in phases)
    assert sum(p["states"] for p in phases.values()) == auc["episodes"]
    assert sum(p["successes"] for p in phases.values()) == auc["successes"]
    assert judged["phase_alone_failure_auc"]["episodes"] == auc["episodes"] and "critic_phases" not in plain
    # several critics on the same episodes: each scored on the same states, and their mean value
    import torch

    from capsule_rollout.models.checkpoint import save_checkpoint
    from capsule_rollout.tabletop.value_critic import KIND, load_critic

    other = load_critic(resolve_input("checkpoints/critic"))
    torch.manual_seed(0)
    with torch.no_grad():
        for p in other.head.parameters():
            p.add_(0.5 * torch.randn_like(p))
    save_checkpoint(tmp_path / "other", kind=KIND, model=other, step=0, config={"model": other.config.to_json()})
    both = tmp_path / "both.json"
    assert main([*base, "--critic", "checkpoints/critic", str(tmp_path / "other"),
                 "--json", str(both)]) == 0
    both = json.loads(both.read_text())["policy"]
    assert both["success_by_seed"] == plain["success_by_seed"]
    first, second = both["critic_failure_aucs"]
    assert first == auc and second["episodes"] == first["episodes"] == both["critic_failure_auc_mean"]["episodes"]
    mids = both["critic_mid_values"]
    assert len(mids) == 4 and sum(m is not None for m in mids) == first["episodes"]
    assert all(len(m) == 2 and -1 <= min(m) <= max(m) <= 0 for m in mids if m is not None)


def test_eval_policy_refuses_guidance_without_the_positive_indicator(capsys):
    from capsule_rollout.cli.run import main

    assert main(["eval_policy", "--beta", "2.0"]) == 2  # the shipped policy is not advantage-conditioned
    assert "not trained with advantage labels; pass --advantage positive" in capsys.readouterr().err
    assert main(["eval_policy", "--advantage", "none", "--beta", "2.0"]) == 2
    assert "not with --advantage none" in capsys.readouterr().err


def test_phase_breakdown_by_hand():
    rows = [  # phase A: 1 success of 3, the value ranks it first; phase B: 2 of 2, no failure to rank
        {"phase": "A", "success": False, "value": -0.9, "oracle": 0.0},
        {"phase": "A", "success": False, "value": -0.2, "oracle": 0.1},
        {"phase": "A", "success": True, "value": -0.5, "oracle": 0.9},
        {"phase": "B", "success": True, "value": -0.1, "oracle": 1.0},
        {"phase": "B", "success": True, "value": -0.3, "oracle": 0.8},
    ]
    out = phase_breakdown(rows, ["value", "oracle"])
    a, b = out["phases"]["A"], out["phases"]["B"]
    assert list(out["phases"]) == ["A", "B"]  # largest phase first
    assert (a["states"], a["successes"], b["states"], b["successes"]) == (3, 1, 2, 2)
    assert a["value"]["auc"] == 0.5 and a["oracle"]["auc"] == 1.0  # -0.9 < -0.5 < -0.2; oracle separates
    assert b["value"]["auc"] is None  # one outcome only
    # phase rates: A 1/3 for its three states, B 1.0; failures (1/3, 1/3) vs successes (1/3, 1, 1):
    # each failure ties A's success (a half) and is below B's two, so 5 of 6 pairs
    assert out["phase_alone"]["auc"] == pytest.approx(5 / 6)
