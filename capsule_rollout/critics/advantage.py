"""RECAP advantage labels from critic values: N-step advantages, per-task thresholds, indicators.

Units are the critic's: returns normalised by the task's max episode length, so
each step's reward is -1/M (0 on the success step) and a failure ends at -1.

    A_t = sum_{k<N} r_{t+k} / M + V(o_{t+N}) - V(o_t)     when t + N < T
    A_t = G_t - V(o_t)                                  otherwise (Monte-Carlo:
                                                          the episode ends first)

where G_t is the normalised return-to-go (`normalized_returns`, failure penalty
included). A task's threshold is the advantage quantile that makes a chosen
fraction of its steps positive; intervention steps are positive whatever their
advantage (a human's correction is what the policy should do).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from capsule_rollout.critics.returns import normalized_returns

INDICATOR_POSITIVE, INDICATOR_NEGATIVE = 1, 2  # as in policies.rollout_policy (0 = none)


def n_step_advantages(rewards: np.ndarray, values: np.ndarray, *, success: bool, n: int, max_steps: int,
                      failure_penalty: float | None = None) -> np.ndarray:
    """Per-step advantages (T,) of one episode from its rewards (T,) and values V(o_t) (T,)."""
    rewards = np.asarray(rewards, np.float64)
    values = np.asarray(values, np.float64)
    t_len = len(rewards)
    if values.shape != (t_len,):
        raise ValueError(f"values must have one entry per step ({t_len}), got shape {values.shape}")
    if n < 1:
        raise ValueError(f"n must be >= 1 control step, got {n}")
    if not np.all(np.isfinite(values)):
        raise ValueError("values contain NaN/inf: evaluate the critic on every step before labelling")
    mc = normalized_returns(rewards, success, max_steps, failure_penalty=failure_penalty).astype(np.float64)
    adv = mc - values
    if t_len > n:
        window = np.convolve(rewards, np.ones(n), mode="valid")[: t_len - n] / max_steps  # sum r_t..r_{t+n-1}
        adv[: t_len - n] = window + values[n:] - values[: t_len - n]
    return adv.astype(np.float32)


@dataclass(frozen=True)
class AdvantageLabels:
    advantage: np.ndarray  # (N,) float32, every step of every episode
    indicator: np.ndarray  # (N,) int64: INDICATOR_POSITIVE or INDICATOR_NEGATIVE
    thresholds: dict[str, float]  # task -> advantage threshold
    positive_fraction: dict[str, float]  # task -> realised fraction of positive steps


def label_episodes(
    *,
    rewards: Sequence[np.ndarray],
    values: Sequence[np.ndarray],
    success: Sequence[bool],
    tasks: Sequence[str],
    interventions: Sequence[np.ndarray] | None = None,
    n: int,
    max_steps: int,
    positive_fraction: float = 0.3,
) -> AdvantageLabels:
    """Advantages and indicators for a list of episodes (concatenated in order)."""
    if not 0.0 < positive_fraction < 1.0:
        raise ValueError(f"positive_fraction must be within (0, 1), got {positive_fraction}")
    if not (len(rewards) == len(values) == len(success) == len(tasks)):
        raise ValueError("rewards, values, success and tasks need one entry per episode")
    if interventions is not None and len(interventions) != len(rewards):
        raise ValueError("interventions need one entry per episode")
    advs = [n_step_advantages(r, v, success=s, n=n, max_steps=max_steps) for r, v, s in zip(rewards, values, success)]
    adv = np.concatenate(advs) if advs else np.zeros(0, np.float32)
    step_task = np.concatenate([[t] * len(a) for t, a in zip(tasks, advs)]) if advs else np.zeros(0, str)
    forced = (np.concatenate([np.asarray(i, bool) for i in interventions]) if interventions is not None
              else np.zeros(len(adv), bool))
    indicator, thresholds = indicators_by_task(adv, step_task, forced, positive_fraction)
    realised = {task: float(np.mean(indicator[step_task == task] == INDICATOR_POSITIVE)) for task in sorted(set(tasks))}
    return AdvantageLabels(adv, indicator, thresholds, realised)


def indicators_by_task(adv: np.ndarray, step_task: np.ndarray, forced: np.ndarray,
                       positive_fraction: float) -> tuple[np.ndarray, dict[str, float]]:
    """(indicator per step, threshold per task): a task's labelled autonomous steps above the (1 -
    `positive_fraction`) quantile of them are positive, the rest negative (the quantile is taken over all its
    labelled steps when none is autonomous); interventions (`forced`) are positive; a NaN advantage is no
    label (indicator 0) unless the step is an intervention."""
    adv, forced = np.asarray(adv), np.asarray(forced, bool)  # adv's own dtype: the quantile as before
    step_task = np.asarray(step_task)
    labelled = np.isfinite(adv)
    indicator = np.zeros(len(adv), np.int64)
    thresholds: dict[str, float] = {}
    for task in sorted(set(step_task.tolist())):
        mask = (step_task == task) & labelled
        pool = mask & ~forced if np.any(mask & ~forced) else mask
        if not pool.any():
            continue
        thresholds[task] = float(np.quantile(adv[pool], 1.0 - positive_fraction))
        indicator[mask] = np.where(adv[mask] > thresholds[task], INDICATOR_POSITIVE, INDICATOR_NEGATIVE)
    indicator[forced] = INDICATOR_POSITIVE
    return indicator, thresholds
