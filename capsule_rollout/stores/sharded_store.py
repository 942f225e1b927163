"""Sharded episode stores: one zarr shard per writer process under one store root, and a manifest.

Layout of a store root:

    <root>/manifest.jsonl       what is in the store, in order (`stores.shard_manifest`)
    <root>/shards/<name>.zarr   one shard per writer process: a zarr format 2 store in the layout of
                                `stores.zarr_recorder`, written by a `ZarrRecorder`

Each writer process (a Ray actor, or the driver's own process without Ray) appends complete episodes
to its own shard with `ShardWriter` (the recorder's commit: atomic per episode, safe against a killed
process) and hands back a `ManifestEntry`; the driver's `ShardedStore.commit(entry)` appends it to the
manifest, the moment the episode becomes part of the store. Only entries cross to the driver, never the
images. A shard's name is new for every writer process (`<prefix>-<host>-<pid>-<random>`), so a shard
never has two writers, also when Ray restarts an actor on another node, or before its old process is
gone, and a resumed run writes new shards beside the old ones.

Exactly once: the manifest names an episode id at most once (the driver never commits an id it holds).
An actor killed after writing an episode to its shard but before the driver committed the entry leaves
an orphan: readers do not see it (they read only what the manifest names) and the driver runs the
episode again, which lands in another shard and is committed there; a resumed driver runs what the
manifest lacks, orphans included. `orphans()` lists them; nothing deletes them (a shard is only ever
appended to by its own writer).

The store root is a path or a `file://` URL (`parse_store_root`), so that a root on a shared filesystem
can be named the same way on every node; other schemes are refused.
"""

from __future__ import annotations

import os
import re
import socket
import uuid
from pathlib import Path
from urllib.parse import unquote, urlsplit

from capsule_rollout.stores.episode import Episode
from capsule_rollout.stores.shard_manifest import (
    MANIFEST_FILE,
    SHARD_NAME,
    ManifestEntry,
    ManifestError,
    ManifestWriter,
    create_manifest,
    read_manifest,
)
from capsule_rollout.stores.zarr_reader import ZarrEpisodeReader
from capsule_rollout.stores.zarr_recorder import RecorderError, ZarrRecorder

SHARDS_DIR = "shards"
SHARD_SUFFIX = ".zarr"
SCHEMES = ("file",)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):(//)?")


class UnsupportedStoreError(ValueError):
    """A store location names a scheme this code cannot write to or read from."""


def parse_store_root(location: str | os.PathLike) -> Path:
    """The local path of a store location: a plain path, or `file:///abs/path` (`file://localhost/...`,
    `file:relative/path`). Any other scheme (`s3://`, `gs://`, `http://`...) raises UnsupportedStoreError."""
    if isinstance(location, os.PathLike):
        return Path(location)
    text = str(location)
    if not text:
        raise ValueError("empty store location: give a path or a file:// URL")
    match = _SCHEME.match(text)
    if match is None or not (match.group(2) or match.group(1).lower() in SCHEMES):
        return Path(text)
    scheme = match.group(1).lower()
    if scheme not in SCHEMES:
        raise UnsupportedStoreError(
            f"store location {text!r}: scheme {scheme!r} is not supported; stores live on a local or shared "
            "filesystem: give a path or a file:///absolute/path URL (mount the storage on every node)")
    parts = urlsplit(text)
    if parts.netloc not in ("", "localhost"):
        raise UnsupportedStoreError(
            f"store location {text!r} names host {parts.netloc!r}; a file URL names a path on this machine: "
            f"file:///absolute/path (three slashes) or a plain path")
    if parts.query or parts.fragment or not parts.path:
        raise UnsupportedStoreError(f"store location {text!r}: a file URL is file:///path, without ?query or #fragment")
    return Path(unquote(parts.path))


def is_sharded_store(location: str | os.PathLike) -> bool:
    """Whether `location` is the root of a sharded store (it holds a manifest)."""
    return (parse_store_root(location) / MANIFEST_FILE).is_file()


def shard_path(root: Path, shard: str) -> Path:
    return root / SHARDS_DIR / f"{shard}{SHARD_SUFFIX}"


def new_shard_name(prefix: str) -> str:
    """A shard name no other writer process uses: `<prefix>-<host>-<pid>-<random>`."""
    host = re.sub(r"[^A-Za-z0-9.-]+", "-", socket.gethostname()).strip("-.")[:40] or "host"
    name = f"{prefix}-{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    if not SHARD_NAME.match(name):
        raise ValueError(f"shard prefix {prefix!r} makes the name {name!r}; use letters, digits, '.', '_', '-'")
    return name


class ShardedStore:
    """The driver's side of a sharded store: makes the root, commits manifest entries, says what is in it.

    One driver at a time (the manifest is locked while this is open).
    """

    def __init__(self, location: str | os.PathLike) -> None:
        self.root = Path(os.path.abspath(parse_store_root(location)))
        manifest = self.root / MANIFEST_FILE
        if (self.root / ".zgroup").exists():
            raise ValueError(f"{self.root} is a single-writer zarr store, not a sharded store root: record to it "
                             "without shards, or choose another location")
        if not manifest.exists():
            if self.root.exists() and (not self.root.is_dir() or any(self._foreign(p) for p in self.root.iterdir())):
                raise ValueError(f"{self.root} exists and is not a sharded store (no {MANIFEST_FILE}): choose a new "
                                 "or empty directory")
            self.root.mkdir(parents=True, exist_ok=True)
            create_manifest(manifest)
        (self.root / SHARDS_DIR).mkdir(exist_ok=True)
        self._manifest = ManifestWriter(manifest)
        self.torn_bytes = self._manifest.torn_bytes  # an uncommitted manifest tail cut on opening

    @staticmethod
    def _foreign(path: Path) -> bool:
        """Whether `path` in a root without a manifest is more than a creation killed before its manifest."""
        leftover = path.name.startswith(f".{MANIFEST_FILE}.") and path.name.endswith(".partial")
        return not (leftover or (path.name == SHARDS_DIR and path.is_dir() and not any(path.iterdir())))

    @property
    def shard_root(self) -> str:
        """The root writers open their shards under (an absolute path: the same on every node of a shared
        filesystem)."""
        return str(self.root)

    def __contains__(self, episode_id: str) -> bool:
        return episode_id in self._manifest

    def __len__(self) -> int:
        return len(self._manifest)

    def commit(self, entry: ManifestEntry) -> None:
        """Make a written episode part of the store (its shard must exist; ids are unique)."""
        self.commit_many([entry])

    def commit_many(self, entries: list[ManifestEntry]) -> None:
        """Make written episodes part of the store with one manifest append and fsync (all or none refused)."""
        for shard in {entry.shard for entry in entries}:
            if not shard_path(self.root, shard).is_dir():
                named = next(e.episode_id for e in entries if e.shard == shard)
                raise ManifestError(f"episode {named!r} names shard {shard!r}, which is not in "
                                    f"{self.root / SHARDS_DIR}: the writer and the driver see different store roots?")
        self._manifest.commit_many(entries)

    def outcomes(self) -> dict[str, bool]:
        """Episode id -> success of every committed episode (a resumed run walks past these)."""
        return {e.episode_id: e.success for e in self._manifest.entries.values()}

    def orphans(self) -> list[tuple[str, int, str]]:
        """(shard, index, episode id) of every episode a shard holds and the manifest does not name.

        Only while no writer is running (a shard being written may show an episode about to be committed).
        """
        named = {(e.shard, e.index) for e in self._manifest.entries.values()}
        found = []
        for path in sorted((self.root / SHARDS_DIR).glob(f"*{SHARD_SUFFIX}")):
            shard = path.name.removesuffix(SHARD_SUFFIX)
            if not (path / ".zgroup").exists():
                continue  # a writer killed while creating it: nothing committed
            ids = ZarrEpisodeReader(path).episode_ids
            found += [(shard, i, episode_id) for i, episode_id in enumerate(ids) if (shard, i) not in named]
        return found

    def close(self) -> None:
        self._manifest.close()

    def __enter__(self) -> ShardedStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ShardWriter:
    """One writer process's shard: `write(episode)` appends a complete episode and returns its entry.

    The shard is made at the first write. An episode id written before by this writer is not written
    again: its entry is returned (the driver may ask again after losing an answer).
    """

    def __init__(self, location: str | os.PathLike, prefix: str = "w") -> None:
        self.root = parse_store_root(location)
        if not (self.root / MANIFEST_FILE).is_file():
            raise ValueError(f"{self.root} is not a sharded store root (no {MANIFEST_FILE}); the driver makes it")
        self.name = new_shard_name(prefix)
        self.path = shard_path(self.root, self.name)
        self._recorder: ZarrRecorder | None = None
        self._written: dict[str, ManifestEntry] = {}

    def write(self, episode: Episode) -> ManifestEntry:
        """Append `episode` to the shard and wait for its commit; the entry for the driver to commit."""
        return self.write_many([episode])[0]

    def write_many(self, episodes: list[Episode]) -> list[ManifestEntry]:
        """Append `episodes` to the shard in one commit and wait for it; their entries, in order."""
        new = [e for e in episodes if e.meta.episode_id not in self._written]
        if new:
            if self._recorder is None:
                self._recorder = ZarrRecorder(self.path, batch_window=0.0)
            index = self._recorder.committed
            self._recorder.write_many(new)
            self._recorder.flush()
            if self._recorder.committed != index + len(new):
                raise RecorderError(f"{self.path}: episodes {new[0].meta.episode_id!r}... were not committed as "
                                    f"episodes {index}...")
            for i, episode in enumerate(new):
                meta = episode.meta
                self._written[meta.episode_id] = ManifestEntry(meta.episode_id, self.name, index + i,
                                                               int(meta.length), bool(meta.success))
        return [self._written[e.meta.episode_id] for e in episodes]

    def close(self) -> None:
        if self._recorder is not None:
            self._recorder.close()


def manifest_entries(location: str | os.PathLike) -> tuple[ManifestEntry, ...]:
    """The committed entries of a sharded store, in order (ManifestError when the manifest is damaged)."""
    return read_manifest(parse_store_root(location) / MANIFEST_FILE).entries


def recorded_outcomes(store: Path) -> dict[str, bool]:
    """Episode id -> success of what a store already holds (a resumed run walks past these)."""
    if not store.exists():
        return {}
    if is_sharded_store(store):  # the manifest says it all: no shard is opened
        return {e.episode_id: e.success for e in manifest_entries(store)}
    reader = ZarrEpisodeReader(store)
    return {reader.meta(i).episode_id: bool(reader.meta(i).success) for i in range(len(reader))}


def open_recorder(store: Path, shards: bool) -> ZarrRecorder | ShardedStore:
    """The run's recorder: a single zarr store, or a sharded store root (`--shards true`); a resumed store
    must be of the kind asked for."""
    if shards:
        return ShardedStore(store)  # refuses a single store
    if is_sharded_store(store):
        raise ValueError(f"{store} is a sharded store: resume it with --shards true (or use another --out)")
    return ZarrRecorder(store)
