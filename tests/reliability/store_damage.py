"""Stores to damage and how to read them back, for `test_store_damage*.py`.

Episodes carry a value in every field (attempt, repeat, operator events too), so every per-episode array
has a chunk on disk. `read_back` reads a (damaged) store episode by episode and sorts what each read gave:
the episode as recorded, a refusal (the error), or a silently wrong episode.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np

from capsule_rollout.stores.episode import Episode
from capsule_rollout.stores.sharded_reader import open_episode_reader
from capsule_rollout.stores.sharded_store import ShardedStore, ShardWriter, shard_path
from capsule_rollout.stores.zarr_recorder import ZarrRecorder
from tests.rollout.fakes import fake_episode

LENGTH = 20


def episode(i: int) -> Episode:
    ep = fake_episode(i, length=LENGTH, privileged_dim=6)  # a sim's episode: every step field there is
    meta = dataclasses.replace(ep.meta, attempt=1 + i % 2, repeat=i, operator_events=f"{i % 5}:coach:lift block {i}")
    return Episode(ep.steps, meta)


def single_store(path: Path, n: int = 3, **options) -> list[Episode]:
    episodes = [episode(i) for i in range(n)]
    with ZarrRecorder(path, **options) as recorder:
        recorder.write_many(episodes)
    return episodes


def sharded_store(root: Path, shards: int = 2, per_shard: int = 6) -> list[Episode]:
    """A sharded store of `shards` * `per_shard` episodes, shard by shard in manifest order."""
    episodes = []
    with ShardedStore(root) as store:
        for s in range(shards):
            writer = ShardWriter(store.shard_root, prefix=f"w{s}")
            batch = [episode(s * per_shard + i) for i in range(per_shard)]
            store.commit_many(writer.write_many(batch))
            writer.close()
            episodes += batch
    return episodes


def first_shard(root: Path) -> Path:
    """The shard holding the store's first episode."""
    reader = open_episode_reader(root)
    return shard_path(root, reader.entries[0].shard)


def copy(store: Path, to: Path) -> Path:
    shutil.rmtree(to, ignore_errors=True)
    shutil.copytree(store, to, symlinks=True)
    return to


def flip_bit(path: Path, offset: int, bit: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[offset % len(data)] ^= 1 << bit
    path.write_bytes(bytes(data))


def offsets(path: Path, count: int) -> list[int]:
    """`count` byte offsets spread over a file, its first and last byte among them."""
    size = path.stat().st_size
    return sorted({int(x) for x in np.linspace(0, size - 1, count)})


def same_episode(a: Episode, b: Episode) -> bool:
    if a.meta != b.meta or set(a.steps) != set(b.steps):
        return False
    return all(np.asarray(a.steps[k]).dtype == np.asarray(b.steps[k]).dtype
               and np.array_equal(a.steps[k], b.steps[k], equal_nan=np.asarray(a.steps[k]).dtype.kind == "f")
               for k in a.steps)


def read_back(path: Path, recorded: list[Episode], reader_of=open_episode_reader) -> list[tuple[str, object]]:
    """Per recorded episode: ("same", None), ("refused", error) or ("wrong", what differs); an episode the
    store no longer shows counts as wrong (silently lost). `reader_of`: opens the store (a zarr or sharded
    store by default; a LeRobot export's reader)."""
    try:
        reader = reader_of(path)
    except Exception as exc:  # noqa: BLE001 - the refusal is the result
        return [("refused", exc)] * len(recorded)
    out = []
    for i, source in enumerate(recorded):
        if i >= len(reader):
            out.append(("wrong", f"episode {i} no longer in the store ({len(reader)} shown)"))
            continue
        try:
            got = reader.episode(i)
        except Exception as exc:  # noqa: BLE001
            out.append(("refused", exc))
            continue
        out.append(("same", None) if same_episode(got, source) else ("wrong", f"episode {i} differs"))
    if hasattr(reader, "close"):
        reader.close()
    return out
