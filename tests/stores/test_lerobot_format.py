"""LeRobot v3.0 export and import: the round trip, the layout LeRobot's loader reads, and the refusals."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
av = pytest.importorskip("av")

from capsule_rollout.stores import episode_schema as S  # noqa: E402
from capsule_rollout.stores import lerobot_format as F  # noqa: E402
from capsule_rollout.stores.episode import Episode  # noqa: E402
from capsule_rollout.stores.lerobot_checksums import CHECKSUMS_PATH, INFO_KEY  # noqa: E402
from capsule_rollout.stores.lerobot_reader import LeRobotDatasetReader  # noqa: E402
from capsule_rollout.stores.lerobot_stats import STAT_KEYS, ImageHistogram, vector_stats  # noqa: E402
from capsule_rollout.stores.lerobot_writer import (  # noqa: E402
    LeRobotExportError,
    LeRobotWriterOptions,
    export_lerobot,
    open_store,
)
from capsule_rollout.stores.zarr_reader import store_episodes  # noqa: E402
from capsule_rollout.stores.zarr_recorder import ZarrRecorder  # noqa: E402
from tests.rollout.fakes import assert_same_episode, fake_episode  # noqa: E402

FPS = 10


def flat(episode: int, t: np.ndarray) -> np.ndarray:
    return ((40 * np.asarray(t) + 7 * episode) % 256).astype(np.uint8)


def episodes(n: int = 4) -> list[Episode]:
    """Fake episodes with every per-episode field set; frame t of episode i is the flat image 40 t + 7 i."""
    eps = []
    for i in range(n):
        ep = fake_episode(i, length=5 + 3 * i, cameras=("front", "top"), success=i % 2 == 0)
        steps = dict(ep.steps)
        for camera in ("image_front", "image_top"):
            steps[camera] = np.broadcast_to(flat(i, np.arange(ep.length))[:, None, None, None], ep.steps[camera].shape)
        eps.append(Episode(steps, replace(ep.meta, operator_events=f"1:takeover\n{i}:coach:lift it" if i else "")))
    return eps


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "store.zarr"
    with ZarrRecorder(path) as recorder:
        for ep in episodes():
            recorder.write(ep)
    return path


def export(store_path, out, **options):
    reader = open_store(store_path)
    return export_lerobot(store_episodes(reader, range(len(reader))), out, LeRobotWriterOptions(fps=FPS, **options))


def test_round_trip_without_video_is_exact(store, tmp_path):
    summary = export(store, tmp_path / "ds", video=False)
    assert (summary.episodes, summary.frames, summary.cameras) == (4, sum(5 + 3 * i for i in range(4)), ("front", "top"))
    reader = LeRobotDatasetReader(tmp_path / "ds")
    assert len(reader) == 4
    for i, ep in enumerate(episodes()):
        assert_same_episode(reader.episode(i), ep)  # every step field, images included, and every meta field


def test_round_trip_with_video_keeps_every_field_and_each_frame_in_its_place(store, tmp_path):
    export(store, tmp_path / "ds", video=True)
    reader = LeRobotDatasetReader(tmp_path / "ds")
    for i, ep in enumerate(episodes()):
        got = reader.episode(i)
        assert got.meta == ep.meta
        for key, value in ep.steps.items():
            if key.startswith(S.IMAGE_PREFIX):  # lossy, but each frame is its own flat image
                assert got.steps[key].shape == value.shape
                assert np.abs(got.steps[key].astype(int) - value).max() <= 3, key
            else:
                np.testing.assert_array_equal(got.steps[key], value, err_msg=key)
    # out of order: the decoder seeks back
    assert reader.episode(1).steps["image_top"][0].mean() == pytest.approx(flat(1, 0), abs=3)


def test_info_and_episode_table_are_what_lerobot_reads(store, tmp_path):
    export(store, tmp_path / "ds", video=True)
    info = json.loads((tmp_path / "ds" / F.INFO_PATH).read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == FPS
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"]) == (4, 38, 4)
    assert info["splits"] == {"train": "0:4"}
    features = info["features"]
    assert features["observation.state"] == {"dtype": "float32", "shape": [8], "names": None}
    assert features["action"]["shape"] == [4] and features["policy_action"]["shape"] == [4]
    assert features["intervention"]["dtype"] == "bool" and features["subtask_id"]["dtype"] == "int32"
    assert features["wall_time"]["dtype"] == "float64" and features["timestamp"]["dtype"] == "float32"
    front = features["observation.images.front"]
    assert front["dtype"] == "video" and front["shape"] == [16, 16, 3]
    assert front["info"]["video.codec"] == "h264" and front["info"]["video.fps"] == FPS
    data = pq.read_table(tmp_path / "ds" / "data/chunk-000/file-000.parquet")
    non_video = {k for k, ft in features.items() if ft["dtype"] != "video"}
    assert set(data.column_names) == non_video  # LeRobot casts the file to exactly these features
    assert data["index"].to_pylist() == list(range(38))
    np.testing.assert_allclose(data["timestamp"].to_numpy(), data["frame_index"].to_numpy() / FPS, rtol=1e-6)
    rows = pq.read_table(tmp_path / "ds" / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    ends = np.cumsum([5 + 3 * i for i in range(4)])
    assert [r["dataset_from_index"] for r in rows] == [0, 5, 13, 24]
    assert [r["dataset_to_index"] for r in rows] == ends.tolist()
    key = "videos/observation.images.top/"
    assert [r[key + "from_timestamp"] for r in rows] == pytest.approx(np.concatenate([[0], ends[:-1]]) / FPS)
    assert [r[key + "to_timestamp"] for r in rows] == pytest.approx(ends / FPS)
    assert [r["tasks"] for r in rows] == [[e.meta.instruction] for e in episodes()]
    assert [r["success"] for r in rows] == [True, False, True, False]
    assert rows[2]["operator_events"] == "1:takeover\n2:coach:lift it"
    assert rows[0]["stats/action/count"] == [5]


def test_videos_hold_every_frame_at_its_time(store, tmp_path):
    export(store, tmp_path / "ds", video=True, vcodec="libsvtav1")
    with av.open(str(tmp_path / "ds/videos/observation.images.front/chunk-000/file-000.mp4")) as container:
        stream = container.streams.video[0]
        frames = [(float(f.pts * stream.time_base), f.to_ndarray(format="rgb24").mean()) for f in container.decode(stream)]
    assert [t for t, _ in frames] == pytest.approx(np.arange(38) / FPS)
    expected = np.concatenate([flat(i, np.arange(5 + 3 * i)) for i in range(4)])
    np.testing.assert_allclose([m for _, m in frames], expected, atol=2)


def test_files_roll_over_and_every_episode_still_reads(store, tmp_path):
    export(store, tmp_path / "ds", video=True, data_file_mb=0.001, video_file_mb=0.001)
    data = sorted((tmp_path / "ds/data").glob("chunk-000/file-*.parquet"))
    videos = sorted((tmp_path / "ds/videos/observation.images.front").glob("chunk-000/file-*.mp4"))
    assert len(data) >= 2 and len(videos) >= 2
    rows = pq.read_table(tmp_path / "ds" / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    key = "videos/observation.images.front/"
    assert {r["data/file_index"] for r in rows} == set(range(len(data)))
    assert {r[key + "file_index"] for r in rows} == set(range(len(videos)))
    for before, after in zip(rows, rows[1:]):  # a new file starts at time 0; within a file, spans abut
        same = before[key + "file_index"] == after[key + "file_index"]
        assert after[key + "from_timestamp"] == pytest.approx(before[key + "to_timestamp"] if same else 0.0)
    reader = LeRobotDatasetReader(tmp_path / "ds")
    for i, ep in enumerate(episodes()):
        got = reader.episode(i)
        np.testing.assert_array_equal(got.steps[S.STATE], ep.steps[S.STATE])
        assert np.abs(got.steps["image_front"].astype(int) - ep.steps["image_front"]).max() <= 3


def test_tasks_are_indexed_by_text_for_pandas(store, tmp_path):
    export(store, tmp_path / "ds", video=False)
    tasks = pq.read_table(tmp_path / "ds" / F.TASKS_PATH)
    assert tasks["task"].to_pylist() == [e.meta.instruction for e in episodes()]
    assert tasks["task_index"].to_pylist() == [0, 1, 2, 3]
    assert json.loads(tasks.schema.metadata[b"pandas"])["index_columns"] == ["task"]
    subtasks = pq.read_table(tmp_path / "ds" / F.SUBTASKS_PATH)
    assert subtasks["subtask"].to_pylist()[:2] == episodes()[0].meta.subtask_texts
    data = pq.read_table(tmp_path / "ds" / "data/chunk-000/file-000.parquet")
    first = data.slice(0, 5)
    texts = [subtasks["subtask"][i].as_py() for i in first["subtask_index"].to_pylist()]
    ep = episodes()[0]
    assert texts == [ep.meta.subtask_texts[i] for i in ep.steps[S.SUBTASK_ID]]


def test_stats_match_numpy_and_skip_what_never_ran(store, tmp_path):
    export(store, tmp_path / "ds", video=True)
    stats = json.loads((tmp_path / "ds" / F.STATS_PATH).read_text())
    state = np.concatenate([e.steps[S.STATE] for e in episodes()])
    assert set(stats["observation.state"]) == set(STAT_KEYS)
    np.testing.assert_allclose(stats["observation.state"]["mean"], state.mean(0), rtol=1e-6)
    np.testing.assert_allclose(stats["observation.state"]["q50"], np.quantile(state, 0.5, axis=0), rtol=1e-6)
    assert stats["observation.state"]["count"] == [38]
    values = np.concatenate([e.steps[S.VALUE] for e in episodes()])
    np.testing.assert_allclose(stats["value"]["mean"], [np.nanmean(values)], rtol=1e-6)  # NaN: no critic ran
    assert np.array(stats["observation.images.front"]["mean"]).shape == (3, 1, 1)
    assert vector_stats(np.full((4, 2), np.nan)) is None


def test_image_histogram_stats_equal_direct_ones():
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, size=(7, 5, 6, 3), dtype=np.uint8)
    hist = ImageHistogram()
    hist.add(frames[:3])
    hist.add(frames[3:])
    stats = hist.stats()
    flat = frames.reshape(-1, 3) / 255.0
    np.testing.assert_allclose(stats["mean"].ravel(), flat.mean(0))
    np.testing.assert_allclose(stats["std"].ravel(), flat.std(0))
    np.testing.assert_allclose(stats["min"].ravel(), flat.min(0))
    np.testing.assert_allclose(stats["max"].ravel(), flat.max(0))
    np.testing.assert_allclose(stats["q50"].ravel(), np.quantile(flat, 0.5, axis=0, method="inverted_cdf"))
    assert stats["count"].tolist() == [7]


def test_an_existing_dataset_is_kept_unless_overwrite(store, tmp_path):
    out = tmp_path / "ds"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(LeRobotExportError, match="already exists.*--overwrite"):
        export(store, out, video=False)
    assert (out / "keep.txt").exists()
    reader = open_store(store)
    export_lerobot(store_episodes(reader, [1, 2]), out, LeRobotWriterOptions(fps=FPS, video=False), overwrite=True)
    assert not (out / "keep.txt").exists() and len(LeRobotDatasetReader(out)) == 2
    assert not list(tmp_path.glob(".ds.*"))  # no partial or old copy left behind


def test_a_failed_export_leaves_nothing(store, tmp_path):
    def failing():
        yield from episodes()[:2]
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        export_lerobot(failing(), tmp_path / "ds", LeRobotWriterOptions(fps=FPS))
    assert not (tmp_path / "ds").exists() and not list(tmp_path.glob(".ds.*"))


def test_unreadable_store_and_mismatched_episodes_are_refused(tmp_path):
    (tmp_path / "junk").mkdir()
    with pytest.raises(LeRobotExportError, match="cannot read .*junk as an episode store"):
        open_store(tmp_path / "junk")
    other = fake_episode(9, cameras=("front",))
    with pytest.raises(LeRobotExportError, match="one set of features"):
        export_lerobot([episodes(1)[0], other], tmp_path / "ds", LeRobotWriterOptions(fps=FPS))
    with pytest.raises(LeRobotExportError, match="fps must be a positive integer"):
        LeRobotWriterOptions(fps=0)


def test_episodes_are_chosen_by_id_or_index():
    ids = ["a-1", "a-2", "b-1"]
    assert F.select_episodes(ids, ()) == [0, 1, 2]
    assert F.select_episodes(ids, ("b-1", "0", "-2")) == [0, 1, 2]
    with pytest.raises(ValueError, match="did you mean 'b-1'"):
        F.select_episodes(ids, ("b-l",))
    with pytest.raises(ValueError, match="neither an id nor an index"):
        F.select_episodes(ids, ("3",))


def test_reader_fills_what_a_lerobot_made_dataset_lacks(store, tmp_path):
    """A dataset with only LeRobot's own columns (plus next.reward) reads with the schema's empty values."""
    root = tmp_path / "ds"
    export(store, root, video=True)
    (root / CHECKSUMS_PATH).unlink()  # LeRobot's own datasets carry none (else the edits below are damage)
    data_path = root / "data/chunk-000/file-000.parquet"
    data = pq.read_table(data_path)
    extras = [k for k in (*F.STEP_EXTRAS, F.WALL_TIME) if k in data.column_names]  # these episodes: no privileged
    data = data.drop_columns(extras).append_column("next.reward", data["reward"])
    pq.write_table(data, data_path)
    info = json.loads((root / F.INFO_PATH).read_text())
    info.pop(INFO_KEY)  # nor the key naming the sidecar
    info["features"] = {k: v for k, v in info["features"].items() if k not in extras}
    info["features"]["next.reward"] = {"dtype": "float32", "shape": [1], "names": None}
    (root / F.INFO_PATH).write_text(json.dumps(info))
    table_path = root / "meta/episodes/chunk-000/file-000.parquet"
    pq.write_table(pq.read_table(table_path).drop_columns(list(F.EPISODE_EXTRAS)), table_path)

    ep = LeRobotDatasetReader(root, id_prefix="demo").episode(2)
    source = episodes()[2]
    assert ep.meta.episode_id == "demo-e000002" and ep.meta.seed == 2
    assert ep.meta.instruction == source.meta.instruction and ep.meta.subtasks == source.meta.subtasks
    assert (ep.meta.success, ep.meta.stop_reason) == (False, "operator_end")
    np.testing.assert_array_equal(ep.steps[S.SUBTASK_ID], source.steps[S.SUBTASK_ID])  # from subtask_index
    np.testing.assert_array_equal(ep.steps[S.REWARD], source.steps[S.REWARD])  # from next.reward
    assert np.isnan(ep.steps[S.VALUE]).all() and np.isnan(ep.steps[S.POLICY_ACTION]).all()
    assert not ep.steps[S.INTERVENTION].any()
    np.testing.assert_allclose(ep.steps[S.TIMESTAMP], np.arange(ep.length) / FPS, rtol=1e-6)


def test_reader_refuses_what_it_cannot_read(tmp_path):
    with pytest.raises(F.LeRobotFormatError, match="no meta/info.json"):
        LeRobotDatasetReader(tmp_path)
    (tmp_path / "meta").mkdir()
    (tmp_path / F.INFO_PATH).write_text(json.dumps({"codebase_version": "v2.1", "features": {}, "fps": 30}))
    with pytest.raises(F.LeRobotFormatError, match="v2.1 dataset.*convert"):
        LeRobotDatasetReader(tmp_path)
