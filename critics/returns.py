"""Value targets from recorded episodes: normalised returns-to-go."""

from __future__ import annotations

import numpy as np


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
