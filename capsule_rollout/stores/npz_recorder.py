"""`.npz` episodes: one file per episode, written atomically, read without pickle.

An npz file is a zip archive, which keeps a CRC-32 of every array it holds: reading checks it, and
an array that is missing, cannot be decompressed or differs raises `StoreDamageError`.
"""

from __future__ import annotations

import dataclasses
import os
import tokenize
import zipfile
import zlib
from pathlib import Path

import numpy as np

from capsule_rollout.stores import episode_schema as S
from capsule_rollout.stores.episode import Episode, EpisodeError, EpisodeMeta, validate_episode
from capsule_rollout.stores.store_damage import StoreDamageError

META_PREFIX = "meta."


class NpzRecorder:
    """Writes `<directory>/<episode_id>.npz` (temp name, then rename: never half-written)."""

    def __init__(self, directory: str | os.PathLike, *, compress: bool = True) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.compress = compress

    def path_for(self, episode_id: str) -> Path:
        if "/" in episode_id or episode_id.startswith("."):
            raise EpisodeError(f"episode_id {episode_id!r} cannot be a file name (no '/' or leading '.')")
        return self.directory / f"{episode_id}.npz"

    def write(self, episode: Episode) -> Path:
        episode = validate_episode(episode)
        path = self.path_for(episode.meta.episode_id)
        if path.exists():
            raise EpisodeError(f"episode {episode.meta.episode_id!r} is already recorded at {path}")
        arrays = dict(episode.steps)
        for name, dtype in S.EPISODE_FIELDS.items():
            arrays[META_PREFIX + name] = np.asarray(getattr(episode.meta, name), dtype=dtype)
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npz")
        try:
            (np.savez_compressed if self.compress else np.savez)(tmp, **arrays)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return path

    def episode_paths(self) -> list[Path]:
        return sorted(p for p in self.directory.glob("*.npz") if not p.name.startswith("."))


# what zipfile, zlib and numpy's header parser raise for a damaged file (a missing one stays FileNotFoundError)
_DAMAGE = (zipfile.BadZipFile, zlib.error, EOFError, ValueError, TypeError, SyntaxError, NotImplementedError,
           tokenize.TokenError, OSError)
_REQUIRED = [f.name for f in dataclasses.fields(EpisodeMeta) if f.default is dataclasses.MISSING]


def read_npz_episode(path: str | os.PathLike) -> Episode:
    """Load an episode written by `NpzRecorder` (`allow_pickle=False`); a damaged file raises `StoreDamageError`."""
    path = Path(path)
    label = f"episode {path.stem!r}"
    try:
        data = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise
    except _DAMAGE as exc:
        raise StoreDamageError(path, label, {path.name: f"cannot be opened ({type(exc).__name__}: {exc})"}) from exc
    with data:
        values = {}
        for key in data.files:
            try:
                values[key] = data[key]
            except _DAMAGE as exc:
                raise StoreDamageError(path, label, {key: f"cannot be read ({type(exc).__name__}: {exc})"}) from exc
    steps = {k: v for k, v in values.items() if not k.startswith(META_PREFIX)}
    fields = {}
    for name, dtype in S.EPISODE_FIELDS.items():
        if META_PREFIX + name not in values:  # written before the field existed: its default
            continue
        value = values[META_PREFIX + name][()]
        fields[name] = str(value) if dtype.kind == "U" else value.item()
    missing = [name for name in _REQUIRED if name not in fields]
    if missing:
        raise StoreDamageError(path, label, {META_PREFIX + name: "the array is missing" for name in missing})
    return Episode(steps, EpisodeMeta(**fields))
