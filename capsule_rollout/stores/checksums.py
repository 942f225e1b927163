"""Checksums of recorded episodes: CRC-32C (Castagnoli) of each step array's bytes and of the episode's fields.

A store keeps, per episode, one checksum per step array (the C-order bytes of the episode's rows of
`data/<key>`, as written) and one of its per-episode fields (`episode_meta_checksum`); readers
recompute them and refuse what differs (`stores.store_damage`). CRC-32C detects damage (a flipped
bit, a chunk that reads back as zeros), not tampering; it runs at several GB/s on one core
(`google_crc32c`, which zarr itself depends on, with the CPU's CRC instruction).

In a zarr store they are one per-episode array beside the fields, `meta/checksums` (int64, one row per
episode, one column per step array and `meta` for the fields, the column names in its attributes;
`NO_CHECKSUM` for an episode recorded without), written and committed with the episode's other rows.
One array rather than one per column: each zarr array costs every append a write and the commit a
metadata file, which cost more than the hashing.

A store records that it writes checksums, and from which episode on (`from_episode`: 0, or the episodes an
older version recorded before): in the root group's attributes (`RECORD`), in the array's attributes, and
by the commit directory listing the array (`stores.zarr_commit`). From that episode on a checksum that is
not there (the fill value, a missing chunk, the array or its attributes removed) is damage, not
"unverified": no single deletion can turn a store's checked episodes into unchecked ones.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import google_crc32c
import numpy as np

from capsule_rollout.stores import episode_schema as S

ALGORITHM = "crc32c"
ARRAY = "checksums"  # meta/checksums: (episodes, columns) int64
META = "meta"  # the column of an episode's per-episode fields (no step array has this name)
NO_CHECKSUM = -1  # an episode recorded without checksums: unverified
RECORD = "checksums"  # the root group's attribute saying the store writes checksums (`record`)
FROM_EPISODE = "from_episode"  # the first episode recorded with checksums (in the record and the array's attributes)
_BLOCK = 16 << 20


def checksum(values: np.ndarray) -> int:
    """CRC-32C of an array's C-order bytes."""
    return google_crc32c.value(np.ascontiguousarray(values).view(np.uint8).reshape(-1))


def attributes(columns: list[str], from_episode: int) -> dict:
    """The attributes of a `meta/checksums` array with these columns, its episodes `from_episode...` checked."""
    return {"algorithm": ALGORITHM, "columns": list(columns), FROM_EPISODE: int(from_episode)}


def record(from_episode: int) -> dict:
    """The root attribute (`RECORD`) of a store that records checksums of its episodes `from_episode...`."""
    return {"algorithm": ALGORITHM, "array": f"meta/{ARRAY}", FROM_EPISODE: int(from_episode)}


def from_episode_of(attrs: Mapping) -> int | None:
    """The first checked episode a record or the array's attributes name (None: they name none)."""
    value = attrs.get(FROM_EPISODE) if isinstance(attrs, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def columns_of(attrs: Mapping) -> list[str]:
    """The column names of a `meta/checksums` array, or ValueError for checksums this code cannot read."""
    if attrs.get("algorithm") != ALGORITHM or not isinstance(attrs.get("columns"), list):
        raise ValueError(f"meta/{ARRAY} holds {attrs.get('algorithm')!r} checksums of columns {attrs.get('columns')!r}; "
                         f"this code reads {ALGORITHM}: read the store with the version that wrote it")
    return [str(c) for c in attrs["columns"]]


def episode_meta_checksum(fields: Mapping[str, object]) -> int:
    """CRC-32C of an episode's per-episode fields as stored (strings, numbers, booleans).

    A field holding its empty value ("" or 0, what a store back-fills for a field added after the episode
    was recorded) is left out, so adding a field to the schema keeps every recorded checksum valid.
    """
    lines = []
    for name in sorted(S.EPISODE_FIELDS):
        value = fields.get(name, "")
        if isinstance(value, np.generic):
            value = value.item()
        if value in ("", 0):  # False == 0
            continue
        lines.append(f"{name}={int(value) if isinstance(value, bool) else value}")
    return google_crc32c.value("\n".join(lines).encode("utf-8", "surrogatepass"))


def file_checksum(path: str | os.PathLike) -> tuple[int, int]:
    """(CRC-32C, size in bytes) of a file, read in blocks."""
    crc, size = 0, 0
    with open(Path(path), "rb") as f:
        while block := f.read(_BLOCK):
            crc = google_crc32c.extend(crc, block)
            size += len(block)
    return crc, size
