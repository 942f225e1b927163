import dataclasses

import numpy as np
import pytest

from capsule_rollout.stores.episode import Episode, EpisodeError
from capsule_rollout.stores.npz_recorder import INDEX_FILE, NpzRecorder, read_index, read_npz_episode, says_listed
from tests.rollout.fakes import assert_same_episode, fake_episode


def test_round_trip_every_field_without_pickle(tmp_path):
    rec = NpzRecorder(tmp_path)
    eps = [fake_episode(i, length=3 + i, cameras=("front", "top")) for i in range(3)]
    for ep in eps:
        rec.write(ep)
    paths = rec.episode_paths()
    assert [p.name for p in paths] == ["ep-00000.npz", "ep-00001.npz", "ep-00002.npz"]
    for ep, path in zip(eps, paths):
        assert_same_episode(read_npz_episode(path), ep)
        with np.load(path, allow_pickle=False) as raw:  # plain arrays only
            assert all(raw[k].dtype != object for k in raw.files)
    assert not list(tmp_path.glob(".*"))  # no temp files left


def test_duplicates_and_bad_episodes_write_nothing(tmp_path):
    rec = NpzRecorder(tmp_path)
    ep = fake_episode(1)
    rec.write(ep)
    with pytest.raises(EpisodeError, match="already recorded"):
        rec.write(ep)
    bad = Episode({**ep.steps, "state": ep.steps["state"] * np.nan}, dataclasses.replace(ep.meta, episode_id="bad"))
    with pytest.raises(EpisodeError, match="non-finite"):
        rec.write(bad)
    with pytest.raises(EpisodeError, match="file name"):
        rec.path_for("../escape")
    assert [p.name for p in rec.episode_paths()] == ["ep-00001.npz"]


def test_the_directory_lists_each_file_and_an_append_cut_short_is_cut(tmp_path):
    rec = NpzRecorder(tmp_path)
    paths = [rec.write(fake_episode(i)) for i in range(2)]
    index = read_index(tmp_path)
    assert [e["episode_id"] for e in index.entries.values()] == ["ep-00000", "ep-00001"] and not index.problems
    assert all(index.check(p) is None and says_listed(p) for p in paths)
    with open(tmp_path / INDEX_FILE, "ab") as f:
        f.write(b'{"episode_id": "ep-0000')  # a recorder killed mid-append
    assert len(read_index(tmp_path).entries) == 2
    NpzRecorder(tmp_path).write(fake_episode(2))
    assert (tmp_path / INDEX_FILE).read_bytes().count(b"\n") == 3 and len(read_index(tmp_path).entries) == 3
