"""`CapsuleStore`: capsules by key in three tiers, device -> host -> disk.

Each tier has a byte budget (None = unbounded). When a tier is over budget its
least recently used unpinned capsule is demoted to the next tier (device -> host
memory, pinned when CUDA is present -> a safetensors file); past the last tier it
is dropped. `get` rehydrates a capsule to the device tier. Pinned capsules stay
in the device tier and are never demoted or dropped.

A capsule loaded from the disk tier keeps its file (capsules never change), so it
is then in two tiers and its file counts against the disk budget; demoted again,
it reuses that file instead of writing it anew. Over the disk budget, the least
recently used file goes: a capsule that was only on disk is dropped, one also held
in memory just loses its disk copy. A file that cannot be read is set aside as
`*.corrupt` (at open, or when it is loaded) and its key forgotten.

Opening a store on a directory (the scan) trusts a file only as far as the
store's `key` can vouch for it. With a key (the user's, by default) a file that
claims a key (its `store_key` annotation) is indexed only once its signature
checks with that key, so whoever can drop a file into the directory cannot make
the store hand it out, replace a rightful capsule with it, or have its word
delete anything: a file that fails (unsigned, signed with another key, damaged)
is set aside as `*.corrupt` and listed in `skipped_files`. Two verified files
claiming one key both came from a key holder: the one created later by its
signed metadata (`created_at`; then the larger file name) is indexed, the other
set aside as `*.duplicate`. With `key=None` there is nothing to verify: the scan
takes each header's word for its key and creation time (use it only on a
directory nobody else can write: what it indexes is then handed out, and over
budget evicted, as the store's own), yet sets files aside the same way. Either way a
scan renames but never deletes a file, and does not trim the disk tier to its
budget: the next `put` or `get` does, least recently modified file first.

On a CPU-only machine the device and host tiers are both host RAM: the budgets
still apply, a demotion just does not move bytes.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from capsule_rollout.capsules.capsule import Capsule
from capsule_rollout.capsules.capsule_file import (
    FILE_SUFFIX,
    USER_KEY,
    _resolved,
    _verify_signature,
    load_capsule,
    nbytes_from_header,
    parse_meta,
    read_file_header,
    read_header,
    save_capsule,
)
from capsule_rollout.capsules.errors import (
    CapsuleError,
    CapsuleFormatError,
    CapsuleNotFoundError,
    StoreBudgetError,
)
from capsule_rollout.capsules.trust import Trust


class Tier(str, Enum):
    DEVICE = "device"
    HOST = "host"
    DISK = "disk"


_NEXT = {Tier.DEVICE: Tier.HOST, Tier.HOST: Tier.DISK, Tier.DISK: None}

CORRUPT_SUFFIX = ".corrupt"  # a file refused: unreadable, damaged, or not signed with the store's key
DUPLICATE_SUFFIX = ".duplicate"  # a verified file whose key a later-created verified file holds


@dataclass
class StoreStats:
    """Counters since the store was made, and what each tier holds now."""

    hits: dict[str, int] = field(default_factory=lambda: {t.value: 0 for t in Tier})
    misses: int = 0
    evictions: dict[str, int] = field(default_factory=lambda: {t.value: 0 for t in Tier})  # demoted out of tier
    dropped: int = 0  # forgotten for lack of a lower tier
    rehydrations: int = 0  # promoted back to the device tier
    bytes: dict[str, int] = field(default_factory=lambda: {t.value: 0 for t in Tier})
    entries: dict[str, int] = field(default_factory=lambda: {t.value: 0 for t in Tier})
    pinned: int = 0

    def to_dict(self) -> dict:
        return {
            "hits": dict(self.hits),
            "misses": self.misses,
            "evictions": dict(self.evictions),
            "dropped": self.dropped,
            "rehydrations": self.rehydrations,
            "bytes": dict(self.bytes),
            "entries": dict(self.entries),
            "pinned": self.pinned,
        }


@dataclass
class _Entry:
    key: str
    tier: Tier  # the fastest tier holding the capsule
    nbytes: int  # bytes in that tier: slab bytes in the device/host tiers, the file's size in the disk tier
    pinned: bool = False
    capsule: Capsule | None = None  # in memory (device or host tier)
    path: Path | None = None  # a disk copy: the only copy (tier DISK) or one kept after loading it
    file_bytes: int = 0  # size of the disk copy


@dataclass(frozen=True)
class _Claim:
    """A file found by the scan that names a store key, with what the scan knows of it."""

    path: Path
    key: str  # its `store_key` annotation
    created_at: float  # from its metadata: signed when the store has a key
    mtime: float  # the file's, for the LRU order only (anyone who can write the file can set it)
    size: int


class CapsuleStore:
    """Keyed capsules with per-tier budgets, pinning and LRU demotion.

    `key` signs the disk tier's files and is what the store trusts them by: a file is read back (by `get`, and
    indexed when the store opens on a directory) only when its signature checks with it, so a file dropped into
    the directory by anyone without the key is never handed out and never displaces a capsule (see the module
    docstring). The default, `USER_KEY`, is the user's key (`capsules.signing_key`). `key=None` writes unsigned
    files and reads any well-formed one: the store then trusts whoever can write its directory, the scan taking
    each file's header at its word (still never deleting on it).
    """

    def __init__(
        self,
        *,
        device_bytes: int | None = None,
        host_bytes: int | None = None,
        disk_dir: str | os.PathLike | None = None,
        disk_bytes: int | None = None,
        pin_host_memory: bool | None = None,
        key: Any = USER_KEY,
    ) -> None:
        for name, value in (("device_bytes", device_bytes), ("host_bytes", host_bytes), ("disk_bytes", disk_bytes)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"{name} must be a non-negative int or None (unbounded), got {value!r}")
        if disk_bytes is not None and disk_dir is None:
            raise ValueError("disk_bytes needs disk_dir: set the directory the disk tier writes to")
        self._budget = {Tier.DEVICE: device_bytes, Tier.HOST: host_bytes, Tier.DISK: disk_bytes}
        self._disk_dir = Path(disk_dir) if disk_dir is not None else None
        self._key = key  # the disk tier's files are signed with it and read only when signed with it (the user's)
        self._pin_host = torch.cuda.is_available() if pin_host_memory is None else pin_host_memory
        self._entries: dict[str, _Entry] = {}
        self._lru: dict[Tier, OrderedDict[str, None]] = {t: OrderedDict() for t in Tier}
        self._bytes: dict[Tier, int] = {t: 0 for t in Tier}
        self._stats = StoreStats()
        self._lock = threading.RLock()
        # Files found on open and not indexed, with why (refused, duplicate, or not a store's): see _scan_disk.
        self.skipped_files: list[tuple[Path, str]] = []
        if self._disk_dir is not None:
            self._disk_dir.mkdir(parents=True, exist_ok=True)
            self._scan_disk()

    # -- queries ------------------------------------------------------------------
    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[str]:
        return list(self._entries)

    def tier_of(self, key: str) -> Tier:
        return self._entry(key).tier

    def is_pinned(self, key: str) -> bool:
        return self._entry(key).pinned

    def lru_order(self, tier: Tier) -> list[str]:
        """Keys of one tier, least recently used first."""
        return list(self._lru[tier])

    def stats(self) -> StoreStats:
        """A copy of the counters, with the bytes and entries each tier holds now."""
        with self._lock:
            s = self._stats
            return StoreStats(
                hits=dict(s.hits),
                misses=s.misses,
                evictions=dict(s.evictions),
                dropped=s.dropped,
                rehydrations=s.rehydrations,
                bytes={t.value: self._bytes[t] for t in Tier},
                entries={t.value: len(self._lru[t]) for t in Tier},
                pinned=sum(e.pinned for e in self._entries.values()),
            )

    # -- verbs --------------------------------------------------------------------
    def put(self, key: str, capsule: Capsule, *, pin: bool = False) -> None:
        """Store `capsule` under `key` in the device tier (replacing any old entry)."""
        if not isinstance(key, str) or not key:
            raise ValueError(f"store keys are non-empty strings, got {key!r}")
        if not isinstance(capsule, Capsule):
            raise TypeError(f"put() takes a Capsule, got {type(capsule).__name__}")
        with self._lock:
            if pin:
                self._check_pin_budget(capsule.nbytes, exclude=key)
            if key in self._entries:
                self._discard(self._entries[key])
            entry = _Entry(key, Tier.DEVICE, 0, pin, capsule.to_devices())
            self._entries[key] = entry
            self._place(entry, Tier.DEVICE, capsule.nbytes)
            self._enforce()

    def get(self, key: str) -> Capsule:
        """The capsule under `key`, rehydrated to the device tier (counts hit or miss)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self._stats.misses += 1
                close = difflib.get_close_matches(str(key), list(self._entries), n=3)
                hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
                raise CapsuleNotFoundError(f"no capsule under key {key!r}{hint}")
            self._stats.hits[entry.tier.value] += 1
            if entry.tier is Tier.DEVICE:
                self._lru[Tier.DEVICE].move_to_end(key)
                return entry.capsule
            capsule = self._promote(entry)
            self._enforce()
            return capsule

    def pin(self, key: str) -> None:
        """Keep `key` in the device tier for good (rehydrating it if needed)."""
        with self._lock:
            entry = self._entry(key)
            if entry.pinned:
                return
            if entry.capsule is not None:
                nbytes = entry.capsule.nbytes
            else:
                nbytes = self._read_file(entry, lambda path: nbytes_from_header(read_file_header(path), str(path)))
            self._check_pin_budget(nbytes, exclude=key)
            if entry.tier is not Tier.DEVICE:
                self._promote(entry)
            entry.pinned = True
            self._enforce()

    def unpin(self, key: str) -> None:
        with self._lock:
            self._entry(key).pinned = False
            self._enforce()

    def remove(self, key: str) -> None:
        with self._lock:
            self._discard(self._entry(key))

    # -- internals ----------------------------------------------------------------
    def _entry(self, key: str) -> _Entry:
        try:
            return self._entries[key]
        except KeyError:
            raise CapsuleNotFoundError(f"no capsule under key {key!r}") from None

    def _check_pin_budget(self, nbytes: int, exclude: str) -> None:
        budget = self._budget[Tier.DEVICE]
        if budget is None:
            return
        pinned = sum(e.nbytes for e in self._entries.values() if e.pinned and e.key != exclude)  # device tier
        if pinned + nbytes > budget:
            raise StoreBudgetError(
                f"pinning needs {pinned + nbytes} device-tier bytes ({pinned} already pinned + {nbytes}) "
                f"but the device budget is {budget}; raise device_bytes or unpin capsules"
            )

    def _place(self, entry: _Entry, tier: Tier, nbytes: int) -> None:
        """Move `entry` (already in _entries) to the most-recent end of memory tier `tier`, or to disk only."""
        self._leave_memory(entry)
        entry.tier, entry.nbytes = tier, nbytes
        if tier is Tier.DISK:
            self._lru[Tier.DISK].move_to_end(entry.key)
        else:
            self._lru[tier][entry.key] = None
            self._bytes[tier] += nbytes

    def _leave_memory(self, entry: _Entry) -> None:
        if entry.tier is not Tier.DISK and self._lru[entry.tier].pop(entry.key, 0) is None:
            self._bytes[entry.tier] -= entry.nbytes

    def _add_file(self, entry: _Entry, path: Path, size: int | None = None) -> None:
        entry.path, entry.file_bytes = path, path.stat().st_size if size is None else size
        self._lru[Tier.DISK][entry.key] = None
        self._bytes[Tier.DISK] += entry.file_bytes

    def _drop_file(self, entry: _Entry, *, unlink: bool = True) -> None:
        if entry.path is None:
            return
        if unlink:
            entry.path.unlink(missing_ok=True)
        if self._lru[Tier.DISK].pop(entry.key, 0) is None:
            self._bytes[Tier.DISK] -= entry.file_bytes
        entry.path, entry.file_bytes = None, 0

    def _read_file(self, entry: _Entry, read):
        """`read(path)` of the entry's file; an unusable file is set aside and the key forgotten."""
        try:
            return read(entry.path)
        except (CapsuleError, OSError):
            # Unusable file: keep it aside for inspection, forget the key; the caller rebuilds the capsule.
            _set_aside(entry.path)
            self._drop_file(entry, unlink=False)
            self._forget(entry)
            raise

    def _promote(self, entry: _Entry) -> Capsule:
        if entry.tier is Tier.DISK:
            # without a key the store trusts whoever can write its directory (class docstring): its files are its own
            capsule = self._read_file(entry, lambda path: load_capsule(path, key=self._key, trust=Trust.OWN))
            self._lru[Tier.DISK].move_to_end(entry.key)  # the file is kept: demoted again, it is reused
        else:
            capsule = entry.capsule
        entry.capsule = capsule.to_devices()
        self._place(entry, Tier.DEVICE, capsule.nbytes)
        self._stats.rehydrations += 1
        return entry.capsule

    def _demote(self, entry: _Entry) -> None:
        source = entry.tier
        self._stats.evictions[source.value] += 1
        target = _NEXT[source]
        if target is Tier.HOST:
            entry.capsule = entry.capsule.to_host(pin_memory=self._pin_host)
            self._place(entry, Tier.HOST, entry.capsule.nbytes)
        elif target is Tier.DISK and self._disk_dir is not None:
            if entry.path is None:
                self._add_file(entry, save_capsule(entry.capsule, self._path_for(entry.key),
                                                   annotations={"store_key": entry.key}, key=self._key))
            entry.capsule = None
            self._place(entry, Tier.DISK, entry.file_bytes)
        else:
            self._stats.dropped += 1
            self._discard(entry)

    def _enforce(self) -> None:
        for tier in (Tier.DEVICE, Tier.HOST):
            budget = self._budget[tier]
            while budget is not None and self._bytes[tier] > budget:
                victim = next((k for k in self._lru[tier] if not self._entries[k].pinned), None)
                if victim is None:
                    break  # only pinned capsules left; their total was checked against the budget
                self._demote(self._entries[victim])
        budget = self._budget[Tier.DISK]
        while budget is not None and self._bytes[Tier.DISK] > budget and self._lru[Tier.DISK]:
            entry = self._entries[next(iter(self._lru[Tier.DISK]))]
            self._stats.evictions[Tier.DISK.value] += 1
            if entry.tier is Tier.DISK:  # its only copy
                self._stats.dropped += 1
                self._discard(entry)
            else:  # still held in memory: only the disk copy goes
                self._drop_file(entry)

    def _discard(self, entry: _Entry) -> None:
        self._drop_file(entry)
        self._forget(entry)

    def _forget(self, entry: _Entry) -> None:
        self._leave_memory(entry)
        if self._lru[Tier.DISK].pop(entry.key, 0) is None:
            self._bytes[Tier.DISK] -= entry.file_bytes
        self._entries.pop(entry.key, None)

    def _path_for(self, key: str) -> Path:
        digest = hashlib.sha256(key.encode()).hexdigest()[:24]
        return self._disk_dir / f"{digest}{FILE_SUFFIX}"

    def _scan_disk(self) -> None:
        """Index the capsule files left by an earlier store on this directory, trusting each only as far as
        `self._key` vouches for it (module docstring).

        Renames, never deletes: an unsigned or foreign file may sit next to a rightful one, and a damaged or
        superseded file is kept for inspection. Files that claim no store key are reported and left as they are.
        The disk budget is not enforced here: the next `put` or `get` trims, by the LRU order set here (mtime).
        """
        claims: dict[str, list[_Claim]] = {}
        # Resolved on the first file to verify, once: USER_KEY reads (or makes) the user's key file.
        verify_key = functools.cache(lambda: _resolved(self._key))
        for path in sorted(self._disk_dir.glob(f"*{FILE_SUFFIX}")):
            try:
                claim = self._read_claim(path, verify_key)
            except (CapsuleError, OSError) as exc:
                self._skip(path, str(exc), CORRUPT_SUFFIX)
                continue
            if claim is None:
                self.skipped_files.append((path, "not written by a capsule store (no store_key annotation)"))
                continue
            claims.setdefault(claim.key, []).append(claim)
        kept: list[_Claim] = []
        for key, found in claims.items():
            # Deterministic and not on the word of mtime: the later `created_at` (signed when there is a key),
            # then the larger file name.
            found.sort(key=lambda c: (c.created_at, c.path.name))
            winner = found[-1]
            for loser in found[:-1]:
                self._skip(loser.path, f"another file for store key {key!r}, {winner.path.name}, was created later "
                           f"(created_at {winner.created_at} > {loser.created_at}); kept that one",
                           DUPLICATE_SUFFIX)
            kept.append(winner)
        for claim in sorted(kept, key=lambda c: (c.mtime, c.path.name)):  # least recently modified first
            entry = _Entry(claim.key, Tier.DISK, 0)
            self._entries[claim.key] = entry
            self._add_file(entry, claim.path, claim.size)
            entry.nbytes = entry.file_bytes

    def _read_claim(self, path: Path, verify_key: Callable[[], bytes | str]) -> _Claim | None:
        """The key `path` claims and its creation time, the whole file verified with `self._key` first when the
        store has one; None for a file that claims no key. Raises CapsuleError / OSError for a file to refuse
        (a bad key, `ValueError`, propagates: no file is to blame for it)."""
        source = str(path)
        stat = path.stat()
        if self._key is None:  # nothing to verify with: the header's word (class docstring)
            meta, size = read_file_header(path), stat.st_size
        else:
            data = path.read_bytes()
            meta, size = read_header(data, source), len(data)
        annotations = meta.get("annotations")
        key = annotations.get("store_key") if isinstance(annotations, dict) else None
        if not isinstance(key, str) or not key:
            return None  # nothing is done on its word: left in place
        capsule_meta, _, _ = parse_meta(meta, source)
        if self._key is not None:
            try:
                tensors = safetensors.torch.load(data)
            except Exception as exc:  # the Rust reader raises its own error type
                raise CapsuleFormatError(f"{source}: unreadable tensor data ({exc})") from None
            # The signature covers the `meta` text (key, created_at) and every tensor's bytes: checking it needs
            # the tensors but not the slabs or digests that `load_capsule` builds (`get` checks those).
            _verify_signature(data, tensors, verify_key(), source)
        return _Claim(path, key, capsule_meta.created_at, stat.st_mtime, size)

    def _skip(self, path: Path, reason: str, suffix: str) -> None:
        """Set `path` aside (renamed, never deleted) and report it in `skipped_files`."""
        moved = _set_aside(path, suffix)
        where = f"set aside as {moved.name}" if moved is not None else "could not be renamed; left in place"
        self.skipped_files.append((path, f"{reason} ({where})"))


def _set_aside(path: Path, suffix: str = CORRUPT_SUFFIX) -> Path | None:
    """Rename a capsule file the store will not use to `<name><suffix>` (`*.corrupt`: refused; `*.duplicate`:
    superseded), kept for inspection and never indexed again. A free name is chosen (`<name>.1<suffix>`, ...) so
    an earlier set-aside file is never overwritten. Returns the new path, or None when the rename failed."""
    target = path.with_name(path.name + suffix)
    n = 0
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.{n}{suffix}")
    try:
        path.rename(target)
    except OSError:
        return None
    return target
