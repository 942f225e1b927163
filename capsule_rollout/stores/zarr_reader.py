"""Episode readers: `EpisodeReader`, what every reader offers (random windows for training included), and
`ZarrEpisodeReader`, the complete episodes of one zarr store (a sharded store's: `stores.sharded_reader`)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import zarr

from capsule_rollout.stores import checksums as C
from capsule_rollout.stores import episode_schema as S
from capsule_rollout.stores import store_damage as D
from capsule_rollout.stores.checksum_record import ChecksumRecord, first_checked, read_record
from capsule_rollout.stores.episode import Episode, EpisodeMeta
from capsule_rollout.stores.store_damage import EpisodeCheck, StoreDamageError, UnverifiedStoreError
from capsule_rollout.stores.zarr_recorder import ENDS, committed_episodes


class EpisodeReader:
    """The reader API, over `ends` / `starts` (int64: each episode's rows among the store's steps, episodes
    back to back in the reader's order) and what a subclass gives: `keys`, `episode_ids`, `meta(i)`,
    `episode(i, keys)`, `steps(lo, hi, keys)`."""

    path: Path
    ends: np.ndarray
    starts: np.ndarray
    _loaded: dict[str, np.ndarray]  # key -> all steps, once `load` read them
    record_problems: dict[str, str]  # damage to what records the store's checksums that loses none of them

    @property
    def keys(self) -> list[str]:
        raise NotImplementedError

    @property
    def specs(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Key -> (per-step shape, dtype) of the store's step arrays."""
        raise NotImplementedError

    @property
    def episode_ids(self) -> list[str]:
        raise NotImplementedError

    def meta(self, index: int) -> EpisodeMeta:
        raise NotImplementedError

    def verified(self, index: int) -> bool:
        """Whether episode `index` has checksums its reads are checked against."""
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


def require_verified(reader: EpisodeReader, indices: Sequence[int]) -> None:
    """Refuse episodes `indices` unless each has checksums: one whose checksums are missing where the store records
    them raises `StoreDamageError`; episodes recorded without raise `UnverifiedStoreError` naming them."""
    unverified = []
    for i in indices:
        if not reader.verified(i):
            meta = reader.meta(i)  # raises when the store records checksums for it
            unverified.append(D.episode_label(meta.episode_id, int(i)))
    if unverified:
        raise UnverifiedStoreError(reader.path, unverified, len(indices))


def store_episodes(reader: EpisodeReader, indices: Sequence[int], *, block_mb: int = 256) -> Iterator[Episode]:
    """Episodes `indices` of a store, read in blocks of consecutive episodes of up to `block_mb` (one
    `reader.steps` call per block: reading episode by episode costs about as much as writing them). A damaged
    episode raises `StoreDamageError` once the episodes before it are handed out."""
    indices = [int(i) for i in indices]
    if not indices:
        return
    step_bytes = max(1, sum(int(np.prod(shape)) * dtype.itemsize for shape, dtype in reader.specs.values()))
    limit = max(1, (block_mb << 20) // step_bytes)
    i = 0
    while i < len(indices):
        lo, j = int(reader.starts[indices[i]]), i + 1
        while j < len(indices) and indices[j] == indices[j - 1] + 1 and reader.ends[indices[j]] - lo <= limit:
            j += 1
        try:
            block = reader.steps(lo, int(reader.ends[indices[j - 1]]))
        except StoreDamageError:  # episode by episode: those before the damaged one are handed out, it raises
            if j - i == 1:
                raise
            for k in indices[i:j]:
                yield reader.episode(k)
            i = j
            continue
        for k in indices[i:j]:
            a, b = int(reader.starts[k]) - lo, int(reader.ends[k]) - lo
            yield Episode({key: value[a:b] for key, value in block.items()}, reader.meta(k))
        i = j


class ZarrEpisodeReader(EpisodeReader):
    """Read-only view of the complete episodes (an uncommitted tail is ignored, not repaired).

    Every read of whole episodes is checked against the checksums recorded with them (`stores.checksums`;
    a read of part of an episode reads and checks the whole episode): a missing chunk, one that cannot be
    decoded, or data that differs raises `StoreDamageError` naming the store, the episode and the array.
    Episodes recorded without checksums (by older code) are read as they are: `verified(i)` is False. From the
    episode on which the store records checksums (`stores.checksum_record`), a missing checksum is damage too.
    `verify=False` skips the checksums (for measuring their cost); chunks that fail to decode still raise.
    """

    def __init__(self, path: str | os.PathLike, *, verify: bool = True) -> None:
        self.path = Path(path)
        if not (self.path / ".zgroup").exists():
            raise FileNotFoundError(f"{self.path} is not a zarr store (no .zgroup)")
        root = zarr.open_group(str(self.path), mode="r")
        self._data = dict(root["data"].arrays()) if "data" in root else {}
        meta = root["meta"]
        arrays = dict(meta.arrays())
        self._meta = {name: arrays[name] for name in S.EPISODE_FIELDS if name in arrays}
        sums = arrays.get(C.ARRAY)
        try:
            record = (read_record(self.path, root.attrs.asdict(), sums, sums.attrs.asdict() if sums is not None else None)
                      if verify else ChecksumRecord(None))
        except ValueError as exc:
            raise ValueError(f"{self.path}: {exc}") from None
        self.record_problems = dict(record.problems)  # damage to the record itself (`store_check` reports it)
        ends = self._meta_rows(ENDS, arrays[ENDS], arrays[ENDS].shape[0])
        lengths = [a.shape[0] for a in self._meta.values()]
        # a store with checksums is written by commits that grow every array at once: its shapes are the truth
        # (a damaged episode_ends entry is reported, not a reason to show fewer episodes)
        if (record.writes_checksums or C.ARRAY in arrays) and self._data:
            n = min([len(ends), *lengths])
        else:
            n = committed_episodes(ends, [a.shape[0] for a in self._data.values()] or [0], lengths)
        self.ends = ends[:n].astype(np.int64) if self._data else ends[:0].astype(np.int64)
        self.starts = np.concatenate([[0], self.ends[:-1]]).astype(np.int64)
        self._meta_cache = {name: self._meta_rows(name, array, len(self.ends)) for name, array in self._meta.items()}
        columns = record.columns if record.lost is None else []
        table = np.full((len(self.ends), len(columns)), C.NO_CHECKSUM, np.int64)
        if columns:
            rows = self._meta_rows(C.ARRAY, sums, min(len(self.ends), sums.shape[0]))
            table[: len(rows)] = rows
        self._sums = {column: table[:, c] for c, column in enumerate(columns)}  # column -> per-episode checksums
        self._lost = sorted(f"data/{k}" for k in self._sums if k != C.META and k not in self._data)
        first = first_checked(self._sums.get(C.META, [])) if record.inferred else record.from_episode
        self._unsummed = self._missing_checksums(first, record.lost, sums, table)
        self._meta_ok: set[int] = set()
        self._loaded: dict[str, np.ndarray] = {}

    def _missing_checksums(self, first: int | None, lost: str | None, sums: zarr.Array | None,
                           table: np.ndarray) -> dict[int, str]:
        """Episode -> why its checksums are not there, for each episode from `first` on that the store records
        them for and has none (the array or its attributes lost, a chunk missing, the fill value, too few rows)."""
        if first is None or first >= len(self.ends):
            return {}
        if lost is not None:
            return dict.fromkeys(range(first, len(self.ends)), lost)
        out = {}
        for i in (first + np.flatnonzero((table[first:] == C.NO_CHECKSUM).any(axis=1))).tolist():
            if i >= sums.shape[0]:
                out[i] = f"holds {sums.shape[0]} rows, the store {len(self.ends)} episodes: no checksum for this one"
            elif missing := D.missing_chunks(self.path, f"meta/{C.ARRAY}", sums, i, i + 1):
                out[i] = f"chunk {missing[0]} is missing (it reads as 'no checksum' for the episodes it held)"
            else:
                out[i] = "holds no checksum for the episode (the fill value) where the store records them"
        return out

    def _meta_rows(self, name: str, array: zarr.Array, n: int) -> np.ndarray:
        try:
            return array[:n]
        except Exception as exc:  # noqa: BLE001 - a chunk that cannot be decoded is damage, named
            bad = D.bad_chunk(array, 0, n)
            rows = f"#{bad[0]}..#{min(bad[1], n) - 1}" if bad else f"#0..#{n - 1}"
            why = D.undecodable(f"meta/{name}", array, 0, n, exc)
            raise StoreDamageError(self.path, f"every one of episodes {rows}", {f"meta/{name}": why}) from exc

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

    def verified(self, index: int) -> bool:
        """Whether episode `index` has checksums its reads are checked against."""
        sums = self._sums.get(C.META)
        return sums is not None and int(sums[self._index(index)]) != C.NO_CHECKSUM

    def _fields(self, i: int) -> dict:
        out = {}
        for name, dtype in S.EPISODE_FIELDS.items():
            if name in self._meta_cache:  # else: a store written before the field existed: its default
                value = self._meta_cache[name][i]
                out[name] = str(value) if dtype.kind == "U" else value.item()
        return out

    def meta(self, index: int) -> EpisodeMeta:
        i = self._index(index)
        if i not in self._meta_ok:
            self._raise_if_damaged({i: self._meta_problems(i)})
        return EpisodeMeta(**self._fields(i))

    def episode(self, index: int, keys: Sequence[str] | None = None) -> Episode:
        i = self._index(index)
        meta = self.meta(i)  # first: a damaged episode_ends entry would read the wrong rows
        return Episode(self.steps(int(self.starts[i]), int(self.ends[i]), keys), meta)

    def steps(self, lo: int, hi: int, keys: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Step arrays of the store's steps lo..hi-1 (one read per array, across episodes), checked."""
        if not 0 <= lo <= hi <= self.n_steps:
            raise IndexError(f"steps {lo}..{hi} out of range: the store holds {self.n_steps} complete steps")
        if keys is None and self._lost and lo < hi:
            first = int(np.searchsorted(self.ends, lo, "right"))
            self._raise_if_damaged({first: {path: "the array is missing" for path in self._lost}})
        out = {k: self._loaded[k][lo:hi] for k in (keys or self._data) if k in self._loaded}
        todo = [k for k in (keys or self._data) if k not in out]
        if not todo or lo == hi:
            return {**out, **{k: self._data[k][lo:hi] for k in todo}}
        first, last = int(np.searchsorted(self.ends, lo, "right")), int(np.searchsorted(self.ends, hi - 1, "right"))
        problems: dict[int, dict[str, str]] = {i: self._meta_problems(i) for i in range(first, last + 1)
                                               if i not in self._meta_ok}
        for k in todo:
            values, damage = self._rows(k, first, last, lo, hi)
            for i, why in damage.items():
                problems.setdefault(i, {})[f"data/{k}"] = why
            if values is not None:
                out[k] = values
        self._raise_if_damaged(problems)
        return out

    def check(self, first: int, last: int) -> list[EpisodeCheck]:
        """The verdict on episodes first..last (every array read once, each chunk decoded, each checksum compared)."""
        problems: dict[int, dict[str, str]] = {i: dict(self._meta_problems(i)) for i in range(first, last + 1)}
        span = int(self.starts[first]), int(self.ends[last])
        for k in self._data:
            for i, why in self._rows(k, first, last, *span)[1].items():
                problems[i][f"data/{k}"] = why
        ids = self.episode_ids
        out = []
        for i in range(first, last + 1):
            problems[i].update({path: "the array is missing" for path in self._lost if self.verified(i)})
            status = D.DAMAGED if problems[i] else D.OK if self.verified(i) else D.UNVERIFIED
            out.append(EpisodeCheck(i, ids[i], status, problems[i]))
        return out

    # -- checks -----------------------------------------------------------------------------------------------
    def _rows(self, key: str, first: int, last: int, lo: int, hi: int) -> tuple[np.ndarray | None, dict[int, str]]:
        """Rows lo..hi-1 of `key` (of episodes first..last, all of whose rows are read when they have checksums)
        and what is wrong with each damaged episode (None for the rows when a chunk cannot be decoded)."""
        array, path = self._data[key], f"data/{key}"
        sums = self._sums.get(key)
        a, b = (int(self.starts[first]), int(self.ends[last])) if sums is not None else (lo, hi)
        try:
            values = array[a:b]
        except Exception as exc:  # noqa: BLE001 - a chunk that cannot be decoded: which episodes?
            if first == last:
                return None, {first: D.undecodable(path, array, a, b, exc)}
            damage = {}
            for i in range(first, last + 1):
                damage.update(self._rows(key, i, i, int(self.starts[i]), int(self.ends[i]))[1])
            return None, damage
        damage: dict[int, str] = {}
        for i in range(first, last + 1):
            want = int(sums[i]) if sums is not None else C.NO_CHECKSUM
            x, y = int(self.starts[i]) - a, int(self.ends[i]) - a
            if want != C.NO_CHECKSUM and (y > len(values) or C.checksum(values[x:y]) != want):
                damage[i] = D.mismatch(self.path, path, array, x + a, y + a, len(values[x:y]))
            elif i in self._unsummed and (missing := D.missing_chunks(self.path, path, array, x + a, y + a)):
                damage[i] = f"chunk {', '.join(missing)} is missing (read as zeros)"  # unchecked, but told
        return values[lo - a:hi - a], damage

    def _meta_problems(self, i: int) -> dict[str, str]:
        """What is wrong with episode i's fields and its `episode_ends` entry (empty when nothing, or unchecked), or
        that its checksums are missing where the store records them."""
        if i in self._unsummed:
            return {f"meta/{C.ARRAY}": self._unsummed[i]}
        sums = self._sums.get(C.META)
        if sums is None or int(sums[i]) == C.NO_CHECKSUM:
            self._meta_ok.add(i)
            return {}
        fields = self._fields(i)
        problems = {}
        if C.episode_meta_checksum(fields) != int(sums[i]):
            problems[D.FIELDS] = "checksum mismatch: the episode's fields (meta/<field>) differ from what was recorded"
        span = int(self.ends[i] - self.starts[i])
        if span != fields.get(S.LENGTH, span):
            problems[f"meta/{ENDS}"] = f"spans {span} steps, the episode's length is {fields[S.LENGTH]}"
        if not problems:
            self._meta_ok.add(i)
        return problems

    def _raise_if_damaged(self, problems: dict[int, dict[str, str]]) -> None:
        damaged = sorted(i for i, p in problems.items() if p)
        if damaged:
            i = damaged[0]
            ids = self._meta_cache.get(S.EPISODE_ID)
            label = D.episode_label(str(ids[i]) if ids is not None else "?", i)
            raise StoreDamageError(self.path, label, problems[i])
