"""Damaged LeRobot v3.0 exports and npz episodes: a flipped bit in each file of an export (frames, video,
episode table), a missing video or data file, a flipped bit anywhere in an npz episode. Every read of a
damaged episode is refused with `StoreDamageError` naming the dataset (or file), the episode and the
feature or array; nothing reads back silently wrong; `verify_store` reports it and exits 1. An export
without its checksum sidecar (a dataset made by LeRobot's own tools) reads unverified.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from capsule_rollout.cli.run import main
from capsule_rollout.stores.lerobot_checksums import INFO_KEY
from capsule_rollout.stores.npz_recorder import INDEX_FILE, NpzRecorder, read_npz_episode
from capsule_rollout.stores.store_damage import StoreDamageError
from tests.reliability.store_damage import copy, episode, flip_bit, offsets, read_back, same_episode

FLIPS = 12


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    pytest.importorskip("pyarrow")
    pytest.importorskip("av")
    from capsule_rollout.stores.lerobot_reader import LeRobotDatasetReader
    from capsule_rollout.stores.lerobot_writer import LeRobotWriterOptions, export_lerobot

    base = tmp_path_factory.mktemp("lerobot")
    episodes = [episode(i) for i in range(3)]
    out = {}
    for name, video in (("video", True), ("images", False)):
        root = export_lerobot(episodes, base / name, LeRobotWriterOptions(fps=10, video=video)).root
        reader = LeRobotDatasetReader(root)
        out[name] = (root, [reader.episode(i) for i in range(3)])
        reader.close()
    return out


def _reader(root):
    from capsule_rollout.stores.lerobot_reader import LeRobotDatasetReader

    return LeRobotDatasetReader(root)


FILES = {  # file of the export -> what a refusal names (a feature, or the file itself)
    "video": ["data/chunk-000/file-000.parquet", "videos/observation.images.front/chunk-000/file-000.mp4",
              "meta/episodes/chunk-000/file-000.parquet", "meta/info.json", "meta/tasks.parquet"],
    "images": ["data/chunk-000/file-000.parquet", "meta/episodes/chunk-000/file-000.parquet"],
}


@pytest.mark.parametrize("kind,file", [(k, f) for k, files in FILES.items() for f in files])
def test_a_flipped_bit_in_any_file_of_an_export_is_refused(exports, tmp_path, kind, file, report):
    root, reference = exports[kind]
    counts, named = Counter(), 0
    for offset in offsets(root / file, FLIPS):
        damaged = copy(root, tmp_path / f"flip{offset}")
        flip_bit(damaged / file, offset, bit=offset % 8)
        outcomes = read_back(damaged, reference, _reader)
        counts.update(kind for kind, _ in outcomes)
        for outcome, err in outcomes:
            if outcome == "refused":
                assert isinstance(err, StoreDamageError) and str(damaged) in str(err), err
                assert "episode" in str(err) and err.problems, err
                named += 1
    report.add("store damage: LeRobot exports and npz episodes", bit_flips=len(offsets(root / file, FLIPS)),
               reads_tried=sum(counts.values()), refused_naming_dataset_episode_feature=named,
               read_as_recorded=counts["same"], silently_wrong=counts["wrong"])
    assert counts["wrong"] == 0 and counts["refused"] > 0, counts


@pytest.mark.parametrize("file,feature", [("videos/observation.images.front/chunk-000/file-000.mp4",
                                           "observation.images.front"),
                                          ("data/chunk-000/file-000.parquet", "data/chunk-000/file-000.parquet")])
def test_a_missing_file_of_an_export_is_refused_as_missing_and_reported(exports, tmp_path, file, feature, report):
    root, reference = exports["video"]
    damaged = copy(root, tmp_path / "ds")
    (damaged / file).unlink()
    outcomes = read_back(damaged, reference, _reader)
    named = sum(o == "refused" and isinstance(e, StoreDamageError) and feature in e.problems and "missing" in str(e)
                and f"'ep-0000{i}'" in str(e) for i, (o, e) in enumerate(outcomes))
    assert named == 3, outcomes
    assert main(["verify_store", "--store", str(damaged), "--no-progress", "--json", str(tmp_path / "v.json")]) == 1
    found = json.loads((tmp_path / "v.json").read_text())
    assert found["damaged"] == 3 and "missing" in found["store_problems"][file]
    report.add("store damage: LeRobot exports and npz episodes", reads_tried=len(outcomes),
               refused_naming_dataset_episode_feature=named, read_as_recorded=0, silently_wrong=0)


def test_verify_store_on_an_export_and_one_without_checksums(exports, tmp_path, report):
    root, _ = exports["images"]
    assert main(["verify_store", "--store", str(root), "--no-progress", "--json", str(tmp_path / "v.json")]) == 0
    assert json.loads((tmp_path / "v.json").read_text())["ok"] == 3
    foreign = copy(root, tmp_path / "foreign")
    (foreign / "meta/checksums.json").unlink()  # what LeRobot's own tools write: no sidecar, and info.json
    info = json.loads((foreign / "meta/info.json").read_text())  # does not name one
    (foreign / "meta/info.json").write_text(json.dumps({k: v for k, v in info.items() if k != INFO_KEY}))
    assert main(["verify_store", "--store", str(foreign), "--no-progress", "--json", str(tmp_path / "v.json")]) == 0
    assert json.loads((tmp_path / "v.json").read_text())["unverified"] == 3
    report.add("store damage: stores without checksums", stores=1, episodes_read=3, reported_unverified=3)


def test_a_flipped_bit_anywhere_in_an_npz_episode_is_refused(tmp_path, report):
    recorder = NpzRecorder(tmp_path / "npz")
    source = episode(1)
    path = recorder.write(source)
    raw = path.read_bytes()
    counts, named, refused_at = Counter(), 0, []
    for offset in offsets(path, 200):
        path.write_bytes(raw)
        flip_bit(path, offset, bit=offset % 8)
        try:
            got = read_npz_episode(path)
            counts["same" if same_episode(got, source) else "wrong"] += 1
        except StoreDamageError as exc:
            counts["refused"] += 1
            refused_at.append(offset)
            named += str(path) in str(exc) and "'ep-00001'" in str(exc) and bool(exc.problems)
    report.add("store damage: LeRobot exports and npz episodes", bit_flips=sum(counts.values()),
               reads_tried=sum(counts.values()), refused_naming_dataset_episode_feature=named,
               read_as_recorded=counts["same"], silently_wrong=counts["wrong"])
    assert counts["wrong"] == 0 and named == counts["refused"] > 0, counts
    path.write_bytes(raw)
    flip_bit(path, refused_at[len(refused_at) // 2], bit=refused_at[len(refused_at) // 2] % 8)
    assert main(["verify_store", "--store", str(path.parent), "--no-progress"]) == 1


def test_an_npz_episode_file_deleted_or_its_list_removed_is_named(tmp_path, report):
    """Before: a deleted episode file went unnoticed (verify_store: every episode ok, exit 0)."""
    directory = tmp_path / "npz"
    recorder = NpzRecorder(directory)
    for i in range(3):
        recorder.write(episode(i))
    listed, killed = copy(directory, tmp_path / "unlisted"), copy(directory, tmp_path / "killed")
    (directory / "ep-00001.npz").unlink()
    assert main(["verify_store", "--store", str(directory), "--no-progress", "--json", str(tmp_path / "v.json")]) == 1
    found = json.loads((tmp_path / "v.json").read_text())
    assert (found["ok"], found["damaged"]) == (2, 1)
    assert found["verdicts"][1]["episode_id"] == "ep-00001" and "missing" in found["verdicts"][1]["problems"]["ep-00001.npz"]
    (listed / INDEX_FILE).unlink()  # the list itself: each file says it is listed
    assert main(["verify_store", "--store", str(listed), "--no-progress", "--json", str(tmp_path / "v.json")]) == 1
    assert INDEX_FILE in json.loads((tmp_path / "v.json").read_text())["store_problems"]
    with pytest.raises(StoreDamageError, match=f"{INDEX_FILE}: is missing"):
        NpzRecorder(listed)  # listing what is left would hide the deleted file
    lines = (killed / INDEX_FILE).read_bytes().splitlines(keepends=True)
    (killed / INDEX_FILE).write_bytes(b"".join(lines[:-1]))  # a recorder killed between the rename and the list
    assert main(["verify_store", "--store", str(killed), "--no-progress", "--json", str(tmp_path / "v.json")]) == 0
    assert json.loads((tmp_path / "v.json").read_text())["unverified"] == 1  # ep-00002: not listed
    NpzRecorder(killed)  # its next recorder lists it
    assert len((killed / INDEX_FILE).read_bytes().splitlines()) == 3
    report.add("missing checksums: an npz episode file deleted, the list removed", directories=2, reported_damaged=2)


def _rewrite(data_path, column: str, change) -> None:
    """`change(values)` applied to one column of a parquet file (python values), the file written again."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(data_path)
    values = table[column].to_pylist()
    change(values)
    index = table.column_names.index(column)
    pq.write_table(table.set_column(index, column, pa.array(values, table.schema.field(column).type)), data_path)


def test_an_export_without_its_checksum_file_and_with_a_value_changed_is_refused(exports, tmp_path, capsys, report):
    """Before: it read as a dataset without checksums: import_lerobot imported the changed value, exit 0."""
    root, reference = exports["images"]
    damaged = copy(root, tmp_path / "ds")
    (damaged / "meta/checksums.json").unlink()
    _rewrite(damaged / FILES["images"][0], "observation.state", lambda v: v[25].__setitem__(2, v[25][2] + 1.0))
    outcomes = read_back(damaged, reference, _reader)
    assert all(kind == "refused" and "meta/checksums.json" in str(err) for kind, err in outcomes), outcomes
    out = tmp_path / "back.zarr"
    for extra in ([], ["--allow_unverified", "true"]):  # damage, not unverified: refused either way
        assert main(["import_lerobot", "--src", str(damaged), "--out", str(out), "--no-progress", *extra]) == 1
        err = capsys.readouterr().err
        assert "meta/checksums.json: is missing" in err and err.count("\n") == 1 and not out.exists()
    assert main(["verify_store", "--store", str(damaged), "--no-progress"]) == 1
    report.add("missing checksums: a LeRobot export without its checksum file, a value changed", reads_tried=3,
               refused=3, imports_refused_exit_1=2, verify_store_exit_1=1)


def test_a_flipped_bit_in_an_exported_png_is_one_line_naming_episode_and_file(exports, tmp_path, capsys, report):
    """Before: verify_store and import_lerobot stopped with a Pillow traceback."""
    root, reference = exports["images"]
    data = FILES["images"][0]
    import pyarrow.parquet as pq

    png = pq.read_table(root / data)["observation.images.front"].to_pylist()[25]["bytes"]  # episode 1, frame 5
    counts, named = Counter(), 0
    for offset in offsets_in(len(png), FLIPS):
        damaged = copy(root, tmp_path / f"flip{offset}")
        flipped = bytearray(png)
        flipped[offset] ^= 1 << offset % 8
        _rewrite(damaged / data, "observation.images.front", lambda v, b=bytes(flipped): v[25].__setitem__("bytes", b))
        kind, err = read_back(damaged, reference, _reader)[1]
        counts[kind] += 1
        assert main(["verify_store", "--store", str(damaged), "--no-progress"]) == 1  # the file's checksum differs
        code = main(["import_lerobot", "--src", str(damaged), "--out", str(tmp_path / f"i{offset}.zarr"), "--no-progress"])
        err_text = capsys.readouterr().err
        if kind == "refused":
            assert isinstance(err, StoreDamageError) and "'ep-00001'" in str(err) and data in str(err), err
            assert code == 1 and err_text.count("\n") == 1 and "'ep-00001'" in err_text and data in err_text
            named += 1
        else:
            assert kind == "same" and code == 0, err  # a bit the decoder never reads: the pixels are as written
    report.add("missing checksums: a flipped bit in an exported PNG", bit_flips=sum(counts.values()),
               refused_one_line_naming_episode_and_file=named, read_as_recorded=counts["same"],
               silently_wrong=counts["wrong"], tracebacks=0)
    assert counts["wrong"] == 0 and named > 0, counts


def offsets_in(size: int, count: int) -> list[int]:
    return sorted({int(x) for x in np.linspace(0, size - 1, count)})
