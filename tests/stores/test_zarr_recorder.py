import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from capsule_rollout.stores import checksums as C
from capsule_rollout.stores import episode_schema as S
from capsule_rollout.stores.episode import Episode, EpisodeError
from capsule_rollout.stores.zarr_reader import ZarrEpisodeReader
from capsule_rollout.stores.zarr_recorder import RecorderError, ZarrRecorder
from tests.rollout.fakes import assert_same_episode, fake_episode

ROOT = Path(__file__).resolve().parents[2]


def test_round_trip_and_reader_api(tmp_path):
    path = tmp_path / "store.zarr"
    eps = [fake_episode(i, length=5 + i, cameras=("front", "top")) for i in range(4)]
    with ZarrRecorder(path) as rec:
        for ep in eps:
            rec.write(ep)
    reader = ZarrEpisodeReader(path)
    assert len(reader) == 4 and reader.episode_ids == [e.meta.episode_id for e in eps]
    assert reader.ends.tolist() == np.cumsum([e.length for e in eps]).tolist()
    for i, ep in enumerate(eps):
        assert_same_episode(reader.episode(i), ep)
    assert [e.meta for e in reader.episodes()] == [e.meta for e in eps]
    with pytest.raises(IndexError, match="holds 4"):
        reader.episode(4)


def test_reopen_appends_and_ids_stay_unique(tmp_path):
    path = tmp_path / "store.zarr"
    with ZarrRecorder(path) as rec:
        rec.write(fake_episode(0))
    with ZarrRecorder(path) as rec:
        assert rec.committed == 1 and "ep-00000" in rec
        with pytest.raises(EpisodeError, match="already in"):
            rec.write(fake_episode(0))
        rec.write(fake_episode(1))
    assert ZarrEpisodeReader(path).episode_ids == ["ep-00000", "ep-00001"]


def test_write_many_commits_a_group_at_once_or_refuses_all_of_it(tmp_path):
    path = tmp_path / "store.zarr"
    with ZarrRecorder(path, batch_window=0.0) as rec:
        rec.write(fake_episode(0))
        rec.flush()
        before = os.readlink(path / "meta/episode_ends/.commit/current")
        rec.write_many([fake_episode(i) for i in (1, 2, 3)])
        rec.flush()
        after = os.readlink(path / "meta/episode_ends/.commit/current")
        assert rec.committed == 4 and int(after.strip("v/")) == int(before.strip("v/")) + 1  # one commit
        with pytest.raises(EpisodeError, match="'ep-00005' is already in"):  # twice in the group
            rec.write_many([fake_episode(4), fake_episode(5), fake_episode(5)])
        with pytest.raises(EpisodeError, match="differ from the store"):
            rec.write_many([fake_episode(4), fake_episode(6, image_size=32)])
        assert "ep-00004" not in rec  # nothing of a refused group was taken
        rec.write_many([fake_episode(4)])
    assert ZarrEpisodeReader(path).episode_ids == [f"ep-{i:05d}" for i in range(5)]


def test_bad_episodes_raise_in_the_caller_and_the_store_stays_valid(tmp_path):
    path = tmp_path / "store.zarr"
    with ZarrRecorder(path) as rec:
        rec.write(fake_episode(0, image_size=16))
        with pytest.raises(EpisodeError, match="differ from the store"):
            rec.write(fake_episode(1, image_size=32))
        good = fake_episode(2)
        steps = dict(good.steps)
        steps[S.ACTION] = steps[S.ACTION].copy()
        steps[S.ACTION][3, 1] = np.nan
        with pytest.raises(EpisodeError, match="action: non-finite values at steps \\[3\\]"):
            rec.write(Episode(steps, good.meta))
        rec.write(fake_episode(3))
    reader = ZarrEpisodeReader(path)
    assert reader.episode_ids == ["ep-00000", "ep-00003"]


def test_writes_do_not_wait_for_the_disk(tmp_path, monkeypatch):
    rec = ZarrRecorder(tmp_path / "store.zarr")
    gate = __import__("threading").Event()
    original = rec._append
    monkeypatch.setattr(rec, "_append", lambda ep: (gate.wait(), original(ep)))
    for i in range(3):
        rec.write(fake_episode(i))  # returns although the writer is blocked
    assert rec.committed == 0 and ZarrEpisodeReader(tmp_path / "store.zarr").episode_ids == []
    gate.set()
    rec.close()
    assert rec.committed == 3


def test_a_writer_failure_is_reported_and_committed_episodes_survive(tmp_path, monkeypatch):
    path = tmp_path / "store.zarr"
    rec = ZarrRecorder(path)
    rec.write(fake_episode(0))
    rec.flush()

    def full_disk(self, index, ends):
        raise OSError("disk full")

    monkeypatch.setattr(ZarrRecorder, "_commit", full_disk)
    rec.write(fake_episode(1))
    with pytest.raises(RecorderError, match="disk full.*1 episodes committed before are intact"):
        rec.flush()
    with pytest.raises(RecorderError):
        rec.write(fake_episode(2))
    monkeypatch.undo()
    reopened = ZarrRecorder(path)
    assert reopened.committed == 1
    reopened.close()
    reader = ZarrEpisodeReader(path)
    assert reader.episode_ids == ["ep-00000"] and reader.n_steps == fake_episode(0).length
    assert all(a.shape[0] == reader.n_steps for a in reader._data.values())


def _child(path, *args):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, str(ROOT / "tests/stores/crash_writer.py"), str(path), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def _check_intact(path):
    reader = ZarrEpisodeReader(path)
    for i, ep in enumerate(reader.episodes(keys=[S.STATE, S.DONE, "image_front"])):
        assert ep.meta.episode_id == f"ep-{i:05d}" and ep.meta.length == 40 + i % 7
        assert (ep.steps[S.STATE][:, 0] == i).all() and (ep.steps[S.STATE][:, 1] == np.arange(ep.length)).all()
        assert ep.steps[S.DONE][-1] and not ep.steps[S.DONE][:-1].any()
        assert ep.steps["image_front"][-1, 0, 0, 0] == (i + ep.length - 1) % 256
    return reader


def test_killed_inside_an_append_leaves_no_partial_episode(tmp_path):
    path = tmp_path / "store.zarr"
    child = _child(path, "mid_append", "3")
    child.wait(timeout=60)
    assert child.returncode == 9, child.stderr.read()
    raw = ZarrEpisodeReader(path)
    assert len(raw) == 3  # the killed append's rows are past every array's shape: no reader sees them
    assert all(a.shape[0] == raw.n_steps for a in raw._data.values())
    with ZarrRecorder(path) as rec:  # nothing to cut on reopening
        assert rec.repair_report.episodes == 3 and rec.repair_report.dropped_steps == 0
        assert rec.repair_report.dropped_meta == 0
        rec.write(fake_episode(3, length=30, image_size=96))  # shorter, over the dead append's rows
    reader = ZarrEpisodeReader(path)
    assert len(reader) == 4 and all(a.shape[0] == reader.n_steps for a in reader._data.values())
    last = reader.episode(3, keys=[S.STATE, S.DONE])
    assert last.length == 30 and (last.steps[S.STATE][:, 0] == 3).all() and last.steps[S.DONE][-1]
    assert (last.steps[S.STATE][:, 1] == np.arange(30)).all()


def test_an_uncommitted_tail_from_older_code_is_cut_on_reopening(tmp_path):
    import zarr

    path = tmp_path / "store.zarr"
    with ZarrRecorder(path) as rec:
        for i in range(2):
            rec.write(fake_episode(i, length=6))
    group = zarr.open_group(str(path), mode="a", zarr_format=2)  # the old writer: resize, then write
    for _key, array in group["data"].arrays():
        array.resize((15, *array.shape[1:]))
    group["meta/episode_id"].resize((3,))
    assert not (path / "data/state/.zarray").is_symlink()  # zarr's resize replaced the link by a file
    assert len(ZarrEpisodeReader(path)) == 2
    with ZarrRecorder(path) as rec:
        assert (rec.repair_report.episodes, rec.repair_report.dropped_steps, rec.repair_report.dropped_meta) == (2, 3, 1)
        rec.write(fake_episode(2, length=4))
    assert (path / "data/state/.zarray").is_symlink()  # adopted again
    reader = ZarrEpisodeReader(path)
    assert reader.episode_ids == ["ep-00000", "ep-00001", "ep-00002"] and reader.n_steps == 16
    assert all(a.shape[0] == 16 for a in reader._data.values())


@pytest.mark.slow
def test_sigkill_at_random_moments_never_loses_or_half_writes(tmp_path):
    path = tmp_path / "store.zarr"
    rng = np.random.default_rng(0)
    committed_before = 0
    for _ in range(4):
        child = _child(path, "sigkill")
        seen = 0
        deadline = time.monotonic() + 60
        while seen < committed_before + 2 and time.monotonic() < deadline:
            line = child.stdout.readline()
            seen = int(line) if line.strip() else seen
        time.sleep(rng.uniform(0.0, 0.05))
        child.send_signal(signal.SIGKILL)
        child.wait()
        with ZarrRecorder(path) as rec:
            assert rec.committed >= seen  # everything reported as flushed survived
            committed_before = rec.committed
        _check_intact(path)
    assert committed_before >= 8


def test_random_windows_stay_inside_episodes(tmp_path):
    path = tmp_path / "store.zarr"
    with ZarrRecorder(path) as rec:
        for i in range(5):
            rec.write(fake_episode(i, length=3 + 2 * i))
    reader = ZarrEpisodeReader(path)
    batch = reader.sample(64, 6, np.random.default_rng(1), keys=[S.STATE, S.ACTION])
    assert batch[S.STATE].shape == (64, 6, 8) and batch[S.ACTION].shape == (64, 6, 4)
    for b in range(64):
        ep, t = batch["episode_index"][b], batch["t"][b]
        states = batch[S.STATE][b]
        assert (states[:, 0] == ep).all()  # never crosses into another episode
        length = 3 + 2 * ep
        assert states[:, 1].tolist() == [min(t + k, length - 1) for k in range(6)]


def test_reader_refuses_a_non_store(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a zarr store"):
        ZarrEpisodeReader(tmp_path)


@pytest.mark.slow
def test_store_reads_with_zarr_2_like_diffusion_policy(tmp_path):
    """The layout diffusion_policy's ReplayBuffer opens, checked with a real zarr 2.x."""
    venv = tmp_path / "zarr2"
    made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True)
    install = subprocess.run([str(venv / "bin/pip"), "install", "-q", "zarr>=2.18,<3"], capture_output=True, text=True)
    if made.returncode or install.returncode:
        pytest.skip(f"could not install zarr 2 in a venv: {install.stderr[-300:]}")
    path = tmp_path / "store.zarr"
    with ZarrRecorder(path) as rec:
        for i in range(3):
            rec.write(fake_episode(i))
    script = (
        "import sys, zarr\n"
        "root = zarr.open(sys.argv[1], 'r')\n"
        "ends = root['meta']['episode_ends'][:]\n"
        "for key, value in root['data'].items():\n"
        "    assert value[:ends[-1]].shape[0] == ends[-1], key\n"
        "meta = {k: v[:] for k, v in root['meta'].items()}\n"
        "print(zarr.__version__, ends.tolist(), meta['episode_id'].tolist(), int(root['data']['state'][8, 0]))\n"
    )
    out = subprocess.run([str(venv / "bin/python"), "-c", script, str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split(" ", 1)[0].startswith("2.")
    assert "[7, 14, 21]" in out.stdout and "'ep-00000', 'ep-00001', 'ep-00002'" in out.stdout
    assert out.stdout.strip().endswith(" 1")  # step 8 belongs to episode 1


def test_a_store_from_before_a_meta_field_existed_reads_and_appends_without_loss(tmp_path):
    import zarr

    path = tmp_path / "store.zarr"
    with ZarrRecorder(path) as rec:
        rec.write(fake_episode(0))
        rec.write(fake_episode(1))
    zarr.open_group(str(path), mode="a", zarr_format=2)["meta"].__delitem__(S.OPERATOR_EVENTS)  # an older store
    assert [m.operator_events for m in (ZarrEpisodeReader(path).meta(i) for i in range(2))] == ["", ""]
    newer = fake_episode(2)
    newer = Episode(newer.steps, type(newer.meta)(**{**newer.meta.to_dict(), "operator_events": "3:coach:go left"}))
    with ZarrRecorder(path) as rec:
        assert rec.committed == 2
        rec.write(newer)
    with ZarrRecorder(path) as rec:  # reopened: nothing dropped by the column added late
        assert rec.committed == 3
    reader = ZarrEpisodeReader(path)
    assert reader.episode_ids == ["ep-00000", "ep-00001", "ep-00002"]
    assert [reader.meta(i).operator_events for i in range(3)] == ["", "", "3:coach:go left"]


def _renamed(episode: Episode, **meta) -> Episode:
    import dataclasses

    return Episode(episode.steps, dataclasses.replace(episode.meta, **meta), episode.extra)


def test_an_import_path_task_id_records_and_an_older_narrow_store_refuses_it_by_name(tmp_path, monkeypatch):
    """A task named by a 58-character import path (and an episode id built from it) records and reads back;
    a store made with the earlier 32 / 64-character columns keeps its episodes and refuses, before anything
    is written, an episode whose task does not fit, naming the column."""
    task = "my_lab_package.environments.tabletop_variants:make_env_v23"
    assert len(task) == 58
    long_one = _renamed(fake_episode(0), task=task, episode_id=f"{task}-s0000007-r01")
    path = tmp_path / "new.zarr"
    with ZarrRecorder(path) as rec:
        rec.write(long_one)
    reader = ZarrEpisodeReader(path)
    assert reader.meta(0).task == task and reader.episode_ids == [long_one.meta.episode_id]

    old = tmp_path / "old.zarr"
    narrow = {**S.EPISODE_FIELDS, S.TASK: np.dtype("<U32"), S.EPISODE_ID: np.dtype("<U64")}
    monkeypatch.setattr(S, "EPISODE_FIELDS", narrow)
    with ZarrRecorder(old) as rec:  # the store as an earlier version made it
        rec.write(fake_episode(1))
    monkeypatch.undo()
    with ZarrRecorder(old) as rec:
        with pytest.raises(EpisodeError, match=r"its task is 58 characters; .* task column of 32 .* new store"):
            rec.write(_renamed(fake_episode(2), task=task))
        rec.write(fake_episode(3))  # what fits still records
    assert ZarrEpisodeReader(old).episode_ids == ["ep-00001", "ep-00003"]


def test_a_store_records_that_it_writes_checksums_and_from_which_episode(tmp_path):
    old = tmp_path / "old.zarr"
    with ZarrRecorder(old, checksums=False) as rec:  # the format before checksums: no record
        rec.write_many([fake_episode(0), fake_episode(1)])
    assert not (old / ".zattrs").exists() or "checksums" not in json.loads((old / ".zattrs").read_text())
    with ZarrRecorder(old) as rec:
        rec.write(fake_episode(2))
    assert json.loads((old / ".zattrs").read_text())["checksums"]["from_episode"] == 2
    assert json.loads((old / "meta/checksums/.zattrs").read_text())["from_episode"] == 2
    reader = ZarrEpisodeReader(old)
    assert [reader.verified(i) for i in range(3)] == [False, False, True]
    with pytest.raises(ValueError, match="records checksums of its episodes"):
        ZarrRecorder(old, checksums=False)


@pytest.mark.parametrize("cut", ["after the record", "after the array's metadata"])
def test_a_checksum_array_whose_creation_was_cut_short_is_made_again(tmp_path, cut):
    """The record is written before the array: a kill in between leaves a record no committed episode needs."""
    path = tmp_path / "s.zarr"
    with ZarrRecorder(path, checksums=False) as rec:
        rec.write_many([fake_episode(0), fake_episode(1)])
    root = zarr.open_group(str(path), mode="a", zarr_format=2)
    root.attrs.update({C.RECORD: C.record(2)})  # what the first append with checksums writes first
    if cut == "after the array's metadata":  # its .zarray, not yet its attributes
        root["meta"].create_array(C.ARRAY, shape=(2, 2), chunks=(1024, 2), dtype=np.int64, fill_value=C.NO_CHECKSUM)
    reader = ZarrEpisodeReader(path)
    assert [reader.verified(i) for i in range(2)] == [False, False]
    assert all(reader.episode(i).meta.episode_id == f"ep-0000{i}" for i in range(2))  # read, not refused
    with ZarrRecorder(path) as rec:
        rec.write(fake_episode(2))
    reader = ZarrEpisodeReader(path)
    assert [reader.verified(i) for i in range(3)] == [False, False, True]
    assert_same_episode(reader.episode(2), fake_episode(2))
