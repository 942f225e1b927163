"""`ShapeCommit`: change the shapes of every array of a zarr-format-2 store in one atomic step.

A reader of the diffusion_policy layout takes `meta/episode_ends[-1]` as the step
count and wants every `data/*` array exactly that long; a plain zarr reader slices
by the ends. Each array keeps its shape in its own `.zarray` file, so growing the
arrays one file at a time leaves, between two renames, a store those readers see
with bogus or missing episodes. Here every array's `.zarray` is a relative symlink
into one directory of metadata files,

    meta/episode_ends/.commit/current -> v00000042/
    data/state/.zarray -> ../../meta/episode_ends/.commit/current/data%2Fstate.zarray

and a commit writes the next version directory (every array's metadata, with the
new shapes), then renames a new `current` link over the old one: a single rename,
so a process killed at any point leaves the old shapes or the new ones, never a
mix. Rows past an array's shape are invisible to every reader, so a writer puts
the new rows there first (`write_rows`) and commits after.

The directory sits inside the `episode_ends` array's directory: zarr never lists
an array's directory as group members, and chunk keys never start with a dot.
Symlinks are needed (any Linux or macOS filesystem); the store stays a plain zarr
format 2 store for every reader (zarr 2 and 3 follow the links).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from urllib.parse import quote

import numpy as np
import zarr

COMMIT_DIR = "meta/episode_ends/.commit"
CURRENT = "current"
_VERSION_PREFIX = "v"


class ShapeCommit:
    """The commit directory of one store: adopt arrays, read their shapes, commit new ones."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self.dir = self.root / COMMIT_DIR

    # -- queries ------------------------------------------------------------------
    @property
    def current(self) -> Path | None:
        link = self.dir / CURRENT
        return self.dir / os.readlink(link) if link.is_symlink() else None

    def adopted(self, path: str) -> bool:
        """Whether array `path`'s `.zarray` is a link into the commit directory."""
        return (self.root / path / ".zarray").is_symlink()

    def lists(self, path: str) -> bool:
        """Whether the current version holds array `path`'s metadata (it was committed, wherever its directory is)."""
        current = self.current
        return current is not None and (current / _file_name(path)).is_file()

    # -- setup --------------------------------------------------------------------
    def adopt(self, paths: list[str]) -> None:
        """Link each array's `.zarray` into the current version (a plain file becomes a link to a copy of itself).

        Each step keeps the store as it was for a reader: the copy holds the same metadata, and a
        link replaces the file in one rename.
        """
        if self.current is None:
            self.dir.mkdir(parents=True, exist_ok=True)
            first = self.dir / f"{_VERSION_PREFIX}{1:08d}"
            first.mkdir(exist_ok=True)
            _replace_link(self.dir / CURRENT, first.name)
        current = self.current
        for path in paths:
            zarray = self.root / path / ".zarray"
            if zarray.is_symlink():
                continue
            name = _file_name(path)
            _write_atomic(current / name, zarray.read_bytes())
            depth = len(Path(path).parts)
            _replace_link(zarray, "../" * depth + f"{COMMIT_DIR}/{CURRENT}/{name}")

    def clean(self) -> int:
        """Remove version directories other than the current one (left by a killed commit); returns how many.

        Only for a store's single writer: a commit in progress elsewhere would lose its new version.
        """
        current = self.current
        if current is None:
            return 0
        stale = [p for p in self.dir.iterdir() if p.name.startswith(_VERSION_PREFIX) and p.name != current.name]
        for p in stale:
            shutil.rmtree(p, ignore_errors=True)
        return len(stale)

    # -- the commit ---------------------------------------------------------------
    def commit(self, shapes: dict[str, tuple[int, ...]]) -> None:
        """Give arrays (store paths, all adopted) new shapes at once; other adopted arrays keep theirs."""
        current = self.current
        if current is None:
            raise RuntimeError(f"{self.root}: no commit directory yet; adopt the arrays first")
        names = {_file_name(p): tuple(int(d) for d in s) for p, s in shapes.items()}
        missing = sorted(set(names) - {f.name for f in current.iterdir()})
        if missing:
            raise RuntimeError(f"{self.root}: arrays {missing} are not adopted; adopt them before committing")
        number = int(current.name[len(_VERSION_PREFIX) :]) + 1
        new = self.dir / f"{_VERSION_PREFIX}{number:08d}"
        if new.exists():  # left by a commit killed before its switch
            shutil.rmtree(new)
        new.mkdir()
        for f in current.iterdir():
            meta = json.loads(f.read_bytes())
            if f.name in names:
                meta["shape"] = list(names[f.name])
            (new / f.name).write_text(json.dumps(meta, indent=4, sort_keys=True))
        _replace_link(self.dir / CURRENT, new.name)  # the commit point: one rename
        shutil.rmtree(current, ignore_errors=True)


def write_rows(array: zarr.Array, start: int, values: np.ndarray) -> None:
    """Write `values` at rows `start...` of `array` without changing its stored shape (chunks only).

    The rows stay invisible to readers until a `ShapeCommit.commit` grows the shape over them.
    """
    if not len(values):
        return
    shape = (start + len(values), *array.shape[1:])
    grown = zarr.Array(zarr.AsyncArray(array.metadata.update_shape(shape), array.store_path, array.config))
    grown[start : start + len(values)] = values


def _file_name(path: str) -> str:
    return quote(path, safe="") + ".zarray"


# Temporary names end in `.partial`, like zarr's own, so a store's repair removes what a kill left.
def _replace_link(link: Path, target: str) -> None:
    tmp = link.with_name(f".{link.name}.{os.getpid()}.partial")
    tmp.unlink(missing_ok=True)
    try:
        os.symlink(target, tmp)
    except (OSError, NotImplementedError) as exc:
        raise OSError(
            f"cannot create a symlink in {link.parent} ({exc}): the zarr recorder commits through symlinks; "
            "write the store to a filesystem that has them"
        ) from None
    os.replace(tmp, link)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    tmp.write_bytes(data)
    os.replace(tmp, path)
