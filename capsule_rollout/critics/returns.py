"""Value targets from recorded episodes: normalised returns-to-go."""

from __future__ import annotations

import numpy as np

ACTOR_DEMONSTRATOR, ACTOR_POLICY = 0, 1
"""Who acted in a recorded episode (and so who acts from its states on, for a critic that is told): a
demonstrator (`collect_demos` and other recorders that restore no capsule) or the policy (a `RolloutHost`
recorded it from its initial capsule, operator takeovers included)."""


def normalized_returns(rewards: np.ndarray, success: bool, max_steps: int, *,
                       failure_penalty: float | None = None) -> np.ndarray:
    """Per-step targets in [-1, 0] for one episode.

    G_t = sum of rewards from t on (reward -1 per step, 0 on the success step),
    plus `failure_penalty` (default: -max_steps) when the episode failed, divided
    by `max_steps` and clipped to [-1, 0]. A failed episode's targets are all -1.
    """
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    rewards = np.asarray(rewards, dtype=np.float64)
    to_go = np.cumsum(rewards[::-1])[::-1]
    if not success:
        to_go = to_go + (-float(max_steps) if failure_penalty is None else failure_penalty)
    return np.clip(to_go / max_steps, -1.0, 0.0).astype(np.float32)


def value_targets(rewards: np.ndarray, episode_ends: np.ndarray, successes, max_steps: int) -> np.ndarray:
    """`normalized_returns` of every episode of a flat store (`episode_ends` cumulative, one success each)."""
    ends = np.asarray(episode_ends, np.int64)
    starts = np.concatenate([[0], ends[:-1]])
    out = np.zeros(len(rewards), np.float32)
    for lo, hi, success in zip(starts, ends, successes):
        out[lo:hi] = normalized_returns(rewards[lo:hi], bool(success), max_steps)
    return out


def executed_plans(actions: np.ndarray, ends: np.ndarray, plan_steps: int) -> np.ndarray:
    """`(N, plan_steps, A)`: for every step, the actions executed from it on within its episode (the
    last action repeated past the episode's end)."""
    ends = np.asarray(ends, np.int64)
    starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    offsets = np.arange(plan_steps)
    index = np.arange(len(actions))[:, None] + offsets[None, :]
    last = np.repeat(ends - 1, ends - starts)[:, None]
    return actions[np.minimum(index, last)].astype(np.float32)
