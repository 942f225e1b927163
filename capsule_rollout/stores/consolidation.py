"""`consolidate_store`: the episodes of a store (a sharded one, typically) copied into one single-writer
zarr store, diffusion_policy's layout, for tools that read only that.

The copy is written by a `ZarrRecorder`, so it is committed batch by batch: a consolidation stopped at
any point leaves a store holding the source's first episodes, in order, and `resume=True` continues it.
The source is only read. The copy checksums what it reads: only checked episodes are copied, unless told.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from capsule_rollout.stores.env_description import read_env_description, write_env_description
from capsule_rollout.stores.episode import Episode
from capsule_rollout.stores.sharded_reader import open_episode_reader
from capsule_rollout.stores.sharded_store import is_sharded_store, parse_store_root
from capsule_rollout.stores.zarr_reader import ZarrEpisodeReader, require_verified, store_episodes
from capsule_rollout.stores.zarr_recorder import ZarrRecorder


class ConsolidateError(ValueError):
    """The consolidation cannot run as asked; the message says how to fix it."""


@dataclass(frozen=True)
class ConsolidateSummary:
    out: Path
    episodes: int  # in the consolidated store at the end (the source's, all of them)
    copied: int  # by this call
    resumed_from: int  # episodes the store held before this call (resume)
    steps: int


def consolidate_store(source: str | os.PathLike, out: str | os.PathLike, *, resume: bool = False,
                      allow_unverified: bool = False,
                      on_episode: Callable[[Episode], None] | None = None) -> ConsolidateSummary:
    """Copy every episode of `source` (reader order: a sharded store's manifest order) into a zarr store at `out`.

    An existing `out` is refused unless `resume`; then it must hold the source's first episodes, in order
    (what an interrupted consolidation left), and the rest is appended. A source with episodes recorded without
    checksums is refused (`UnverifiedStoreError`) before anything is written unless `allow_unverified`.
    """
    reader = open_episode_reader(source)
    if not allow_unverified:
        require_verified(reader, range(len(reader)))
    out = Path(os.path.abspath(parse_store_root(out)))
    src = Path(os.path.abspath(reader.path))
    if out == src or src in out.parents or out in src.parents:
        raise ConsolidateError(f"--out {out} overlaps the store {src}: write the consolidated store elsewhere")
    before = _resumable(out, resume)
    ids = reader.episode_ids
    if before and ids[: len(before)] != before:
        raise ConsolidateError(f"{out} holds {len(before)} episodes that are not the first {len(before)} of {src} "
                               "in order: it is not an interrupted consolidation of this store; choose another --out")
    with ZarrRecorder(out) as recorder:
        for episode in store_episodes(reader, range(len(before), len(reader))):
            recorder.write(episode)
            if on_episode is not None:
                on_episode(episode)
    described = read_env_description(src)
    if described is not None:  # the env's control rate, names and cameras go with its episodes
        write_env_description(out, described)
    return ConsolidateSummary(out, len(reader), len(reader) - len(before), len(before), reader.n_steps)


def _resumable(out: Path, resume: bool) -> list[str]:
    """The episode ids an existing `out` holds (checked to be a zarr store), [] for a new or empty one."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return []
    if is_sharded_store(out):
        raise ConsolidateError(f"{out} is a sharded store; consolidate writes a single zarr store: choose another --out")
    if not resume:
        raise ConsolidateError(f"{out} already exists: pass --resume true to finish an interrupted consolidation "
                               "into it, or choose another --out")
    if not (out / ".zgroup").exists():
        raise ConsolidateError(f"{out} exists and is not a zarr store: choose another --out")
    ZarrRecorder(out).close()  # drops what a killed consolidation left uncommitted
    return ZarrEpisodeReader(out).episode_ids
