"""`read_record`: whether a zarr store writes checksums, and from which episode on, read from every place that
says so, and what is wrong with what says so.

Three witnesses (`stores.checksums`): the root group's attribute `checksums`, the attributes of `meta/checksums`
(its column names and the same first episode) and the commit directory, which lists every array the recorder
committed (`stores.zarr_commit`). Any one of them is enough: a store loses its checksums silently only when all
three go. A store that none of them names was recorded before checksums existed: its episodes are unverified.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from capsule_rollout.stores import checksums as C
from capsule_rollout.stores.zarr_commit import ShapeCommit

ARRAY_PATH = f"meta/{C.ARRAY}"
RECORD_FILE = ".zattrs"  # the root group's attributes


@dataclass(frozen=True)
class ChecksumRecord:
    """What a store says about its checksums.

    `from_episode`: every episode from this one on has checksums; None: the store records none (legacy), or
    (`inferred`) a store written before the record existed, whose first checked episode is its table's first
    row holding a checksum. `lost`: why the checksums of those episodes cannot be read at all (the array or its
    column names are gone); `problems`: damage to the record that loses no checksum (one copy of it).
    """

    from_episode: int | None
    columns: list[str] = field(default_factory=list)
    lost: str | None = None
    problems: dict[str, str] = field(default_factory=dict)
    inferred: bool = False

    @property
    def writes_checksums(self) -> bool:
        return self.from_episode is not None or self.inferred


def read_record(path: Path, root_attrs: Mapping, array, array_attrs: Mapping | None) -> ChecksumRecord:
    """The record of the store at `path`: its root attributes, `meta/checksums` (None: absent) and the array's
    attributes. Raises ValueError for checksums of another algorithm (a newer version's)."""
    root = root_attrs.get(C.RECORD)
    root_from = C.from_episode_of(root) if root is not None else None
    if root is not None and root_from is None:
        root_from = 0  # a record that cannot say its first episode still says the store writes checksums
    listed = ShapeCommit(path).lists(ARRAY_PATH)
    if array is None:
        if root_from is not None:
            return ChecksumRecord(root_from, lost=f"the array is missing (the store records checksums of episodes "
                                  f"#{root_from} on in its {RECORD_FILE})")
        if listed:
            return ChecksumRecord(0, lost="the array is missing (the store's commit directory lists it)")
        return ChecksumRecord(None)
    attrs = dict(array_attrs or {})
    if not attrs:
        first = root_from if root_from is not None else 0
        return ChecksumRecord(first, lost=f"its attributes ({ARRAY_PATH}/.zattrs: the column names) are missing")
    columns = C.columns_of(attrs)  # another algorithm: ValueError
    array_from = C.from_episode_of(attrs)
    problems = {}
    if array_from is None and root_from is None:  # written before the record existed
        return ChecksumRecord(None, columns, inferred=True)
    if root_from is None:
        problems[RECORD_FILE] = (f"the record that the store writes checksums is missing ({ARRAY_PATH}'s attributes "
                                 f"still hold it: episodes #{array_from} on)")
    elif array_from is not None and array_from != root_from:
        problems[RECORD_FILE] = (f"the record says episodes #{root_from} on have checksums, {ARRAY_PATH}'s "
                                 f"attributes #{array_from} on (both are checked from the first)")
    first = min(v for v in (root_from, array_from) if v is not None)
    return ChecksumRecord(first, columns, problems=problems)


def first_checked(meta_column: np.ndarray) -> int:
    """The first episode of a table's `meta` column holding a checksum (its length when none does)."""
    held = np.flatnonzero(np.asarray(meta_column) != C.NO_CHECKSUM)
    return int(held[0]) if len(held) else len(meta_column)
