"""`ZarrRecorder`: episodes appended to one zarr store, off the caller's thread, crash-safe.

Layout (zarr format 2, diffusion_policy's replay-buffer layout): `data/<key>`
time-major arrays of all steps, `meta/episode_ends` (int64, cumulative step counts)
and flat per-episode arrays `meta/<field>` (see `stores.episode_schema`).

Commit protocol: the writer gathers episodes for up to `batch_window` seconds (or
until `flush`) and appends them as one batch (one write per array; zarr's per-call
cost is milliseconds). It writes the batch's rows past the current end of every
array (data, per-episode metadata, `episode_ends`), where no reader looks, and then
grows every array's shape at once with one rename (`stores.zarr_commit`): that
rename is the commit. A process killed at any point leaves the store with the
episodes before the batch or with all of them, for every reader (this project's,
plain zarr 2 or 3, diffusion_policy's `ReplayBuffer`, which wants every data array
exactly `episode_ends[-1]` long). Episodes handed over but not yet committed are
not in the store; `flush()` is the durability point. Reopening removes what a kill
left (temp files, rows past the shapes are overwritten by the next append) and
truncates an uncommitted tail of a store written by an older version of this code.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numcodecs
import numpy as np
import zarr

from capsule_rollout.stores import checksums as C
from capsule_rollout.stores import episode_schema as S
from capsule_rollout.stores.checksum_record import first_checked, read_record
from capsule_rollout.stores.episode import Episode, EpisodeError, validate_episode
from capsule_rollout.stores.store_damage import StoreDamageError
from capsule_rollout.stores.writer_lock import WriterLock
from capsule_rollout.stores.zarr_commit import ShapeCommit, write_rows

ENDS = "episode_ends"
IMAGE_CHUNK_BYTES = 1 << 20  # about 85 frames of 64x64x3 per chunk
LOWDIM_CHUNK_STEPS = 4096
CHUNK_BYTES = 16 << 20
"""At most this much per chunk of any other array: an env's own observation can be a picture (gym-aloha's
480x640, 900 KB a step: 4096 steps would pass the codec's 2 GiB limit) or a long flat vector holding one
(robosuite's `GymWrapper`)."""
META_CHUNK = 1024
MAX_BATCH = 64  # most writes (`write_many` groups) appended together


class RecorderError(RuntimeError):
    """The writer thread failed; episodes committed before the failure are intact."""


@dataclass(frozen=True)
class RepairReport:
    episodes: int  # complete episodes in the store
    dropped_steps: int  # uncommitted steps truncated from data arrays
    dropped_meta: int  # uncommitted per-episode entries truncated
    partial_files: int  # leftover temp files removed


def committed_episodes(ends: np.ndarray, data_lengths: list[int], meta_lengths: list[int]) -> int:
    """How many leading episodes are complete: increasing ends backed by data and metadata."""
    limit = min(data_lengths, default=0)
    n, prev = 0, 0
    for end in ends:
        if end <= prev or end > limit:
            break
        n, prev = n + 1, int(end)
    return min([n, *meta_lengths])


def _compressor(dtype: np.dtype) -> numcodecs.abc.Codec:
    shuffle = numcodecs.Blosc.NOSHUFFLE if dtype.itemsize == 1 else numcodecs.Blosc.SHUFFLE
    return numcodecs.Blosc(cname="zstd", clevel=3, shuffle=shuffle)


class ZarrRecorder:
    """Appends validated episodes on a writer thread; `flush()` waits for them.

    Validation (schema, shapes against the store, duplicate ids) happens in the
    caller, so a bad episode raises at once and never reaches the store.
    """

    def __init__(self, path: str | os.PathLike, *, max_pending: int = 256, batch_window: float = 0.5,
                 checksums: bool = True) -> None:
        self.path = Path(path)
        self.checksums = checksums  # False: episodes recorded unverified (`NO_CHECKSUM`), to measure their cost
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock = WriterLock(self.path, "zarr store")  # a second writer is refused, naming this one
        try:
            self._open(max_pending, batch_window)
        except BaseException:
            self._lock.release()
            raise

    def _open(self, max_pending: int, batch_window: float) -> None:
        self.root = zarr.open_group(str(self.path), mode="a", zarr_format=2)
        self._data = self.root.require_group("data")
        self._meta = self.root.require_group("meta")
        if ENDS not in self._meta:
            self._meta.create_array(ENDS, shape=(0,), chunks=(LOWDIM_CHUNK_STEPS,), dtype=np.int64,
                                    compressors=None, fill_value=0)
        self._handles: dict = {}
        self._shapes = ShapeCommit(self.path)
        self.repair_report = self._repair()
        self._data_keys = {k for k, _ in self._data.arrays()}
        self._meta_keys = {k for k, _ in self._meta.arrays()}
        self._n_episodes = self.repair_report.episodes
        self._sum_columns = self._checksum_columns()  # None: the store has no checksums yet
        self._n_steps = int(self._meta[ENDS][self._n_episodes - 1]) if self._n_episodes else 0
        self._keys: dict[str, tuple] | None = (
            {k: tuple(a.shape[1:]) for k, a in self._data.arrays()} if self._n_episodes else None
        )
        ids = self._meta[S.EPISODE_ID][: self._n_episodes] if S.EPISODE_ID in self._meta else []
        self._ids: set[str] = {str(i) for i in ids}
        # text columns of a store made with narrower ones than the schema's (an earlier version): what fits
        self._widths = {name: a.dtype.itemsize // 4 for name, a in self._meta.arrays()
                        if name in S.EPISODE_FIELDS and a.dtype.kind == "U"
                        and a.dtype.itemsize < S.EPISODE_FIELDS[name].itemsize}
        self._queue: queue.Queue[Episode | None] = queue.Queue(maxsize=max_pending)
        self._error: BaseException | None = None
        self.batch_window = batch_window  # seconds the writer gathers episodes into one append
        self._hurry = threading.Event()
        self._closed = False
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="zarr-io")
        self._thread = threading.Thread(target=self._run, name=f"zarr-writer:{self.path.name}", daemon=True)
        self._thread.start()

    # -- caller side --------------------------------------------------------------
    def write(self, episode: Episode) -> None:
        """Validate and enqueue; returns without waiting for the disk."""
        self.write_many([episode])

    def write_many(self, episodes: list[Episode]) -> None:
        """Validate every episode, then enqueue them to be committed together (one commit, unless more than
        the writer's batch limit); none is enqueued if one is invalid."""
        self._raise_if_failed()
        if self._closed:
            raise RecorderError("the recorder is closed")
        keys, checked, ids = self._keys, [], set()
        for episode in episodes:
            episode = validate_episode(episode, expect_keys=keys)
            episode_id = episode.meta.episode_id
            if episode_id in self._ids or episode_id in ids:
                raise EpisodeError(f"episode {episode_id!r} is already in {self.path}; ids are unique")
            for name, width in self._widths.items():
                if len(getattr(episode.meta, name)) > width:
                    raise EpisodeError(
                        f"episode {episode_id!r}: its {name} is {len(getattr(episode.meta, name))} characters; "
                        f"{self.path} was made with a {name} column of {width} (an earlier version): record to a "
                        "new store (another --out), nothing was written")
            keys = keys or {k: tuple(v.shape[1:]) for k, v in episode.steps.items()}
            checked.append(episode)
            ids.add(episode_id)
        if not checked:
            return
        self._keys = keys
        self._ids.update(ids)
        self._queue.put(checked)

    def flush(self) -> None:
        """Wait until every enqueued episode is committed (or the writer failed)."""
        self._hurry.set()
        try:
            self._queue.join()
        finally:
            self._hurry.clear()
        self._raise_if_failed()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._hurry.set()
        self._queue.put(None)
        self._thread.join()
        self._pool.shutdown()
        self._lock.release()
        self._raise_if_failed()

    def __enter__(self) -> ZarrRecorder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __contains__(self, episode_id: str) -> bool:
        return episode_id in self._ids

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    @property
    def committed(self) -> int:
        """Episodes whose `episode_ends` entry is written."""
        return self._n_episodes

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RecorderError(
                f"writing to {self.path} failed ({type(self._error).__name__}: {self._error}); "
                f"the {self._n_episodes} episodes committed before are intact"
            ) from self._error

    # -- writer thread ------------------------------------------------------------
    def _run(self) -> None:
        while True:
            batch = self._next_batch()
            stop = batch[-1] is None
            episodes = [ep for group in batch if group is not None for ep in group]
            try:
                if episodes and self._error is None:
                    self._append(episodes)
            except BaseException as exc:  # noqa: BLE001 - reported to the caller
                self._error = exc
                try:
                    self._repair()  # drop the uncommitted tail
                except Exception:  # noqa: BLE001 - reopening repairs as well
                    pass
                self._lock.release()  # this recorder writes nothing more: another may open the store
            finally:
                for _ in batch:
                    self._queue.task_done()
            if stop:
                return

    def _next_batch(self) -> list[list[Episode] | None]:
        """The next group of episodes (one `write_many`) plus whatever arrives within `batch_window` (sooner on
        flush/close)."""
        batch = [self._queue.get()]
        deadline = time.monotonic() + self.batch_window
        while batch[-1] is not None and len(batch) < MAX_BATCH:
            wait = 0.0 if self._hurry.is_set() else deadline - time.monotonic()
            try:
                batch.append(self._queue.get(timeout=max(0.0, min(wait, 0.05))) if wait > 0 else self._queue.get_nowait())
            except queue.Empty:
                if wait <= 0:
                    break
        return batch

    def _array(self, group, name: str):
        """Cached array handle (a group lookup re-reads metadata from disk)."""
        key = f"{group.basename}/{name}"
        if key not in self._handles:
            self._handles[key] = group[name]
        return self._handles[key]

    def _append(self, episodes: list[Episode]) -> None:
        """Append a batch: data arrays, then metadata, then all its episode ends at once.

        Arrays are written concurrently (each zarr call waits on zarr's IO loop;
        issuing them together overlaps that wait); the commit comes after all of them.
        """
        start = self._n_steps
        total = sum(ep.length for ep in episodes)
        n, k = self._n_episodes, len(episodes)
        for key in episodes[0].steps:
            if key not in self._data_keys:
                self._create_data_array(key, episodes[0].steps[key])
        for name, dtype in S.EPISODE_FIELDS.items():
            if name not in self._meta_keys:
                # a field newer than the store: back-filled with its default for the n episodes already
                # there, so the store's committed count never drops (an empty column would read as 0)
                fill = "" if dtype.kind == "U" else 0
                self._meta.create_array(name, shape=(n,), chunks=(META_CHUNK,), dtype=dtype, fill_value=fill,
                                        compressors=_compressor(dtype))
                self._shapes.adopt([f"meta/{name}"])
                self._meta_keys.add(name)
        if self.checksums and self._sum_columns is None:
            self._create_checksum_array([C.META, *sorted(episodes[0].steps)], n)
        writes = [
            (self._array(self._data, key), start, np.concatenate([ep.steps[key] for ep in episodes]))
            for key in episodes[0].steps
        ]
        fields = {name: np.array([getattr(ep.meta, name) for ep in episodes], dtype=dtype)
                  for name, dtype in S.EPISODE_FIELDS.items()}
        writes += [(self._array(self._meta, name), n, values) for name, values in fields.items()]
        futures = [self._pool.submit(write_rows, *w) for w in writes]
        if self._sum_columns is not None:  # hashed on this thread while the pool compresses and writes
            futures.append(self._pool.submit(write_rows, self._array(self._meta, C.ARRAY), n,
                                             self._checksum_rows(episodes, fields)))
        for future in futures:
            future.result()  # re-raises a failed write before anything is committed
        self._commit(n, start + np.cumsum([ep.length for ep in episodes]))
        self._n_episodes, self._n_steps = n + k, start + total

    def _commit(self, index: int, ends: np.ndarray) -> None:
        """Write the ends of episodes `index...`, then grow every array over the new rows in one rename:
        the moment the episodes become part of the store."""
        ends_array = self._array(self._meta, ENDS)
        write_rows(ends_array, index, ends)
        n, n_steps = index + len(ends), int(ends[-1])
        shapes = {f"data/{key}": (n_steps, *self._array(self._data, key).shape[1:]) for key in self._data_keys}
        shapes.update({f"meta/{name}": (n,) for name in S.EPISODE_FIELDS})
        shapes[f"meta/{ENDS}"] = (n,)
        if self._sum_columns is not None:
            shapes[f"meta/{C.ARRAY}"] = (n, len(self._sum_columns))
        self._shapes.commit(shapes)

    def _checksum_rows(self, episodes: list[Episode], fields: dict[str, np.ndarray]) -> np.ndarray:
        """The batch's rows of `meta/checksums`: each episode's step arrays as written (the bytes in hand) and its
        fields as stored; `NO_CHECKSUM` where this recorder writes none."""
        rows = np.full((len(episodes), len(self._sum_columns)), C.NO_CHECKSUM, np.int64)
        if not self.checksums:
            return rows
        for j, episode in enumerate(episodes):
            for c, column in enumerate(self._sum_columns):
                if column == C.META:
                    rows[j, c] = C.episode_meta_checksum({name: values[j] for name, values in fields.items()})
                elif column in episode.steps:
                    rows[j, c] = C.checksum(episode.steps[column])
        return rows

    def _create_checksum_array(self, columns: list[str], n: int) -> None:
        """`meta/checksums`, `NO_CHECKSUM` for the n episodes already in the store (recorded without), and the
        record that the store writes checksums from episode n on. The record first: a creation cut short leaves a
        record that no committed episode needs (episodes from n on), and the array is made again (overwritten)."""
        self.root.attrs.update({C.RECORD: C.record(n)})
        self._meta.create_array(C.ARRAY, shape=(n, len(columns)), chunks=(META_CHUNK, len(columns)), dtype=np.int64,
                                fill_value=C.NO_CHECKSUM, compressors=_compressor(np.dtype(np.int64)),
                                attributes=C.attributes(columns, n), overwrite=True)
        self._shapes.adopt([f"meta/{C.ARRAY}"])
        self._meta_keys.add(C.ARRAY)
        self._sum_columns = columns

    def _checksum_columns(self) -> list[str] | None:
        """The store's checksum columns (None: it records no checksums yet). A store whose record is damaged so
        that appending would hide it is refused; a lost copy of the record is written again from the other; a
        store written before the record existed gets one (its first episode holding a checksum)."""
        sums = self._meta[C.ARRAY] if C.ARRAY in self._meta_keys else None
        record = read_record(self.path, self.root.attrs.asdict(), sums, sums.attrs.asdict() if sums is not None else None)
        if record.lost is not None and record.from_episode < self._n_episodes:
            raise StoreDamageError(self.path, f"every episode from #{record.from_episode} on", {
                f"meta/{C.ARRAY}": f"{record.lost}; appending would record the next episodes beside episodes whose "
                "checksums are lost: restore the store from a copy, or record to a new store"})
        if not record.writes_checksums:
            return None
        if not self.checksums:
            raise ValueError(f"{self.path} records checksums of its episodes; a recorder with checksums=False would "
                             "add episodes without: record them to another store")
        if record.lost is not None:  # the array's creation cut short: no committed episode has checksums yet
            return None
        first = record.from_episode
        if record.inferred:
            first = first_checked(sums[: self._n_episodes, record.columns.index(C.META)])
            sums.attrs.update({C.FROM_EPISODE: first})
        if record.inferred or record.problems:
            self.root.attrs.update({C.RECORD: C.record(first)})
        return record.columns

    def _create_data_array(self, key: str, values: np.ndarray):
        row_bytes = values[0].nbytes if len(values) else 1
        if key.startswith(S.IMAGE_PREFIX):
            chunk = int(np.clip(IMAGE_CHUNK_BYTES // max(row_bytes, 1), 1, 1024))
        else:
            chunk = int(np.clip(CHUNK_BYTES // max(row_bytes, 1), 1, LOWDIM_CHUNK_STEPS))
        shape = (0, *values.shape[1:])
        self._data.create_array(key, shape=shape, chunks=(chunk, *values.shape[1:]), dtype=values.dtype,
                                fill_value=0, compressors=_compressor(values.dtype))
        self._shapes.adopt([f"data/{key}"])
        self._data_keys.add(key)

    def _repair(self) -> RepairReport:
        """Adopt every array into the commit directory, then cut whatever the last committed
        `episode_ends` entry does not cover (only a store written by older code has such a tail)."""
        self._handles.clear()  # shapes change below; drop cached handles
        data = dict(self._data.arrays())
        meta_all = dict(self._meta.arrays())
        self._shapes.adopt([f"data/{k}" for k in data] + [f"meta/{k}" for k in meta_all])
        ends = meta_all[ENDS][:]
        meta = {name: meta_all[name] for name in S.EPISODE_FIELDS if name in meta_all}
        n = committed_episodes(ends, [a.shape[0] for a in data.values()] or [0], [a.shape[0] for a in meta.values()])
        if not data:
            n = 0
        n_steps = int(ends[n - 1]) if n else 0
        dropped_steps = max((a.shape[0] - n_steps for a in data.values()), default=0)
        dropped_meta = max((a.shape[0] - n for a in meta.values()), default=0)
        shapes = {f"data/{k}": (n_steps, *a.shape[1:]) for k, a in data.items() if a.shape[0] != n_steps}
        shapes.update({f"meta/{k}": (n,) for k, a in meta.items() if a.shape[0] != n})
        sums = meta_all.get(C.ARRAY)  # cut like the rest; unverified rows where a writer added none
        if sums is not None and sums.shape[0] != n:
            write_rows(sums, sums.shape[0], np.full((max(0, n - sums.shape[0]), sums.shape[1]), C.NO_CHECKSUM, np.int64))
            shapes[f"meta/{C.ARRAY}"] = (n, sums.shape[1])
        if meta_all[ENDS].shape[0] != n:
            shapes[f"meta/{ENDS}"] = (n,)
        if shapes:
            self._shapes.commit(shapes)
        self._shapes.clean()
        partial = list(self.path.rglob("*.partial"))
        for p in partial:
            p.unlink(missing_ok=True)
        return RepairReport(n, dropped_steps, dropped_meta, len(partial))
