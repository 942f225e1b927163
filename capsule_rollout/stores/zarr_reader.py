"""Episode readers: `EpisodeReader`, what every reader offers (random windows for training included), and
`ZarrEpisodeReader`, the complete episodes of one zarr store (a sharded store's: `stores.sharded_reader`)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import zarr

from capsule_rollout.stores import episode_schema as S
from capsule_rollout.stores.episode import Episode, EpisodeMeta
from capsule_rollout.stores.zarr_recorder import ENDS, committed_episodes


class EpisodeReader:
    """The reader API, over `ends` / `starts` (int64: each episode's rows among the store's steps, episodes
    back to back in the reader's order) and what a subclass gives: `keys`, `episode_ids`, `meta(i)`,
    `episode(i, keys)`, `steps(lo, hi, keys)`."""

    path: Path
    ends: np.ndarray
    starts: np.ndarray
    _loaded: dict[str, np.ndarray]  # key -> all steps, once `load` read them

    @property
    def keys(self) -> list[str]:
        raise NotImplementedError

    @property
    def episode_ids(self) -> list[str]:
        raise NotImplementedError

    def meta(self, index: int) -> EpisodeMeta:
        raise NotImplementedError

    def episode(self, index: int, keys: Sequence[str] | None = None) -> Episode:
        raise NotImplementedError

    def steps(self, lo: int, hi: int, keys: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Step arrays of the store's steps lo..hi-1."""
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self.ends)

    def __contains__(self, episode_id: object) -> bool:
        if getattr(self, "_id_set", None) is None:  # a reader is a read-only view: its ids never change
            self._id_set = set(self.episode_ids)
        return episode_id in self._id_set

    @property
    def n_steps(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    def episodes(self, keys: Sequence[str] | None = None) -> Iterator[Episode]:
        for i in range(len(self)):
            yield self.episode(i, keys)

    def load(self, keys: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Whole arrays of the complete episodes, in memory (cached)."""
        keys = list(keys or self.keys)
        missing = [k for k in keys if k not in self._loaded]
        if missing:
            self._loaded.update(self.steps(0, self.n_steps, missing))
        return {k: self._loaded[k] for k in keys}

    def sample(
        self, batch: int, horizon: int, rng: np.random.Generator, keys: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """`batch` windows of `horizon` steps, each inside one episode; a window that runs
        past its episode's end repeats the last step. Returns (batch, horizon, ...) arrays
        plus `episode_index` (batch,) and `t` (batch,) of each window's first step."""
        if not len(self):
            raise ValueError(f"{self.path} holds no complete episode to sample from")
        arrays = self.load(keys)
        ep = rng.integers(0, len(self), size=batch)
        start, end = self.starts[ep], self.ends[ep]
        t0 = start + (rng.random(batch) * (end - start)).astype(np.int64)
        idx = np.minimum(t0[:, None] + np.arange(horizon)[None, :], (end - 1)[:, None])
        out = {k: v[idx] for k, v in arrays.items()}
        out["episode_index"] = ep
        out["t"] = t0 - start
        return out

    def _index(self, index: int) -> int:
        if not -len(self) <= index < len(self):
            raise IndexError(f"episode {index} out of range: the store holds {len(self)} complete episodes")
        return index % len(self)


def store_episodes(reader: EpisodeReader, indices: Sequence[int], *, block_mb: int = 256) -> Iterator[Episode]:
    """Episodes `indices` of a store, read in blocks of consecutive episodes of up to `block_mb` (one
    `reader.steps` call per block: reading episode by episode costs about as much as writing them)."""
    indices = [int(i) for i in indices]
    if not indices:
        return
    step_bytes = max(1, sum(v.nbytes for v in reader.steps(0, 1).values()))
    limit = max(1, (block_mb << 20) // step_bytes)
    i = 0
    while i < len(indices):
        lo, j = int(reader.starts[indices[i]]), i + 1
        while j < len(indices) and indices[j] == indices[j - 1] + 1 and reader.ends[indices[j]] - lo <= limit:
            j += 1
        block = reader.steps(lo, int(reader.ends[indices[j - 1]]))
        for k in indices[i:j]:
            a, b = int(reader.starts[k]) - lo, int(reader.ends[k]) - lo
            yield Episode({key: value[a:b] for key, value in block.items()}, reader.meta(k))
        i = j


class ZarrEpisodeReader(EpisodeReader):
    """Read-only view of the complete episodes (an uncommitted tail is ignored, not repaired)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        if not (self.path / ".zgroup").exists():
            raise FileNotFoundError(f"{self.path} is not a zarr store (no .zgroup)")
        root = zarr.open_group(str(self.path), mode="r")
        self._data = dict(root["data"].arrays()) if "data" in root else {}
        meta = root["meta"]
        self._meta = {name: meta[name] for name in S.EPISODE_FIELDS if name in meta}
        ends = meta[ENDS][:]
        n = committed_episodes(ends, [a.shape[0] for a in self._data.values()] or [0],
                               [a.shape[0] for a in self._meta.values()])
        self.ends = ends[:n].astype(np.int64) if self._data else ends[:0].astype(np.int64)
        self.starts = np.concatenate([[0], self.ends[:-1]]).astype(np.int64)
        self._meta_cache = {name: array[: len(self.ends)] for name, array in self._meta.items()}
        self._loaded: dict[str, np.ndarray] = {}

    @property
    def keys(self) -> list[str]:
        return sorted(self._data)

    @property
    def specs(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Key -> (per-step shape, dtype) of the store's step arrays."""
        return {k: (tuple(a.shape[1:]), np.dtype(a.dtype)) for k, a in self._data.items()}

    @property
    def episode_ids(self) -> list[str]:
        return [str(x) for x in self._meta_cache.get(S.EPISODE_ID, [])]

    def meta(self, index: int) -> EpisodeMeta:
        i = self._index(index)
        fields = {}
        for name, dtype in S.EPISODE_FIELDS.items():
            if name not in self._meta_cache:  # a store written before the field existed: its default
                continue
            value = self._meta_cache[name][i]
            fields[name] = str(value) if dtype.kind == "U" else value.item()
        return EpisodeMeta(**fields)

    def episode(self, index: int, keys: Sequence[str] | None = None) -> Episode:
        i = self._index(index)
        lo, hi = int(self.starts[i]), int(self.ends[i])
        steps = {k: (self._loaded[k][lo:hi] if k in self._loaded else self._data[k][lo:hi]) for k in (keys or self._data)}
        return Episode(steps, self.meta(i))

    def steps(self, lo: int, hi: int, keys: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Step arrays of the store's steps lo..hi-1 (one read per array, across episodes)."""
        if not 0 <= lo <= hi <= self.n_steps:
            raise IndexError(f"steps {lo}..{hi} out of range: the store holds {self.n_steps} complete steps")
        return {k: (self._loaded[k][lo:hi] if k in self._loaded else self._data[k][lo:hi]) for k in (keys or self._data)}
