"""Advantage labels on hand-made episodes with known answers."""

import numpy as np
import pytest

from capsule_rollout.critics.advantage import INDICATOR_NEGATIVE, INDICATOR_POSITIVE, label_episodes, n_step_advantages

SUCCESS_REWARDS = np.array([-1.0, -1.0, -1.0, 0.0])  # success on the 4th step
M = 10


def test_a_perfect_critic_gives_zero_advantage_everywhere():
    exact = np.array([-0.3, -0.2, -0.1, 0.0])  # -(steps to go)/M
    for n in (1, 2, 3, 10):
        assert np.allclose(n_step_advantages(SUCCESS_REWARDS, exact, success=True, n=n, max_steps=M), 0.0, atol=1e-7)


def test_n_step_and_monte_carlo_parts_by_hand():
    adv = n_step_advantages(SUCCESS_REWARDS, np.zeros(4), success=True, n=2, max_steps=M)
    # t=0,1: two rewards (-0.2) + V(t+2) - V(t) = -0.2; t=2,3: the episode ends first -> G_t - V = -0.1, 0
    assert np.allclose(adv, [-0.2, -0.2, -0.1, 0.0])
    fail = n_step_advantages(np.array([-1.0, -1.0, -1.0]), np.full(3, -0.5), success=False, n=1, max_steps=M)
    # one reward (-0.1) + V - V for t=0,1; the last step falls back to G = -1 (failure) minus V = -0.5
    assert np.allclose(fail, [-0.1, -0.1, -0.5])


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="one entry per step"):
        n_step_advantages(SUCCESS_REWARDS, np.zeros(3), success=True, n=1, max_steps=M)
    with pytest.raises(ValueError, match="n must be"):
        n_step_advantages(SUCCESS_REWARDS, np.zeros(4), success=True, n=0, max_steps=M)
    with pytest.raises(ValueError, match="NaN"):
        n_step_advantages(SUCCESS_REWARDS, np.array([0, np.nan, 0, 0]), success=True, n=1, max_steps=M)
    with pytest.raises(ValueError, match="positive_fraction"):
        label_episodes(rewards=[], values=[], success=[], tasks=[], n=1, max_steps=M, positive_fraction=1.0)


def test_per_task_thresholds_fraction_and_forced_interventions():
    # task a: advantages 0.0, -0.1, -0.2, -0.3 (values chosen so with n=1: A_t = -0.1 + V_{t+1} - V_t)
    rng = np.random.default_rng(0)
    rewards, values, success, tasks, interventions = [], [], [], [], []
    for task, scale in (("a", 1.0), ("b", 10.0)):  # different advantage scales: thresholds are per task
        for _ in range(5):
            t = 20
            rewards.append(np.full(t, -1.0))
            values.append(rng.normal(-0.5, 0.05 * scale, t).clip(-1, 0))
            success.append(False)
            tasks.append(task)
            interventions.append(np.zeros(t, bool))
    interventions[0][:3] = True  # a human corrected the first 3 steps of one episode
    labels = label_episodes(rewards=rewards, values=values, success=success, tasks=tasks,
                            interventions=interventions, n=3, max_steps=M, positive_fraction=0.3)
    assert set(labels.thresholds) == {"a", "b"} and labels.thresholds["a"] != labels.thresholds["b"]
    assert labels.advantage.shape == labels.indicator.shape == (200,)
    assert np.all(labels.indicator[:3] == INDICATOR_POSITIVE)  # forced
    for i, task in enumerate(("a", "b")):
        part = labels.indicator[100 * i: 100 * (i + 1)]
        auto = part if task == "b" else part[3:]
        assert abs(np.mean(auto == INDICATOR_POSITIVE) - 0.3) < 0.03  # the fraction asked for
        assert set(np.unique(part)) <= {INDICATOR_POSITIVE, INDICATOR_NEGATIVE}
        # positives are exactly the autonomous steps above the task's threshold
        adv = labels.advantage[100 * i: 100 * (i + 1)]
        offset = 3 if task == "a" else 0
        assert np.array_equal(auto == INDICATOR_POSITIVE, adv[offset:] > labels.thresholds[task])
