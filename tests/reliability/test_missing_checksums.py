"""Damage that would read back as data: checksums that go missing. A zarr store records that it writes
checksums (the root's attributes, the array's, the commit directory), so the chunk of `meta/checksums` lost
with a data chunk, the array removed, its attributes removed or a row set to the fill value are damage naming
the episode, refused by every reader of the project and by `consolidate` and `export_lerobot`, reported by
`verify_store` (exit 1); the record's own copy removed is reported and loses nothing. A sharded store's
manifest carries its count: its last entry deleted is refused naming the episode. Episodes recorded without
checksums are copied only when told (`--allow_unverified`).
"""

from __future__ import annotations

import json
import shutil

import numcodecs
import numpy as np
import pytest

from capsule_rollout.cli.run import main
from capsule_rollout.stores.shard_manifest import MANIFEST_FILE, ManifestError
from capsule_rollout.stores.sharded_reader import open_episode_reader
from capsule_rollout.stores.sharded_store import ShardedStore
from capsule_rollout.stores.store_damage import StoreDamageError
from capsule_rollout.stores.zarr_reader import ZarrEpisodeReader, store_episodes
from capsule_rollout.stores.zarr_recorder import ZarrRecorder
from tests.reliability.store_damage import (
    copy,
    episode,
    first_shard,
    read_back,
    same_episode,
    sharded_store,
    single_store,
)

SUMS = "meta/checksums"


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    path = tmp_path_factory.mktemp("single") / "s.zarr"
    return path, single_store(path)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    root = tmp_path_factory.mktemp("sharded") / "store"
    return root, sharded_store(root)


def every_read(path, recorded) -> list[tuple[str, object]]:
    """`read_back` (episode by episode), then the readers' other ways in: steps of the whole store, `load`,
    `sample`, `store_episodes` (what consolidate and export read with)."""
    out = read_back(path, recorded)
    reader = open_episode_reader(path)
    ways = [lambda: reader.steps(0, reader.n_steps), reader.load,
            lambda: reader.sample(4, 2, np.random.default_rng(0)), lambda: list(store_episodes(reader, range(len(reader))))]
    for way in ways:
        try:
            way()
            out.append(("wrong", "read without an error"))
        except Exception as exc:  # noqa: BLE001 - the refusal is the result
            out.append(("refused", exc))
    return out


def names(error: object, store, episode_id: str, why: str) -> bool:
    text = str(error)
    return isinstance(error, StoreDamageError) and all(x in text for x in (str(store), SUMS, episode_id, why))


def verify(store, tmp_path) -> tuple[int, dict]:
    code = main(["verify_store", "--store", str(store), "--no-progress", "--json", str(tmp_path / "v.json")])
    return code, json.loads((tmp_path / "v.json").read_text())


def test_a_lost_checksum_chunk_with_a_data_chunk_is_refused_by_every_reader_and_copied_nowhere(single, tmp_path,
                                                                                            capsys, report):
    """Before: every reader returned the zeros, verify_store said unverified (exit 0), consolidate copied them."""
    path, recorded = single
    damaged = copy(path, tmp_path / "s.zarr")
    (damaged / SUMS / "0.0").unlink()
    (damaged / "data/state/0.0").unlink()
    outcomes = every_read(damaged, recorded)
    named = sum(kind == "refused" and names(err, damaged, "episode 'ep-0000", "chunk meta/checksums/0.0 is missing")
                for kind, err in outcomes)
    assert named == len(outcomes) == 7, outcomes
    code, found = verify(damaged, tmp_path)
    assert code == 1 and (found["damaged"], found["unverified"]) == (3, 0)
    assert all("missing" in v["problems"][SUMS] and "data/state/0.0 is missing" in v["problems"]["data/state"]
               for v in found["verdicts"])
    out = tmp_path / "c.zarr"
    code = main(["consolidate", "--store", str(damaged), "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 1 and "'ep-00000'" in err and SUMS in err and err.count("\n") == 1
    copied = len(ZarrEpisodeReader(out)) if out.exists() else 0
    assert copied == 0
    report.add("missing checksums: the checksum chunk lost with a data chunk", reads_tried=len(outcomes),
               refused_naming_store_episode_checksums=named, silently_wrong=len(outcomes) - named,
               verify_store_damaged=found["damaged"], consolidate_exit_1=1, episodes_copied=copied)


def test_the_same_in_one_shard_of_a_sharded_store(sharded, tmp_path, report):
    root, recorded = sharded
    damaged = copy(root, tmp_path / "store")
    shard = first_shard(damaged)
    (shard / SUMS / "0.0").unlink()
    (shard / "data/action/0.0").unlink()
    outcomes = read_back(damaged, recorded)
    assert [kind for kind, _ in outcomes] == ["refused"] * 6 + ["same"] * 6, outcomes
    assert all(names(err, damaged, f"'ep-0000{i}'", "is missing") for i, (_, err) in enumerate(outcomes[:6]))
    code, found = verify(damaged, tmp_path)
    where = f"shards/{shard.name}/{SUMS}"
    assert code == 1 and (found["ok"], found["damaged"]) == (6, 6)
    assert all(where in v["problems"] for v in found["verdicts"][:6])
    report.add("missing checksums: the checksum chunk lost with a data chunk", reads_tried=len(outcomes),
               refused_naming_store_episode_checksums=6, silently_wrong=0, read_as_recorded=6,
               verify_store_damaged=found["damaged"])


def _fill_row(store, row: int) -> None:
    """Episode `row`'s checksums set to the fill value (`NO_CHECKSUM`), the chunk encoded again (it decodes)."""
    meta = json.loads((store / SUMS / ".zarray").read_text())
    codec = numcodecs.get_codec(meta["compressor"])
    table = np.frombuffer(codec.decode((store / SUMS / "0.0").read_bytes()), np.int64).reshape(meta["chunks"]).copy()
    table[row] = -1
    (store / SUMS / "0.0").write_bytes(codec.encode(table))


DAMAGE = {  # what is removed or changed -> what the refusal says
    "the array removed": (lambda s: shutil.rmtree(s / SUMS), "the array is missing"),
    "the array and the root's record removed": (lambda s: [shutil.rmtree(s / SUMS), (s / ".zattrs").unlink()],
                                                "commit directory lists it"),
    "the array's attributes removed": (lambda s: (s / SUMS / ".zattrs").unlink(), "attributes"),
    "its .zarray link removed": (lambda s: (s / SUMS / ".zarray").unlink(), "the array is missing"),
    "one row set to the fill value": (lambda s: _fill_row(s, 1), "no checksum"),
}


@pytest.mark.filterwarnings("ignore:Object at checksums is not recognized")  # the .zarray link removed
@pytest.mark.parametrize("what", DAMAGE)
def test_checksums_removed_are_damage_and_a_recorder_will_not_append_past_them(single, tmp_path, what, report):
    """Before: the store read as a store without checksums, every episode unverified, exit 0."""
    path, recorded = single
    damaged = copy(path, tmp_path / "s.zarr")
    remove, why = DAMAGE[what]
    remove(damaged)
    (damaged / "data/image_front/0.0.0.0").unlink()  # the damage they would have hidden
    outcomes = read_back(damaged, recorded)
    expect = [1] if what == "one row set to the fill value" else [0, 1, 2]
    assert [i for i, (kind, _) in enumerate(outcomes) if kind == "refused"] == [0, 1, 2], outcomes
    named = sum(names(outcomes[i][1], damaged, f"'ep-0000{i}'", why) for i in expect)
    assert named == len(expect), outcomes
    code, found = verify(damaged, tmp_path)
    assert code == 1 and found["damaged"] == 3 and found["unverified"] == 0
    before = sorted(p.name for p in damaged.rglob("*"))
    if what != "one row set to the fill value":
        with pytest.raises(StoreDamageError, match="restore the store from a copy, or record to a new store"):
            ZarrRecorder(damaged)
        assert sorted(p.name for p in damaged.rglob("*") if p.name != ".writer.lock") == \
            [n for n in before if n != ".writer.lock"]
    report.add("missing checksums: the checksum array removed (5 ways)", stores=1, reads_tried=len(outcomes),
               refused=sum(kind == "refused" for kind, _ in outcomes), silently_wrong=0, verify_store_exit_1=1)


def test_the_roots_record_removed_loses_nothing_is_reported_and_written_again(single, tmp_path):
    path, recorded = single
    damaged = copy(path, tmp_path / "s.zarr")
    (damaged / ".zattrs").unlink()
    assert [kind for kind, _ in read_back(damaged, recorded)] == ["same"] * 3  # the array's attributes hold it
    code, found = verify(damaged, tmp_path)
    assert code == 1 and found["ok"] == 3 and ".zattrs" in found["store_problems"]
    ZarrRecorder(damaged).close()  # the store's writer writes it again from the array's attributes
    code, found = verify(damaged, tmp_path)
    assert code == 0 and not found["store_problems"] and (damaged / ".zattrs").is_file()


def test_a_store_from_before_the_record_reads_and_gets_one_from_its_next_recorder(single, tmp_path):
    path, recorded = single
    old = copy(path, tmp_path / "s.zarr")
    (old / ".zattrs").write_text("{}")
    attrs = json.loads((old / SUMS / ".zattrs").read_text())
    (old / SUMS / ".zattrs").write_text(json.dumps({k: v for k, v in attrs.items() if k != "from_episode"}))
    reader = ZarrEpisodeReader(old)
    assert reader.verified(0) and all(same_episode(reader.episode(i), e) for i, e in enumerate(recorded))
    with ZarrRecorder(old) as recorder:
        recorder.write(episode(3))
    assert json.loads((old / ".zattrs").read_text())["checksums"]["from_episode"] == 0
    shutil.rmtree(old / SUMS)
    assert [kind for kind, _ in read_back(old, recorded)] == ["refused"] * 3


def test_the_manifests_last_entry_deleted_is_refused_naming_the_episode(sharded, tmp_path, capsys, report):
    """Before: the episode vanished from the store and verify_store said every episode was ok (exit 0)."""
    root, recorded = sharded
    damaged = copy(root, tmp_path / "store")
    manifest = damaged / MANIFEST_FILE
    lines = manifest.read_bytes().splitlines(keepends=True)
    manifest.write_bytes(b"".join(lines[:-1]))
    last = recorded[-1].meta.episode_id
    for opener in (open_episode_reader, ShardedStore):  # the readers, and a resumed driver
        with pytest.raises(ManifestError, match=f"says 12 were committed, the last of them episode '{last}'"):
            opener(damaged)
    code, found = verify(damaged, tmp_path)
    assert code == 1 and last in found["store_problems"][MANIFEST_FILE]
    assert main(["consolidate", "--store", str(damaged), "--out", str(tmp_path / "c.zarr"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert last in err and err.count("\n") == 1 and not (tmp_path / "c.zarr").exists()
    assert manifest.read_bytes() == b"".join(lines[:-1])  # nothing rewritten
    manifest.write_bytes(b"".join([*lines[:3], *lines[4:]]))  # one from the middle instead
    with pytest.raises(ManifestError, match="says 12 were committed"):
        open_episode_reader(damaged)
    report.add("missing checksums: a manifest entry deleted (the last, one in the middle)", stores=2,
               refused_by_reader_driver_verify_consolidate=1, episodes_vanished=0)


def test_episodes_without_checksums_are_copied_only_when_told(tmp_path, capsys, report):
    """Before: consolidate and export_lerobot copied them and gave the copies fresh, valid checksums."""
    store = tmp_path / "old.zarr"
    recorded = single_store(store, checksums=False)
    out = tmp_path / "c.zarr"
    args = ["consolidate", "--store", str(store), "--out", str(out), "--no-progress"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "3 of its 3 episodes were recorded without checksums" in err and "--allow_unverified" in err
    assert not out.exists()
    assert main([*args, "--allow_unverified", "true"]) == 0
    copied = ZarrEpisodeReader(out)
    assert all(copied.verified(i) and same_episode(copied.episode(i), e) for i, e in enumerate(recorded))
    report.add("missing checksums: episodes recorded without checksums", commands=1, refused_exit_2=1, copied_when_told=1)
    pytest.importorskip("pyarrow")
    pytest.importorskip("av")
    dataset = tmp_path / "ds"
    args = ["export_lerobot", "--store", str(store), "--out", str(dataset), "--no-video", "--no-progress",
            "--fps", "10"]  # the store records no rate
    assert main(args) == 2 and "--allow_unverified" in capsys.readouterr().err and not dataset.exists()
    assert main([*args, "--allow_unverified", "true"]) == 0 and dataset.is_dir()
    report.add("missing checksums: episodes recorded without checksums", commands=1, refused_exit_2=1, copied_when_told=1)
