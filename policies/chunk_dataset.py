"""`ChunkDataset`: training windows (observation at t, actions t..t+T-1) over recorded episodes.

Arrays are time-major over all steps of all episodes (the zarr store's `data/`);
a window that runs past its episode's end repeats the last action (the policy
learns to hold still after finishing).
"""

from __future__ import annotations

import numpy as np
import torch


class ChunkDataset:
    def __init__(
        self,
        *,
        images: dict[str, np.ndarray],  # camera -> (N, H, W, 3) uint8
        states: np.ndarray,  # (N, S) float32
        actions: np.ndarray,  # (N, A) float32
        tokens: np.ndarray,  # (N, L) int64: the language of each step's subtask
        episode_ends: np.ndarray,  # (E,) cumulative step counts
        horizon: int,
        advantage: np.ndarray | None = None,  # (N,) int64 indicator, 0 = none
    ) -> None:
        n = len(states)
        for name, arr in [("actions", actions), ("tokens", tokens), *images.items()]:
            if len(arr) != n:
                raise ValueError(f"{name} has {len(arr)} steps, states have {n}")
        if not len(episode_ends) or episode_ends[-1] != n:
            raise ValueError(f"episode_ends must end at the number of steps ({n})")
        self.images = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in images.items()}
        self.states = torch.from_numpy(np.asarray(states, np.float32))
        self.actions = torch.from_numpy(np.asarray(actions, np.float32))
        self.tokens = torch.from_numpy(np.asarray(tokens, np.int64))
        self.advantage = torch.from_numpy(np.zeros(n, np.int64) if advantage is None else np.asarray(advantage, np.int64))
        self.episode_ends = np.asarray(episode_ends, np.int64)
        starts = np.concatenate([[0], self.episode_ends[:-1]])
        lengths = self.episode_ends - starts
        self.episode_of_step = np.repeat(np.arange(len(lengths)), lengths)
        self._last = torch.from_numpy(np.repeat(self.episode_ends - 1, lengths))
        self._offsets = torch.arange(horizon)
        self.horizon = horizon

    def __len__(self) -> int:
        return len(self.states)

    @property
    def n_episodes(self) -> int:
        return len(self.episode_ends)

    def steps_of_episodes(self, episodes: np.ndarray) -> np.ndarray:
        """Global step indices of the given episodes."""
        starts = np.concatenate([[0], self.episode_ends[:-1]])
        return np.concatenate([np.arange(starts[e], self.episode_ends[e]) for e in episodes]) if len(episodes) else \
            np.zeros(0, np.int64)

    def batch(self, steps: torch.Tensor) -> dict:
        """Tensors for the windows starting at `steps` (B,)."""
        window = torch.minimum(steps[:, None] + self._offsets[None, :], self._last[steps][:, None])
        return {
            "images": {k: v[steps] for k, v in self.images.items()},
            "state": self.states[steps],
            "tokens": self.tokens[steps],
            "advantage": self.advantage[steps],
            "actions": self.actions[window],
        }
