"""The manifest of a sharded episode store: which episodes are in the store, and where each one lies.

A sharded store (`stores.sharded_store`) keeps its episodes in several zarr shards, one per writer
process; the manifest is the store's single source of truth: an episode is in the store exactly when
a manifest line names it, and readers see the episodes in manifest order. An episode a shard holds
that no line names (an orphan: its actor died after writing it, before the driver committed it) is
not in the store.

Format: `manifest.jsonl`, UTF-8 JSON lines. The first line is a header
`{"format": "stores.sharded_store", "version": 1}`; each further line is one entry
`{"episode_id", "shard", "index", "length", "success"}` (the episode's shard, its index among the
shard's committed episodes, its step count and outcome; the last two let a resumed run walk past
recorded episodes without opening a shard).

Why JSON lines, appended: one writer (the driver) appends one line per episode with a single
`write` on an `O_APPEND` descriptor and `fsync`s it. A line is committed once its newline is on disk;
a process killed mid-append leaves at most an unterminated tail, which readers ignore and the next
writer cuts off. So a crash loses at most the entry being written, never one before it, and never
leaves a half entry visible. It stays one small file that `cat`, `tail -f` and `wc -l` read (one file
per entry, renamed into place, is as safe but makes thousands of files, slow to list on shared
filesystems). A complete line that is not a valid entry is damage, not a crash: reading refuses the
manifest with the file, line number and content, and nothing rewrites it. The writer holds an
exclusive `flock` on the file, so a second driver on the same store is refused. Durability is that of
the shards: the manifest's `fsync` keeps the manifest whole across a power loss, but a shard's zarr
commit is made safe against a killed process (a rename), not flushed to disk.

The manifest carries what it holds: after each append the writer replaces `manifest.count.json` (temp
file, fsync, rename) with the number of committed entries, their bytes' CRC-32C and the last entry, and
the header names that file. A manifest shorter than its count (the last entry deleted: its episode would
vanish from the store, an orphan in its shard) or whose counted bytes differ (an entry edited or deleted)
is refused naming the count and the last entry; a manifest longer than its count is a driver killed
between its append and the count's rename, and the entries past the count are committed. A count file
missing where the header names one is refused too by readers; the next driver writes it again (to drop
an entry on purpose: delete its line and the count file, then resume). Manifests written before the
count existed (no key in their header) read as before and get a count from their next driver.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import google_crc32c

MANIFEST_FILE = "manifest.jsonl"
COUNT_FILE = "manifest.count.json"  # what the manifest holds: entries, their bytes' CRC-32C, the last entry
COUNT_KEY = "count"  # the header's key naming the count file
FORMAT = "stores.sharded_store"
VERSION = 1
SHARD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_FIELDS = {"episode_id": str, "shard": str, "index": int, "length": int, "success": bool}


class ManifestError(ValueError):
    """A manifest cannot be read or written as it is; the message says where and what to do."""


@dataclass(frozen=True)
class ManifestEntry:
    """One committed episode: `episode_id` is episode `index` of shard `shard` (`length` steps)."""

    episode_id: str
    shard: str
    index: int
    length: int
    success: bool

    def to_line(self) -> bytes:
        return (json.dumps(asdict(self), separators=(",", ":"), ensure_ascii=False) + "\n").encode()


def _header_line() -> bytes:
    return (json.dumps({"format": FORMAT, "version": VERSION, COUNT_KEY: COUNT_FILE}) + "\n").encode()


def parse_entry(text: str) -> ManifestEntry:
    """An entry from one manifest line, or ValueError saying what is wrong with it."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if set(data) != set(_FIELDS):
        raise ValueError(f"fields {sorted(data)}, expected {sorted(_FIELDS)}")
    for name, kind in _FIELDS.items():
        value = data[name]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):  # JSON true is no index
            raise ValueError(f"{name} must be a {kind.__name__}, got {value!r}")
    if not data["episode_id"]:
        raise ValueError("empty episode_id")
    if not SHARD_NAME.match(data["shard"]):
        raise ValueError(f"shard {data['shard']!r} is not a shard name")
    if data["index"] < 0 or data["length"] < 1:
        raise ValueError(f"index {data['index']} must be >= 0 and length {data['length']} >= 1")
    return ManifestEntry(**data)


@dataclass(frozen=True)
class Manifest:
    """A manifest as read: its committed entries in order, and the bytes of an unterminated tail."""

    path: Path
    entries: tuple[ManifestEntry, ...]
    torn_bytes: int  # an append cut short by a crash: not committed, ignored
    committed_bytes: int  # the file's length up to the last complete line
    crc32c: int  # of the committed bytes


def read_manifest(path: str | os.PathLike, *, require_count: bool = True) -> Manifest:
    """Read and check a manifest against its count (`COUNT_FILE`); a damaged one raises ManifestError (the file
    is left as it is). `require_count=False`: a count file that is missing is no error (the writer writes it)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ManifestError(f"{path} not found: not a sharded episode store (or its manifest was removed)") from None
    end = raw.rfind(b"\n") + 1
    lines = raw[:end].split(b"\n")[:-1]
    if not lines:
        raise ManifestError(f"{path} has no header line: a sharded store's manifest starts with one; it is "
                            "empty or was cut short while being created (remove the store root and record again)")
    try:
        header = json.loads(lines[0])
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ManifestError(f"{path} line 1 is not a {FORMAT} header: {lines[0][:120]!r}")
    if header.get("version") != VERSION:
        raise ManifestError(f"{path} is version {header.get('version')!r}; this code reads version {VERSION}")
    entries, ids, places = [], set(), set()
    for number, line in enumerate(lines[1:], start=2):
        try:
            entry = parse_entry(line.decode())
            if entry.episode_id in ids:
                raise ValueError(f"episode {entry.episode_id!r} is named twice")
            if (entry.shard, entry.index) in places:
                raise ValueError(f"episode {entry.index} of shard {entry.shard!r} is named twice")
        except ValueError as exc:  # json's, decode's and parse_entry's errors alike
            raise ManifestError(
                f"{path} line {number} is not a valid manifest entry ({exc}): {line[:160]!r}. The {number - 2} "
                "entries before it are intact and nothing was changed; restore that line from a copy of the store "
                f"(or, to drop the episode it named, delete the line and {COUNT_FILE}, then resume the run: the "
                "episode stays in its shard, unnamed, and the run records it again)") from None
        ids.add(entry.episode_id)
        places.add((entry.shard, entry.index))
        entries.append(entry)
    _check_count(path, header.get(COUNT_KEY) == COUNT_FILE and require_count, raw[:end], entries)
    return Manifest(path, tuple(entries), len(raw) - end, end, google_crc32c.value(raw[:end]))


def _check_count(path: Path, required: bool, committed: bytes, entries: list[ManifestEntry]) -> None:
    """Refuse a manifest that holds fewer entries than its count, or whose counted bytes differ."""
    count_path = path.with_name(COUNT_FILE)
    try:
        count = json.loads(count_path.read_bytes())
        n, size, crc = count["entries"], count["bytes"], count["crc32c"]
        if not all(isinstance(v, int) for v in (n, size, crc)):
            raise TypeError(f"entries, bytes and crc32c must be integers, got {n!r}, {size!r}, {crc!r}")
    except FileNotFoundError:
        if required and entries:
            raise ManifestError(
                f"{count_path} is missing: the manifest's header says it counts the {len(entries)} entries (without it "
                "a deleted entry cannot be told); nothing was changed: restore it from a copy of the store, or resume "
                "the run (its driver counts the entries anew)") from None
        return
    except (ValueError, KeyError, TypeError) as exc:
        raise ManifestError(f"{count_path} cannot be read ({type(exc).__name__}: {exc}); nothing was changed: restore "
                            "it from a copy of the store, or delete it and resume the run") from None
    last = count.get("last") if isinstance(count.get("last"), dict) else {}
    if n > len(entries) or size > len(committed):
        lost = last.get("episode_id") not in {e.episode_id for e in entries}
        named = (f", the last of them episode {last.get('episode_id')!r} (episode {last.get('index')} of shard "
                 f"{last.get('shard')!r}), which no entry names now" if lost else "")
        raise ManifestError(
            f"{path} holds {len(entries)} entries; {COUNT_FILE} says {n} were committed{named}: entries were deleted "
            "(or the manifest replaced by an older copy). Their episodes are still in their shards; nothing was "
            "changed: restore the manifest from a copy of the store")
    if google_crc32c.value(committed[:size]) != crc:
        raise ManifestError(
            f"{path}: its first {n} entries ({size} bytes) differ from what was committed ({COUNT_FILE}'s checksum): "
            "an entry was edited or deleted; nothing was changed: restore the manifest from a copy of the store")


def write_count(path: Path, entries: int, committed: int, crc: int, last: ManifestEntry | None) -> None:
    """Replace the count file beside manifest `path` (temp file, fsync, rename)."""
    count = {"entries": entries, "bytes": committed, "crc32c": crc, "last": asdict(last) if last else None}
    count_path = path.with_name(COUNT_FILE)
    tmp = count_path.with_name(f".{count_path.name}.{os.getpid()}.partial")
    with open(tmp, "wb") as f:
        f.write(json.dumps(count).encode() + b"\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, count_path)


def create_manifest(path: Path) -> None:
    """Write a manifest holding only its header, atomically (temp file, fsync, rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    with open(tmp, "wb") as f:
        f.write(_header_line())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    write_count(path, 0, len(_header_line()), google_crc32c.value(_header_line()), None)
    _fsync_dir(path.parent)


class ManifestWriter:
    """The one appender of a manifest: `commit(entry)` makes an episode part of the store.

    Opening takes an exclusive lock (a second writer gets ManifestError), reads and checks every line,
    and cuts an unterminated tail left by a crash.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise ManifestError(f"{self.path} is being written by another process (a driver still running on "
                                "this store?); one driver records to a store at a time") from None
        try:
            manifest = read_manifest(self.path, require_count=False)
            if manifest.torn_bytes:
                os.ftruncate(self._fd, manifest.committed_bytes)
                os.fsync(self._fd)
            self._bytes, self._crc = manifest.committed_bytes, manifest.crc32c
            self._last = manifest.entries[-1] if manifest.entries else None
            write_count(self.path, len(manifest.entries), self._bytes, self._crc, self._last)
        except BaseException:
            os.close(self._fd)
            raise
        self.torn_bytes = manifest.torn_bytes  # cut on opening
        self.entries: dict[str, ManifestEntry] = {e.episode_id: e for e in manifest.entries}

    def __contains__(self, episode_id: str) -> bool:
        return episode_id in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def commit(self, entry: ManifestEntry) -> None:
        """Append `entry` and fsync: when this returns, the episode is in the store."""
        self.commit_many([entry])

    def commit_many(self, entries: list[ManifestEntry]) -> None:
        """Append `entries` in one write and one fsync (a group commit): when this returns, every one is in the
        store. All are checked first; none is appended if one is refused."""
        if self._fd < 0:
            raise ManifestError(f"{self.path}: the manifest writer is closed")
        group: set[str] = set()
        lines = []
        for entry in entries:
            if entry.episode_id in self.entries or entry.episode_id in group:
                raise ManifestError(f"episode {entry.episode_id!r} is already in {self.path}; ids are unique")
            group.add(entry.episode_id)
            lines.append(entry.to_line())
            parse_entry(lines[-1].decode())  # the line must read back as this entry
        if not entries:
            return
        data = b"".join(lines)
        lines = memoryview(data)
        while lines:
            lines = lines[os.write(self._fd, lines):]
        os.fsync(self._fd)
        for entry in entries:
            self.entries[entry.episode_id] = entry
        self._bytes, self._crc, self._last = self._bytes + len(data), google_crc32c.extend(self._crc, data), entries[-1]
        write_count(self.path, len(self.entries), self._bytes, self._crc, self._last)  # after the commit point

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # releases the lock
            self._fd = -1


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
