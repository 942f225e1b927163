"""`ShardedEpisodeReader`: a sharded store (`stores.sharded_store`) read as one store, and
`open_episode_reader`, which opens either kind of store.

The reader sees exactly the episodes the manifest names, in manifest order, with the API of
`ZarrEpisodeReader` (len, `episode_ids`, `meta(i)`, `episode(i)`, `keys`, `steps(lo, hi)`, `load`,
`sample`, `in`): the store's steps are the named episodes back to back, so `starts` / `ends` index
them as in a single store. Episodes a shard holds that the manifest does not name (orphans) are never
read. Each entry is checked against its shard when the reader opens: the shard exists, holds a
complete episode at that index, with that id and length; every shard has the same step arrays.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from capsule_rollout.stores.episode import Episode, EpisodeMeta
from capsule_rollout.stores.shard_manifest import MANIFEST_FILE, ManifestEntry, ManifestError
from capsule_rollout.stores.sharded_store import (
    SHARDS_DIR,
    is_sharded_store,
    manifest_entries,
    parse_store_root,
    shard_path,
)
from capsule_rollout.stores.store_damage import EpisodeCheck
from capsule_rollout.stores.zarr_reader import EpisodeReader, ZarrEpisodeReader


def open_episode_reader(location: str | os.PathLike, *, verify: bool = True) -> EpisodeReader:
    """A reader of the store at `location` (a path or file:// URL): a sharded store root or a single zarr store.
    Reads are checked against the episodes' checksums (`verify=False`: not)."""
    root = parse_store_root(location)
    if is_sharded_store(root):
        return ShardedEpisodeReader(root, verify=verify)
    if not (root / ".zgroup").exists():
        raise FileNotFoundError(f"{root} is not an episode store: not a zarr store (no .zgroup) and not a sharded "
                                f"store root (no {MANIFEST_FILE})")
    return ZarrEpisodeReader(root, verify=verify)


class ShardedEpisodeReader(EpisodeReader):
    """Read-only view of a sharded store's committed episodes, in manifest order; reads are checked against the
    checksums of the shards' episodes (`ZarrEpisodeReader`), a damaged one raises `StoreDamageError`."""

    def __init__(self, location: str | os.PathLike, *, verify: bool = True) -> None:
        self.path = parse_store_root(location)
        self._verify = verify
        self.entries: tuple[ManifestEntry, ...] = manifest_entries(self.path)
        self._shards: dict[str, ZarrEpisodeReader] = {}
        self._shard_ids: dict[str, list[str]] = {}
        for number, entry in enumerate(self.entries):
            self._check(entry, number + 2)  # line 1 is the header
        self._names = sorted(self._shards)
        number_of = {name: i for i, name in enumerate(self._names)}
        self._shard_of = np.array([number_of[e.shard] for e in self.entries], np.int64)
        self._local = np.array([e.index for e in self.entries], np.int64)
        self._local_start = np.array([int(self._shards[e.shard].starts[e.index]) for e in self.entries], np.int64)
        self.ends = np.cumsum([e.length for e in self.entries], dtype=np.int64)
        self.starts = np.concatenate([[0], self.ends[:-1]]).astype(np.int64)
        self._specs = self._common_specs()
        self._loaded: dict[str, np.ndarray] = {}
        self.record_problems = {f"{shard_path(self.path, name).relative_to(self.path)}/{what}": why
                                for name in self._names for what, why in self._shards[name].record_problems.items()}

    def _check(self, entry: ManifestEntry, line: int) -> None:
        where = (f"{self.path / MANIFEST_FILE} line {line} names episode {entry.episode_id!r} as episode "
                 f"{entry.index} of shard {entry.shard!r}")
        shard = self._shards.get(entry.shard)
        if shard is None:
            path = shard_path(self.path, entry.shard)
            if not (path / ".zgroup").exists():
                raise ManifestError(f"{where}, but {path} is missing: copy the shard back into {SHARDS_DIR}/ (the "
                                    "store was moved or copied without it?); nothing in the store was changed")
            shard = self._shards[entry.shard] = ZarrEpisodeReader(path, verify=self._verify)
            self._shard_ids[entry.shard] = shard.episode_ids
        if entry.index >= len(shard):
            raise ManifestError(f"{where}, but that shard holds {len(shard)} complete episodes (was it replaced, "
                                "or lost in a power failure?); nothing in the store was changed")
        found = self._shard_ids[entry.shard][entry.index]
        length = int(shard.ends[entry.index] - shard.starts[entry.index])
        if (found, length) != (entry.episode_id, entry.length):
            raise ManifestError(f"{where} ({entry.length} steps), but the shard holds {found!r} there ({length} "
                                "steps): the shard does not belong to this manifest")

    def _common_specs(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        specs: dict[str, tuple[tuple[int, ...], np.dtype]] | None = None
        for name in self._names:
            got = self._shards[name].specs
            if specs is not None and got != specs:
                raise ValueError(f"{self.path}: shard {name!r} holds step arrays {got}, other shards {specs}; "
                                 "a store's shards hold the same arrays (one run's episodes)")
            specs = got
        return specs or {}

    @property
    def keys(self) -> list[str]:
        return sorted(self._specs)

    @property
    def specs(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Key -> (per-step shape, dtype) of the store's step arrays."""
        return dict(self._specs)

    @property
    def shards(self) -> list[Path]:
        """The shards the manifest names."""
        return [self._shards[name].path for name in self._names]

    @property
    def episode_ids(self) -> list[str]:
        return [e.episode_id for e in self.entries]

    def verified(self, index: int) -> bool:
        """Whether episode `index` has checksums its reads are checked against."""
        i = self._index(index)
        return self._shards[self.entries[i].shard].verified(self.entries[i].index)

    def check(self, first: int, last: int) -> list[EpisodeCheck]:
        """The verdict on episodes first..last (`ZarrEpisodeReader.check` on their shards, a run of consecutive
        episodes of one shard at a time)."""
        out: list[EpisodeCheck] = []
        i = first
        while i <= last:
            shard, lo = self.entries[i].shard, self.entries[i].index
            j = i
            while j < last and self.entries[j + 1].shard == shard and self.entries[j + 1].index == lo + j + 1 - i:
                j += 1
            where = shard_path(self.path, shard).relative_to(self.path)
            for k, found in enumerate(self._shards[shard].check(lo, lo + j - i)):
                problems = {f"{where}/{array}": why for array, why in found.problems.items()}
                out.append(dataclasses.replace(found, index=i + k, problems=problems))
            i = j + 1
        return out

    def meta(self, index: int) -> EpisodeMeta:
        i = self._index(index)
        return self._shards[self.entries[i].shard].meta(self.entries[i].index)

    def episode(self, index: int, keys: Sequence[str] | None = None) -> Episode:
        i = self._index(index)
        keys = list(keys or self.keys)
        if all(k in self._loaded for k in keys):
            lo, hi = int(self.starts[i]), int(self.ends[i])
            return Episode({k: self._loaded[k][lo:hi] for k in keys}, self.meta(i))
        return self._shards[self.entries[i].shard].episode(self.entries[i].index, keys)

    def steps(self, lo: int, hi: int, keys: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Step arrays of the store's steps lo..hi-1: one read per array and shard, whatever the episodes."""
        if not 0 <= lo <= hi <= self.n_steps:
            raise IndexError(f"steps {lo}..{hi} out of range: the store holds {self.n_steps} complete steps")
        keys = list(keys or self.keys)
        unknown = sorted(set(keys) - set(self._specs))
        if unknown:
            raise KeyError(f"{self.path} has no step arrays {unknown}; it has {self.keys}")
        out = {k: self._loaded[k][lo:hi] for k in keys if k in self._loaded}
        todo = [k for k in keys if k not in out]
        if not todo:
            return out
        if lo == hi:
            return {**out, **{k: np.empty((0, *self._specs[k][0]), self._specs[k][1]) for k in todo}}
        first, last = int(np.searchsorted(self.ends, lo, "right")), int(np.searchsorted(self.ends, hi - 1, "right"))
        eps = np.arange(first, last + 1)
        a = np.maximum(self.starts[eps], lo) - self.starts[eps] + self._local_start[eps]  # rows in each episode's shard
        b = a + np.minimum(self.ends[eps], hi) - np.maximum(self.starts[eps], lo)
        blocks = {}
        for s in np.unique(self._shard_of[eps]):
            mine = self._shard_of[eps] == s
            span = int(a[mine].min()), int(b[mine].max())
            blocks[int(s)] = (span[0], self._shards[self._names[s]].steps(*span, todo))
        pieces = []
        for k, (ra, rb) in enumerate(zip(a, b)):
            base, block = blocks[int(self._shard_of[eps[k]])]
            pieces.append((block, int(ra) - base, int(rb) - base))
        out.update({key: np.concatenate([blk[key][x:y] for blk, x, y in pieces]) for key in todo})
        return out
