"""`StoreDamageError`: recorded data that does not read back as it was written, named by store, episode and
array; `EpisodeCheck`, one episode's verdict; and how a zarr chunk behind a damaged episode is found.

Every reader raises `StoreDamageError` for a missing chunk or file, a chunk that cannot be decoded, or
data whose checksum (`stores.checksums`) differs from the one recorded with it; nothing is rewritten.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI imports this module: it stays standard library only
    import zarr

OK = "ok"
DAMAGED = "damaged"
UNVERIFIED = "unverified"  # recorded before the store had checksums: read as it is
FIELDS = "meta"  # the name of an episode's per-episode fields in a damage report


class UnverifiedStoreError(ValueError):
    """Episodes recorded without checksums given to a command that copies only checked ones (consolidate, export,
    import): a copy would give them checksums of whatever they hold now, damage included."""

    def __init__(self, store: str | os.PathLike, labels: list[str], total: int) -> None:
        self.store, self.labels = Path(store), list(labels)
        shown = ", ".join(self.labels[:3]) + (f" and {len(self.labels) - 3} more" if len(self.labels) > 3 else "")
        super().__init__(
            f"{self.store}: {len(self.labels)} of its {total} episodes were recorded without checksums ({shown}), so "
            "nothing can tell whether they still hold what was recorded, and a copy would certify whatever they "
            "hold; nothing was written: pass --allow_unverified true to copy them as they are")

    def __reduce__(self):
        return type(self), (self.store, self.labels, 0)


class StoreDamageError(ValueError):
    """Recorded data is missing or differs from what was written: `problems` maps each damaged array of
    `episode` (`episode 'id' (#index)`, or a range of episodes when the ids cannot be read) to what is wrong."""

    def __init__(self, store: str | os.PathLike, episode: str, problems: dict[str, str]) -> None:
        self.store, self.episode, self.problems = Path(store), episode, dict(problems)
        what = "; ".join(f"{array}: {why}" for array, why in self.problems.items())
        super().__init__(
            f"{self.store}: {episode} is damaged ({what}); nothing was changed: restore the store from a "
            f"copy or record the episode again (`python -m capsule_rollout verify_store --store {self.store}` "
            "lists every damaged episode)")

    def __reduce__(self):  # across processes (Ray) with its fields
        return type(self), (self.store, self.episode, self.problems)


@dataclass(frozen=True)
class EpisodeCheck:
    """One episode's verdict: `ok` (every checksum matches), `damaged` (`problems`: array -> why) or
    `unverified` (recorded without checksums; every chunk it needs could be decoded)."""

    index: int
    episode_id: str
    status: str
    problems: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"index": self.index, "episode_id": self.episode_id, "status": self.status, "problems": self.problems}


def episode_label(episode_id: str, index: int) -> str:
    return f"episode {episode_id!r} (#{index})"


# -- zarr chunks ------------------------------------------------------------------------------------------
def chunk_rows(array: zarr.Array, lo: int, hi: int) -> list[tuple[int, int, str]]:
    """(first row, end row, key) of each chunk of `array` holding rows lo..hi-1 (chunked along rows only)."""
    size = array.chunks[0]
    sep = getattr(array.metadata, "dimension_separator", ".") or "."
    rest = [0] * (array.ndim - 1)
    return [(c * size, (c + 1) * size, sep.join(map(str, [c, *rest])))
            for c in range(lo // size, (max(hi, lo + 1) - 1) // size + 1)]


def missing_chunks(store: Path, path: str, array: zarr.Array, lo: int, hi: int) -> list[str]:
    """The chunks of rows lo..hi-1 that are not in the store (zarr reads them as the fill value)."""
    return [f"{path}/{key}" for _, _, key in chunk_rows(array, lo, hi) if not (store / path / key).exists()]


def bad_chunk(array: zarr.Array, lo: int, hi: int) -> tuple[int, int, str, Exception] | None:
    """(first row, end row, key, error) of the first chunk among rows lo..hi-1 that cannot be read alone."""
    for a, b, key in chunk_rows(array, lo, hi):
        try:
            array[max(a, lo):min(b, hi, array.shape[0])]
        except Exception as exc:  # noqa: BLE001 - a codec's error is the finding
            return a, b, key, exc
    return None


def undecodable(path: str, array: zarr.Array, lo: int, hi: int, error: Exception) -> str:
    """Why rows lo..hi-1 of `array` could not be read: the first chunk among them that fails alone."""
    bad = bad_chunk(array, lo, hi)
    if bad is None:
        return f"cannot be read ({type(error).__name__}: {error})"
    return f"chunk {path}/{bad[2]} cannot be decoded ({type(bad[3]).__name__}: {bad[3]})"


def mismatch(store: Path, path: str, array: zarr.Array, lo: int, hi: int, rows: int) -> str:
    """Why an episode's rows lo..hi-1 do not match their checksum: a missing chunk, too few rows, or damage."""
    missing = missing_chunks(store, path, array, lo, hi)
    if missing:
        return f"chunk {', '.join(missing)} is missing (read as zeros)"
    if rows != hi - lo:
        return f"{rows} rows where the episode has {hi - lo} (the array is shorter than episode_ends says)"
    keys = [key for _, _, key in chunk_rows(array, lo, hi)]
    where = keys[0] if len(keys) == 1 else f"{keys[0]}..{keys[-1]}"
    return f"checksum mismatch: rows {lo}..{hi - 1} (chunk {path}/{where}) differ from what was recorded"
