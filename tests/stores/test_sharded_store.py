"""Sharded stores: store locations, shards + manifest read as one store, writers killed between the shard write
and the manifest commit, a driver restarted, and damaged input refused without losing what is recorded."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from capsule_rollout.stores.shard_manifest import COUNT_FILE, MANIFEST_FILE, ManifestEntry, ManifestError
from capsule_rollout.stores.sharded_reader import ShardedEpisodeReader, open_episode_reader
from capsule_rollout.stores.sharded_store import (
    ShardedStore,
    ShardWriter,
    UnsupportedStoreError,
    is_sharded_store,
    parse_store_root,
)
from capsule_rollout.stores.zarr_reader import ZarrEpisodeReader
from capsule_rollout.stores.zarr_recorder import ZarrRecorder
from tests.rollout.fakes import assert_same_episode, fake_episode

ROOT = Path(__file__).resolve().parents[2]


def _record(root, episodes, writers=2, skip=()):
    """Episodes written round-robin by `writers` shard writers; all but `skip` committed, in order."""
    with ShardedStore(root) as store:
        shards = [ShardWriter(store.shard_root, prefix=f"a{i:03d}") for i in range(writers)]
        for i, episode in enumerate(episodes):
            entry = shards[i % writers].write(episode)
            if episode.meta.episode_id not in skip:
                store.commit(entry)
        for shard in shards:
            shard.close()
    return root


def _child(*args):
    return subprocess.run([sys.executable, "-m", "tests.stores.shard_killer", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.parametrize("location, path", [
    ("runs/store.zarr", "runs/store.zarr"),
    ("file:///mnt/shared/run%201/episodes.zarr", "/mnt/shared/run 1/episodes.zarr"),
    ("file://localhost/data/s", "/data/s"),
    ("file:relative/s", "relative/s"),
    ("odd:name/s", "odd:name/s"),  # no "//" and not file: a path with a colon
])
def test_store_locations_are_paths_or_file_urls(location, path):
    assert parse_store_root(location) == Path(path)


@pytest.mark.parametrize("location, message", [
    ("s3://bucket/episodes", "scheme 's3' is not supported"),
    ("gs://bucket/episodes", "scheme 'gs' is not supported"),
    ("HTTP://host/episodes", "scheme 'http' is not supported"),
    ("file://runs/episodes", "names host 'runs'"),
    ("file:///x?version=2", r"without \?query"),
])
def test_unknown_schemes_are_refused_and_nothing_is_made(location, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for make in (parse_store_root, ShardedStore, open_episode_reader):
        with pytest.raises(UnsupportedStoreError, match=message):
            make(location)
    assert list(tmp_path.iterdir()) == []


def test_shards_read_as_one_store_in_manifest_order(tmp_path):
    episodes = [fake_episode(i, length=3 + i % 5) for i in range(9)]
    root = _record(tmp_path / "s.zarr", episodes, writers=3, skip={"ep-00004"})
    kept = [e for e in episodes if e.meta.episode_id != "ep-00004"]
    reader = open_episode_reader(f"file://{root}")
    assert isinstance(reader, ShardedEpisodeReader) and is_sharded_store(root)
    assert len(reader) == 8 and reader.episode_ids == [e.meta.episode_id for e in kept]
    assert len(reader.shards) == 3 and "ep-00003" in reader and "ep-00004" not in reader  # the orphan is unseen
    assert reader.ends.tolist() == np.cumsum([e.length for e in kept]).tolist()
    assert reader.keys == sorted(kept[0].steps)
    for i, episode in enumerate(kept):
        assert_same_episode(reader.episode(i), episode)
        assert reader.meta(i) == episode.meta
    whole = {k: np.concatenate([e.steps[k] for e in kept]) for k in reader.keys}
    for lo, hi in [(0, reader.n_steps), (2, 17), (5, 6), (9, 9)]:
        part = reader.steps(lo, hi)
        for k in reader.keys:
            assert part[k].dtype == whole[k].dtype and np.array_equal(part[k], whole[k][lo:hi], equal_nan=True), k
    loaded = reader.load(["state", "image_front"])
    assert np.array_equal(loaded["state"], whole["state"])
    batch = reader.sample(16, 4, np.random.default_rng(0), ["state"])
    first = batch["state"][:, 0]  # state[:, 0] is the episode's index among `episodes`, state[:, 1] the step
    assert [kept[i].meta.seed for i in batch["episode_index"]] == first[:, 0].astype(int).tolist()
    assert np.array_equal(first[:, 1], batch["t"])
    with ShardedStore(root) as store:
        (orphan,) = store.orphans()
        assert orphan[0].startswith("a001-") and orphan[1:] == (1, "ep-00004")  # writer 1's second episode
        assert len(store) == 8 and store.outcomes()["ep-00000"] is True


def test_an_actor_killed_after_its_shard_write_leaves_an_orphan_and_the_rerun_lands_once(tmp_path):
    root = tmp_path / "s.zarr"
    with ShardedStore(root) as driver:
        child = _child("actor", root, 0, 4)  # the actor dies with episode 3 in its shard, unreported
        assert child.returncode == 9, child.stderr
        for line in child.stdout.splitlines():
            driver.commit(ManifestEntry(**json.loads(line)))
        assert len(driver) == 3 and "ep-00003" not in driver
        assert open_episode_reader(root).episode_ids == ["ep-00000", "ep-00001", "ep-00002"]
        (orphan,) = driver.orphans()
        assert orphan[1:] == (3, "ep-00003")
        rerun = ShardWriter(root, prefix="a000")  # the restarted actor: a shard of its own
        entry = rerun.write(fake_episode(3, length=5 + 3 % 4))
        assert rerun.write(fake_episode(3, length=5 + 3 % 4)) == entry  # asked again: not written twice
        driver.commit(entry)
        rerun.close()
    reader = open_episode_reader(root)
    assert reader.episode_ids == [f"ep-{i:05d}" for i in range(4)]  # each exactly once
    assert reader.entries[3].shard == entry.shard != orphan[0]
    for i in range(4):
        assert_same_episode(reader.episode(i), fake_episode(i, length=5 + i % 4))


def test_a_writer_commits_a_group_of_episodes_to_its_shard_at_once(tmp_path):
    root = tmp_path / "s.zarr"
    with ShardedStore(root) as driver:
        writer = ShardWriter(root, prefix="a000")
        first = writer.write(fake_episode(0))
        group = writer.write_many([fake_episode(i) for i in (1, 2, 3)])
        assert [e.index for e in group] == [1, 2, 3] and {e.shard for e in group} == {first.shard}
        assert writer.write_many([fake_episode(2), fake_episode(4)])[0] == group[1]  # asked again: not rewritten
        driver.commit(first)
        with pytest.raises(ManifestError, match="'ep-00002' is already in"):  # twice in one group: none taken
            driver.commit_many([group[0], group[1], group[1]])
        assert len(driver) == 1
        driver.commit_many(group)  # one append, one fsync
        with pytest.raises(ManifestError, match="names shard 'nope'"):
            driver.commit_many([ManifestEntry("ep-00009", "nope", 0, 7, True)])
        writer.close()
        assert [o[2] for o in driver.orphans()] == ["ep-00004"]  # written, never committed
    reader = open_episode_reader(root)
    assert reader.episode_ids == [f"ep-{i:05d}" for i in range(4)]
    for i in range(4):
        assert_same_episode(reader.episode(i), fake_episode(i))


def test_a_restarted_driver_resumes_from_the_manifest(tmp_path):
    root = tmp_path / "s.zarr"
    child = _child("driver", root, 0, 5)  # commits 0..3, dies with 4 in its shard, uncommitted
    assert child.returncode == 9, child.stderr
    with ShardedStore(root) as store:  # the dead driver's lock went with it
        done = store.outcomes()
        assert sorted(done) == [f"ep-{i:05d}" for i in range(4)] and [o[2] for o in store.orphans()] == ["ep-00004"]
        writer = ShardWriter(root, prefix="resumed")
        for i in range(7):  # the resumed run walks past what the manifest holds
            if f"ep-{i:05d}" not in done:
                store.commit(writer.write(fake_episode(i, length=5 + i % 4)))
        writer.close()
    reader = open_episode_reader(root)
    assert reader.episode_ids == [f"ep-{i:05d}" for i in range(7)]
    assert_same_episode(reader.episode(4), fake_episode(4, length=5))


def test_an_append_cut_short_is_ignored_then_cut_and_the_store_goes_on(tmp_path):
    root = _record(tmp_path / "s.zarr", [fake_episode(i) for i in range(3)])
    manifest = root / MANIFEST_FILE
    whole = manifest.read_bytes()
    manifest.write_bytes(whole + b'{"episode_id":"ep-00009","sha')  # a driver killed mid-append
    assert open_episode_reader(root).episode_ids == ["ep-00000", "ep-00001", "ep-00002"]
    with ShardedStore(root) as store:
        assert store.torn_bytes == 29 and manifest.read_bytes() == whole
        writer = ShardWriter(root)
        store.commit(writer.write(fake_episode(3)))
        writer.close()
    assert open_episode_reader(root).episode_ids == [f"ep-{i:05d}" for i in range(4)]


def test_a_corrupt_manifest_line_is_refused_and_nothing_is_lost(tmp_path):
    root = _record(tmp_path / "s.zarr", [fake_episode(i) for i in range(4)])
    manifest = root / MANIFEST_FILE
    lines = manifest.read_bytes().split(b"\n")
    damaged = b"\n".join([*lines[:2], b'{"episode_id": "ep-00001", "shard": 7}', *lines[2:]])
    manifest.write_bytes(damaged)
    for opener in (open_episode_reader, ShardedStore):
        with pytest.raises(ManifestError, match=r"line 3 is not a valid manifest entry .*shard.*The 1 entries before"):
            opener(root)
    assert manifest.read_bytes() == damaged  # nothing rewritten
    manifest.write_bytes(b"\n".join(lines))  # the line removed by hand: every episode is back
    assert open_episode_reader(root).episode_ids == [f"ep-{i:05d}" for i in range(4)]


@pytest.mark.parametrize("line, why", [
    (b"not json", "Expecting value"),
    (b'{"episode_id": "x", "shard": "a", "index": true, "length": 3, "success": true}', "index must be a int"),
    (b'{"episode_id": "x", "shard": "../up", "index": 0, "length": 3, "success": true}', "not a shard name"),
    (b'{"episode_id": "ep-00000", "shard": "a", "index": 5, "length": 3, "success": true}', "named twice"),
])
def test_each_kind_of_bad_line_is_named(tmp_path, line, why):
    root = _record(tmp_path / "s.zarr", [fake_episode(0)], writers=1)
    with open(root / MANIFEST_FILE, "ab") as f:
        f.write(line + b"\n")
    with pytest.raises(ManifestError, match=why):
        open_episode_reader(root)


def test_a_missing_or_foreign_shard_is_named_and_nothing_is_changed(tmp_path):
    root = _record(tmp_path / "s.zarr", [fake_episode(i) for i in range(4)])
    shard = sorted((root / "shards").iterdir())[1]
    aside = tmp_path / "aside.zarr"
    shard.rename(aside)
    with pytest.raises(ManifestError, match=rf"line 3 names episode 'ep-00001' .* but {shard} is missing"):
        open_episode_reader(root)
    aside.rename(shard)
    assert len(open_episode_reader(root)) == 4
    other = _record(tmp_path / "other.zarr", [fake_episode(i + 10) for i in range(2)], writers=1)
    foreign = next((other / "shards").iterdir())
    shutil.rmtree(shard)
    shutil.copytree(foreign, shard, symlinks=True)
    with pytest.raises(ManifestError, match="holds 'ep-00010' there"):
        open_episode_reader(root)


def test_one_driver_per_store_and_kinds_are_not_mixed(tmp_path):
    root = tmp_path / "s.zarr"
    with ShardedStore(root):
        with pytest.raises(ManifestError, match="being written by another process"):
            ShardedStore(root)
    with ZarrRecorder(tmp_path / "single.zarr") as rec:
        rec.write(fake_episode(0))
    with pytest.raises(ValueError, match="single-writer zarr store"):
        ShardedStore(tmp_path / "single.zarr")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="not a sharded store"):
        ShardedStore(tmp_path / "busy")
    with pytest.raises(FileNotFoundError, match="not a zarr store"):
        open_episode_reader(tmp_path / "busy")
    assert isinstance(open_episode_reader(tmp_path / "single.zarr"), ZarrEpisodeReader)
    with pytest.raises(ValueError, match="the driver makes it"):
        ShardWriter(tmp_path / "nowhere")
    (tmp_path / "cut").mkdir()  # a creation killed before its manifest was renamed into place
    (tmp_path / "cut" / f".{MANIFEST_FILE}.123.partial").write_text("{")
    with ShardedStore(tmp_path / "cut") as store:
        assert len(store) == 0 and is_sharded_store(tmp_path / "cut")


def test_every_shard_is_a_zarr_store_in_the_single_store_layout(tmp_path):
    root = _record(tmp_path / "s.zarr", [fake_episode(i) for i in range(4)])
    for shard in sorted((root / "shards").iterdir()):
        single = ZarrEpisodeReader(shard)
        assert single.episode_ids in (["ep-00000", "ep-00002"], ["ep-00001", "ep-00003"])
        assert (shard / ".zgroup").exists() and (shard / "meta" / "episode_ends").is_dir()


def test_the_manifest_carries_its_count_and_a_driver_killed_before_writing_it_loses_nothing(tmp_path):
    root = _record(tmp_path / "s.zarr", [fake_episode(i) for i in range(2)])
    behind = (root / COUNT_FILE).read_bytes()
    with ShardedStore(root) as store:
        writer = ShardWriter(root)
        store.commit(writer.write(fake_episode(2)))
        writer.close()
    count = json.loads((root / COUNT_FILE).read_text())
    assert (count["entries"], count["last"]["episode_id"]) == (3, "ep-00002")
    (root / COUNT_FILE).write_bytes(behind)  # killed between the append and the count's rename
    assert open_episode_reader(root).episode_ids == ["ep-00000", "ep-00001", "ep-00002"]
    (root / COUNT_FILE).unlink()
    with pytest.raises(ManifestError, match=f"{COUNT_FILE} is missing"):
        open_episode_reader(root)
    ShardedStore(root).close()  # a resumed driver counts the entries anew
    assert json.loads((root / COUNT_FILE).read_text())["entries"] == 3 and len(open_episode_reader(root)) == 3


def test_a_manifest_from_before_the_count_reads_as_it_is(tmp_path):
    root = _record(tmp_path / "s.zarr", [fake_episode(i) for i in range(2)])
    manifest = root / MANIFEST_FILE
    lines = manifest.read_bytes().splitlines(keepends=True)
    manifest.write_bytes(b'{"format": "stores.sharded_store", "version": 1}\n' + b"".join(lines[1:]))
    (root / COUNT_FILE).unlink(missing_ok=True)
    assert open_episode_reader(root).episode_ids == ["ep-00000", "ep-00001"]
