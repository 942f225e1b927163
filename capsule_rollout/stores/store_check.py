"""`check_store`: every episode of a store read back and checked against its checksums, one verdict each.

Reads a single zarr store, a sharded store, a LeRobot v3.0 export or a directory of npz episodes, and
changes nothing. Each episode is `ok`, `damaged` (each damaged array and why) or `unverified` (recorded
without checksums, and every chunk it needs could be decoded); damage that is not one episode's (a
manifest, a metadata file, a chunk of a per-episode field) is the store's. Nothing is repaired: a
store keeps each chunk once, so no damaged data can be rebuilt from verified data.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from capsule_rollout.stores import store_damage as D
from capsule_rollout.stores.episode import EpisodeError
from capsule_rollout.stores.npz_recorder import INDEX_FILE, read_index, read_npz_episode, says_listed
from capsule_rollout.stores.shard_manifest import MANIFEST_FILE, ManifestError
from capsule_rollout.stores.sharded_reader import open_episode_reader
from capsule_rollout.stores.sharded_store import is_sharded_store, parse_store_root
from capsule_rollout.stores.store_damage import EpisodeCheck, StoreDamageError

ZARR, SHARDED, LEROBOT, NPZ = "zarr", "sharded", "lerobot", "npz"
NO_REPAIR = ("nothing repaired: a store keeps each chunk and file once, so damaged data cannot be rebuilt from "
             "verified data; restore the damaged episodes from a copy of the store or record them again")


@dataclass
class StoreReport:
    store: Path
    kind: str  # zarr, sharded, lerobot or npz
    episodes: list[EpisodeCheck] = field(default_factory=list)
    problems: dict[str, str] = field(default_factory=dict)  # damage that is the store's, not one episode's

    def count(self, status: str) -> int:
        return sum(check.status == status for check in self.episodes)

    @property
    def damaged(self) -> bool:
        return bool(self.problems) or self.count(D.DAMAGED) > 0

    def to_dict(self) -> dict:
        return {"store": str(self.store), "kind": self.kind, "episodes": len(self.episodes),
                **{status: self.count(status) for status in (D.OK, D.DAMAGED, D.UNVERIFIED)},
                "store_problems": self.problems, "repair": NO_REPAIR if self.damaged else "nothing to repair",
                "verdicts": [check.to_dict() for check in self.episodes]}


def store_kind(root: Path) -> str:
    """Which kind of store `root` is, or FileNotFoundError saying what a store looks like."""
    if (root / "meta" / "info.json").is_file():
        return LEROBOT
    if is_sharded_store(root):
        return SHARDED
    if (root / ".zgroup").is_file():
        return ZARR
    if root.is_dir() and ((root / INDEX_FILE).is_file() or any(root.glob("*.npz"))):
        return NPZ
    raise FileNotFoundError(f"{root} is not an episode store: not a zarr store (no .zgroup), a sharded store (no "
                            f"{MANIFEST_FILE}), a LeRobot dataset (no meta/info.json) or a directory of .npz episodes")


def check_store(location: str | os.PathLike, *, on_checked: Callable[[int], None] | None = None,
                block_mb: int = 256) -> StoreReport:
    """Check every episode of the store at `location`; `on_checked(n)` after each n episodes."""
    root = parse_store_root(location)
    report = StoreReport(root, store_kind(root))
    tick = on_checked or (lambda n: None)
    try:
        if report.kind == LEROBOT:
            _check_lerobot(report, tick)
        elif report.kind == NPZ:
            _check_npz(report, tick)
        else:
            _check_zarr(report, tick, block_mb)
    except StoreDamageError as exc:  # the store cannot be opened: its damage is every episode's
        report.problems.update({array: f"{exc.episode}: {why}" for array, why in exc.problems.items()})
    except ManifestError as exc:
        report.problems[MANIFEST_FILE] = str(exc)
    return report


def _check_zarr(report: StoreReport, tick: Callable[[int], None], block_mb: int) -> None:
    reader = open_episode_reader(report.store)
    report.problems.update(reader.record_problems)
    step_bytes = max(1, sum(int(np.prod(shape)) * dtype.itemsize for shape, dtype in reader.specs.values()))
    limit = max(1, (block_mb << 20) // step_bytes)
    first = 0
    while first < len(reader):
        last = first
        while last + 1 < len(reader) and reader.ends[last + 1] - reader.starts[first] <= limit:
            last += 1
        report.episodes += reader.check(first, last)
        tick(last - first + 1)
        first = last + 1


def _check_lerobot(report: StoreReport, tick: Callable[[int], None]) -> None:
    from capsule_rollout.stores.lerobot_format import LeRobotFormatError
    from capsule_rollout.stores.lerobot_reader import LeRobotDatasetReader

    reader = LeRobotDatasetReader(report.store)
    try:
        for i in range(len(reader)):
            try:
                reader.episode(i)
                check = EpisodeCheck(i, reader.episode_id(i), D.OK if reader.verified else D.UNVERIFIED)
            except StoreDamageError as exc:
                check = EpisodeCheck(i, reader.episode_id(i), D.DAMAGED, exc.problems)
            except (LeRobotFormatError, EpisodeError) as exc:  # what a damaged unverified dataset can raise
                check = EpisodeCheck(i, reader.episode_id(i), D.DAMAGED, {"episode": str(exc)})
            report.episodes.append(check)
            tick(1)
    finally:
        reader.close()
    report.problems.update(reader.checksums.damaged_files())


def _check_npz(report: StoreReport, tick: Callable[[int], None]) -> None:
    """npz files keep a CRC-32 of every array (zip): reading one whole checks it; the directory's list
    (`episodes.jsonl`) names each file it holds with its size and CRC-32C, so a missing one is damage."""
    index = read_index(report.store)
    files = {p.name: p for p in report.store.glob("*.npz") if not p.name.startswith(".")}
    listed = index.entries if index is not None else {}
    if index is not None:
        report.problems.update(index.problems)
    elif any(says_listed(p) for p in files.values()):
        report.problems[INDEX_FILE] = ("the list of the directory's episodes is missing (its episode files say it "
                                       "lists them): a deleted episode file cannot be told")
    for i, name in enumerate(sorted(set(files) | set(listed))):
        path, entry = report.store / name, listed.get(name)
        episode_id = entry["episode_id"] if entry else path.stem
        why = index.check(path) if entry else None
        if why is not None:
            report.episodes.append(EpisodeCheck(i, episode_id, D.DAMAGED, {name: why}))
            tick(1)
            continue
        try:
            read_npz_episode(path)
            unlisted = entry is None and index is not None and says_listed(path)
            check = (EpisodeCheck(i, episode_id, D.UNVERIFIED, {INDEX_FILE: f"does not list {name} (a recorder killed "
                                  "before listing it, or its line was deleted: the next recorder lists it)"})
                     if unlisted else EpisodeCheck(i, episode_id, D.OK))
        except StoreDamageError as exc:
            check = EpisodeCheck(i, episode_id, D.DAMAGED, exc.problems)
        report.episodes.append(check)
        tick(1)
