"""Scripted-expert episodes, recorded step by step with the episode schema."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from capsule_rollout.rollout.host_config import episode_id
from capsule_rollout.stores.episode import Episode, EpisodeBuilder
from capsule_rollout.stores.episode_schema import PRIVILEGED


def demo_episode_id(family: str, seed: int, *, legacy: bool = False) -> str:
    """Deterministic id: collecting the same seed twice names the same episode; file-system-safe (`legacy`: as
    stores recorded before named it, the task as it is: what a resumed old store holds)."""
    return f"{family}-s{seed:07d}" if legacy else episode_id(family, seed)


def record_episode(env, act: Callable[[], np.ndarray], *, seed: int, episode_id: str,
                   intervention: bool = False, proposed: Callable[[], np.ndarray] | None = None) -> Episode:
    """Reset `env` (any rollout-protocol env) with `seed`, act until it ends, and return the episode.

    Step t holds the observation before action t, the executed action, and its
    reward. `proposed()`, called after each `act()`, gives what the acting
    controller meant to do (recorded as `policy_action`; e.g. a scripted expert's
    unperturbed action).
    """
    obs, info = env.reset(seed=seed)
    builder = EpisodeBuilder()
    cameras = tuple(env.observation_spec.cameras)
    while True:
        action = act()
        next_obs, reward, terminated, truncated, next_info = env.step(action)
        builder.add(
            images={c: obs[f"image_{c}"] for c in cameras},
            state=obs["state"],
            action=action,
            policy_action=None if proposed is None else proposed(),
            reward=reward,
            intervention=intervention,
            subtask_id=info.get("subtask_id", env.subtask_index),
            privileged=obs.get(PRIVILEGED),
        )
        obs, info = next_obs, next_info
        if terminated or truncated:
            break
    success = bool(env.success(info))
    return builder.finish(
        episode_id=episode_id,
        seed=seed,
        task=env.task,
        instruction=env.instruction,
        success=success,
        stop_reason="success" if success else "timeout",
        subtasks=list(env.subtask_texts),
    )
