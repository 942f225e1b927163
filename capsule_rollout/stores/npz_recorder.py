"""`.npz` episodes: one file per episode, written atomically, read without pickle."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from capsule_rollout.stores import episode_schema as S
from capsule_rollout.stores.episode import Episode, EpisodeError, EpisodeMeta, validate_episode

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


def read_npz_episode(path: str | os.PathLike) -> Episode:
    """Load an episode written by `NpzRecorder` (`allow_pickle=False`)."""
    with np.load(path, allow_pickle=False) as data:
        steps = {k: data[k] for k in data.files if not k.startswith(META_PREFIX)}
        fields = {}
        for name, dtype in S.EPISODE_FIELDS.items():
            if META_PREFIX + name not in data.files:  # written before the field existed: its default
                continue
            value = data[META_PREFIX + name][()]
            fields[name] = str(value) if dtype.kind == "U" else value.item()
    return Episode(steps, EpisodeMeta(**fields))
