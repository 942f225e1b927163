"""consolidate_store: a sharded store copied into one zarr store equal to it episode for episode and array for
array, in diffusion_policy's layout; resumable, and refusing an existing output unless asked."""

import numpy as np
import pytest
import zarr

from capsule_rollout.stores.consolidation import ConsolidateError, consolidate_store
from capsule_rollout.stores.sharded_reader import open_episode_reader
from capsule_rollout.stores.sharded_store import ShardedStore, ShardWriter
from capsule_rollout.stores.zarr_reader import ZarrEpisodeReader
from capsule_rollout.stores.zarr_recorder import ZarrRecorder
from tests.reliability.read_store import read_diffusion_policy, read_plain
from tests.rollout.fakes import assert_same_episode, fake_episode


@pytest.fixture
def sharded(tmp_path):
    """Eleven episodes over three shards, interleaved in the manifest, one orphan left out."""
    root = tmp_path / "sharded.zarr"
    with ShardedStore(root) as store:
        writers = [ShardWriter(root, prefix=f"a{i:03d}") for i in range(3)]
        for i in range(12):
            entry = writers[(i * 7) % 3].write(fake_episode(i, length=4 + (i * 5) % 9, success=i % 3 > 0))
            if i != 6:
                store.commit(entry)
        for w in writers:
            w.close()
    return root


def assert_same_store(a, b):
    assert a.episode_ids == b.episode_ids and a.keys == b.keys
    assert np.array_equal(a.ends, b.ends) and np.array_equal(a.starts, b.starts)
    whole_a, whole_b = a.steps(0, a.n_steps), b.steps(0, b.n_steps)
    for key in a.keys:  # array for array
        x, y = whole_a[key], whole_b[key]
        assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), key
    for i in range(len(a)):  # episode for episode
        assert_same_episode(a.episode(i), b.episode(i))


def test_the_consolidated_store_equals_the_sharded_one(sharded, tmp_path):
    out = tmp_path / "single.zarr"
    summary = consolidate_store(f"file://{sharded}", out)
    assert (summary.episodes, summary.copied, summary.resumed_from) == (11, 11, 0)
    source, copy = open_episode_reader(sharded), open_episode_reader(out)
    assert isinstance(copy, ZarrEpisodeReader) and "ep-00006" not in copy.episode_ids
    assert_same_store(source, copy)
    assert summary.steps == copy.n_steps


def test_the_consolidated_store_is_diffusion_policys_layout_for_plain_zarr(sharded, tmp_path):
    out = tmp_path / "single.zarr"
    consolidate_store(sharded, out)
    source = open_episode_reader(sharded)
    ids = source.episode_ids
    assert read_plain(str(out)) == ids and read_diffusion_policy(str(out)) == ids  # markers checked row by row
    root = zarr.open_group(str(out), mode="r", zarr_format=2)  # format 2, as diffusion_policy's zarr 2 needs
    assert (out / ".zgroup").exists() and not (out / "zarr.json").exists()
    ends = np.asarray(root["meta/episode_ends"][:])
    assert ends.dtype == np.int64 and ends.tolist() == np.cumsum([m.length for m in map(source.meta, range(11))]).tolist()
    for key, array in root["data"].arrays():
        assert array.shape[0] == ends[-1], key
    assert [str(x) for x in root["meta/episode_id"][:]] == ids


def test_an_existing_output_is_refused_unless_resumed_and_a_resume_finishes_it(sharded, tmp_path):
    out = tmp_path / "single.zarr"
    seen = []

    def stop_after_four(episode):
        seen.append(episode.meta.episode_id)
        if len(seen) == 4:
            raise KeyboardInterrupt  # the user stopped it

    with pytest.raises(KeyboardInterrupt):
        consolidate_store(sharded, out, on_episode=stop_after_four)
    done = ZarrEpisodeReader(out).episode_ids
    assert 0 < len(done) <= 4 and done == open_episode_reader(sharded).episode_ids[: len(done)]
    with pytest.raises(ConsolidateError, match="already exists: pass --resume true"):
        consolidate_store(sharded, out)
    assert ZarrEpisodeReader(out).episode_ids == done  # refused: untouched
    summary = consolidate_store(sharded, out, resume=True)
    assert (summary.resumed_from, summary.copied) == (len(done), 11 - len(done))
    assert_same_store(open_episode_reader(sharded), open_episode_reader(out))


def test_bad_outputs_are_refused_with_the_reason(sharded, tmp_path):
    other = tmp_path / "other.zarr"
    with ZarrRecorder(other) as rec:
        rec.write(fake_episode(40))
    with pytest.raises(ConsolidateError, match="not the first 1 of"):
        consolidate_store(sharded, other, resume=True)
    assert ZarrEpisodeReader(other).episode_ids == ["ep-00040"]
    with pytest.raises(ConsolidateError, match="overlaps the store"):
        consolidate_store(sharded, sharded / "inside.zarr")
    with pytest.raises(ConsolidateError, match="is a sharded store"):
        consolidate_store(other, sharded, resume=True)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "x").write_text("x")
    with pytest.raises(ConsolidateError, match="not a zarr store"):
        consolidate_store(sharded, tmp_path / "junk", resume=True)
