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
        chunk_length: int,
        advantage: np.ndarray | None = None,  # (N,) int64 indicator, 0 = none
        subgoals: np.ndarray | None = None,  # (N, G) float32 auxiliary targets (see `subgoal_targets`)
        phrasings: tuple[np.ndarray, np.ndarray] | None = None,  # (text_ids (N,), table (U, V, L)): per step,
        # the index of its subtask text, and V token rows of other ways to say each of the U texts
    ) -> None:
        n = len(states)
        extra = [] if subgoals is None else [("subgoals", subgoals)]
        for name, arr in [("actions", actions), ("tokens", tokens), *images.items(), *extra]:
            if len(arr) != n:
                raise ValueError(f"{name} has {len(arr)} steps, states have {n}")
        if not len(episode_ends) or episode_ends[-1] != n:
            raise ValueError(f"episode_ends must end at the number of steps ({n})")
        self.images = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in images.items()}
        self.states = torch.from_numpy(np.asarray(states, np.float32))
        self.actions = torch.from_numpy(np.asarray(actions, np.float32))
        self.tokens = torch.from_numpy(np.asarray(tokens, np.int64))
        self.advantage = torch.from_numpy(np.zeros(n, np.int64) if advantage is None else np.asarray(advantage, np.int64))
        self.subgoals = None if subgoals is None else torch.from_numpy(np.asarray(subgoals, np.float32))
        self.text_ids = self.phrasings = None
        if phrasings is not None:
            text_ids, table = phrasings
            if len(text_ids) != n or table.ndim != 3 or table.shape[2] != self.tokens.shape[1]:
                raise ValueError(f"phrasings: text ids ({len(text_ids)}) must cover the {n} steps and the table must "
                                 f"be (texts, variants, {self.tokens.shape[1]}), got {table.shape}")
            if len(text_ids) and not 0 <= int(np.min(text_ids)) <= int(np.max(text_ids)) < len(table):
                raise ValueError(f"phrasings: text ids must index the table's {len(table)} texts")
            self.text_ids = torch.from_numpy(np.asarray(text_ids, np.int64))
            self.phrasings = torch.from_numpy(np.asarray(table, np.int64))
        self.episode_ends = np.asarray(episode_ends, np.int64)
        starts = np.concatenate([[0], self.episode_ends[:-1]])
        lengths = self.episode_ends - starts
        self.episode_of_step = np.repeat(np.arange(len(lengths)), lengths)
        self._last = torch.from_numpy(np.repeat(self.episode_ends - 1, lengths))
        self._offsets = torch.arange(chunk_length)
        self.chunk_length = chunk_length

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

    def batch(self, steps: torch.Tensor, *, paraphrase: float = 0.0, generator: torch.Generator | None = None) -> dict:
        """Tensors for the windows starting at `steps` (B,); with `paraphrase` > 0 each window's subtask
        text is, with that probability, one of its phrasings (drawn uniformly) instead of the recorded text."""
        window = torch.minimum(steps[:, None] + self._offsets[None, :], self._last[steps][:, None])
        tokens = self.tokens[steps]
        if paraphrase > 0:
            if self.phrasings is None:
                raise ValueError("paraphrase > 0 needs a dataset built with phrasings")
            b, variants = len(steps), self.phrasings.shape[1]
            swap = torch.rand(b, generator=generator) < paraphrase
            pick = torch.randint(0, variants, (b,), generator=generator)
            tokens = torch.where(swap[:, None], self.phrasings[self.text_ids[steps], pick], tokens)
        out = {
            "images": {k: v[steps] for k, v in self.images.items()},
            "state": self.states[steps],
            "tokens": tokens,
            "advantage": self.advantage[steps],
            "actions": self.actions[window],
        }
        if self.subgoals is not None:
            out["subgoal"] = self.subgoals[steps]
        return out


def subgoal_targets(states: np.ndarray, subtask_ids: np.ndarray, episode_ends: np.ndarray, dims: int = 3) -> np.ndarray:
    """Per step, the first `dims` state entries (the end effector's position) when its subtask ends.

    A subtask's run of steps ends where `subtask_id` changes within the episode; the
    target is the state of the first step after the run (the observation that shows
    the subtask done), or the episode's last step for the final run.
    """
    n = len(states)
    if len(subtask_ids) != n or not len(episode_ends) or episode_ends[-1] != n:
        raise ValueError(f"states ({n}), subtask_ids ({len(subtask_ids)}) and episode_ends must cover the same steps")
    out = np.empty((n, dims), np.float32)
    start = 0
    for end in np.asarray(episode_ends, np.int64):
        ids = subtask_ids[start:end]
        change = np.flatnonzero(ids[1:] != ids[:-1]) + 1  # first step of each later run
        run_starts = np.concatenate([[0], change])
        run_ends = np.concatenate([change, [end - start - 1]])  # index of the target step per run
        for lo, hi, target in zip(run_starts, np.concatenate([change, [end - start]]), run_ends):
            out[start + lo: start + hi] = states[start + target, :dims]
        start = end
    return out
