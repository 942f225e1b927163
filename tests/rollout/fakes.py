"""Fake episodes generated from the schema; contents encode (episode index, step) for integrity checks."""

from __future__ import annotations

import numpy as np

from capsule_rollout.stores.episode import EpisodeBuilder


def fake_episode(index: int, length: int = 7, *, cameras=("front",), image_size: int = 16, state_dim: int = 8,
                 action_dim: int = 4, success: bool = True, privileged_dim: int = 0):
    """`privileged_dim`: a `privileged` step field of that size too (0: none, as a robot records)."""
    rng = np.random.default_rng(index)
    builder = EpisodeBuilder()
    for t in range(length):
        state = rng.normal(size=state_dim).astype(np.float32)
        state[0], state[1] = index, t  # integrity markers
        builder.add(
            images={c: np.full((image_size, image_size, 3), (index + t) % 256, np.uint8) for c in cameras},
            state=state,
            action=rng.uniform(-1, 1, action_dim).astype(np.float32),
            reward=0.0 if (success and t == length - 1) else -1.0,
            policy_action=rng.uniform(-1, 1, action_dim) if t % 2 else None,
            value=float(-t / length) if t % 3 else float("nan"),
            intervention=bool(t % 4 == 1),
            subtask_id=t * 2 // length,
            timestamp=1.7e9 + index * 100 + t * 0.1,
            privileged=rng.normal(size=privileged_dim).astype(np.float32) if privileged_dim else None,
        )
    return builder.finish(
        episode_id=f"ep-{index:05d}", seed=index, task="pick_place", instruction=f"put block {index} on the pad",
        success=success, stop_reason="success" if success else "timeout", initial_capsule_id=f"cap-{index}",
        subtasks=[f"pick up block {index}", f"place block {index} on the pad"],
    )


def assert_same_episode(a, b):
    assert a.meta == b.meta
    assert set(a.steps) == set(b.steps)
    for k in a.steps:
        x, y = np.asarray(a.steps[k]), np.asarray(b.steps[k])
        assert x.dtype == y.dtype and x.shape == y.shape, k
        assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), k
