"""Damaged zarr stores (single and sharded): a missing chunk, a flipped bit in every array, a chunk that
decodes to other values. Every read of a damaged episode is refused with `StoreDamageError` naming the
store, the episode and the array (a missing chunk as missing); nothing reads back silently wrong, and an
episode the damage does not reach reads as recorded. `consolidate`, `replay` and `export_lerobot` refuse
the damaged store the same way; `verify_store` reports every episode and exits 1. A store written before
checksums existed (`ZarrRecorder(checksums=False)` writes exactly that format: the same files, byte for
byte, as the recorder before this change) opens, reads, and is reported unverified.
"""

from __future__ import annotations

import json
from collections import Counter

import numcodecs
import numpy as np
import pytest

from capsule_rollout.cli.run import main
from capsule_rollout.stores import episode_schema as S
from capsule_rollout.stores.store_damage import StoreDamageError
from capsule_rollout.stores.zarr_reader import ZarrEpisodeReader
from capsule_rollout.stores.zarr_recorder import ZarrRecorder
from tests.reliability.store_damage import (
    copy,
    episode,
    first_shard,
    flip_bit,
    offsets,
    read_back,
    same_episode,
    sharded_store,
    single_store,
)

STEP_ARRAYS = ["image_front", *S.STEP_FIELDS]
META_ARRAYS = [*S.EPISODE_FIELDS, "episode_ends"]
CHUNK = {"image_front": "0.0.0.0", S.STATE: "0.0", S.ACTION: "0.0", S.POLICY_ACTION: "0.0",
         S.PRIVILEGED: "0.0"}  # else "0"
FLIPS = 8  # bit flips per array, spread over its chunk file


def chunk(array: str) -> str:
    return f"{'data' if array in STEP_ARRAYS else 'meta'}/{array}/{CHUNK.get(array, '0')}"


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    path = tmp_path_factory.mktemp("single") / "s.zarr"
    return path, single_store(path)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    root = tmp_path_factory.mktemp("sharded") / "store"
    return root, sharded_store(root)


def named(error: object, store, array: str, episode_id: str | None = None, why: str = "") -> bool:
    text = str(error)
    return (isinstance(error, StoreDamageError) and str(store) in text and array in text and why in text
            and (episode_id is None or episode_id in text))


def named_line(err: str, store, array: str, episode_id: str, why: str) -> bool:
    return all(x in err for x in (str(store), array, episode_id, why)) and "Traceback" not in err


def tally(report, section: str, outcomes: list, refused_named: int) -> None:
    kinds = Counter(kind for kind, _ in outcomes)
    report.add(section, reads_tried=len(outcomes), refused_naming_store_episode_array=refused_named,
               read_as_recorded=kinds["same"], silently_wrong=kinds["wrong"])


@pytest.mark.parametrize("array", ["state", "action", "image_front"])
def test_a_missing_chunk_of_a_single_store_is_refused_as_missing(single, tmp_path, array, report):
    path, recorded = single
    damaged = copy(path, tmp_path / "s.zarr")
    (damaged / chunk(array)).unlink()
    outcomes = read_back(damaged, recorded)
    good = sum(kind == "refused" and named(err, damaged, f"data/{array}", ep.meta.episode_id, "missing")
               for (kind, err), ep in zip(outcomes, recorded))
    tally(report, "store damage: a missing chunk (single and sharded)", outcomes, good)
    assert good == len(recorded), outcomes  # every episode has rows in that chunk


@pytest.mark.parametrize("array", ["state", "action", "image_front"])
def test_a_missing_chunk_of_a_shard_refuses_that_shards_episodes_only(sharded, tmp_path, array, report):
    root, recorded = sharded
    damaged = copy(root, tmp_path / "store")
    (first_shard(damaged) / chunk(array)).unlink()
    outcomes = read_back(damaged, recorded)
    good = sum(kind == "refused" and named(err, damaged, f"data/{array}", ep.meta.episode_id, "missing")
               for (kind, err), ep in zip(outcomes, recorded))
    tally(report, "store damage: a missing chunk (single and sharded)", outcomes, good)
    assert [kind for kind, _ in outcomes] == ["refused"] * 6 + ["same"] * 6, outcomes
    assert good == 6


def names_the_damage(error: object, store, array: str) -> bool:
    """The store, the array and an episode (a range of them when a per-episode array cannot be decoded, the
    episode's fields when one decodes to another value)."""
    if array in STEP_ARRAYS:
        return named(error, store, f"data/{array}", "episode 'ep-0000")
    return (named(error, store, f"meta/{array}", "episode") or named(error, store, "meta: checksum", "episode 'ep-")
            or named(error, store, "meta/episode_ends", "episode 'ep-"))


@pytest.mark.parametrize("array", STEP_ARRAYS + META_ARRAYS)
def test_a_flipped_bit_in_any_array_is_refused_never_read_silently_wrong(single, tmp_path, array, report):
    path, recorded = single
    counts, good = Counter(), 0
    for offset in offsets(path / chunk(array), FLIPS):
        damaged = copy(path, tmp_path / f"flip{offset}.zarr")
        flip_bit(damaged / chunk(array), offset, bit=offset % 8)
        outcomes = read_back(damaged, recorded)
        counts.update(kind for kind, _ in outcomes)
        for kind, err in outcomes:
            if kind == "refused":
                assert names_the_damage(err, damaged, array), err
                good += 1
    report.add("store damage: a flipped bit in each array", bit_flips=len(offsets(path / chunk(array), FLIPS)),
               reads_tried=sum(counts.values()), refused_naming_store_episode_array=good,
               read_as_recorded=counts["same"], silently_wrong=counts["wrong"])
    assert counts["wrong"] == 0, counts
    assert counts["refused"] > 0, counts  # the flips did damage something


@pytest.mark.parametrize("array", STEP_ARRAYS + [a for a in META_ARRAYS if a != "episode_ends"])
def test_a_chunk_that_decodes_to_other_values_is_refused(single, tmp_path, array, report):
    """One bit of one value changed and the chunk encoded again: it decodes, only the checksum can tell."""
    path, recorded = single
    damaged = copy(path, tmp_path / "s.zarr")
    file = damaged / chunk(array)
    meta = json.loads((file.parent / ".zarray").read_text())
    codec = numcodecs.get_codec(meta["compressor"])
    raw = np.frombuffer(codec.decode(file.read_bytes()), np.uint8).copy()
    row_bytes = np.dtype(meta["dtype"]).itemsize * int(np.prod(meta["chunks"][1:]))
    target = (2 * recorded[0].length + 1) * row_bytes + row_bytes // 2  # its second step (a number, not NaN)
    target = target if array in STEP_ARRAYS else 2 * np.dtype(meta["dtype"]).itemsize
    raw[target] ^= 1
    file.write_bytes(codec.encode(raw))
    outcomes = read_back(damaged, recorded)
    where = f"data/{array}" if array in STEP_ARRAYS else "meta: checksum"
    good = sum(kind == "refused" and named(err, damaged, where, "#2") for kind, err in outcomes)
    tally(report, "store damage: a chunk that decodes to other values", outcomes, good)
    assert [kind for kind, _ in outcomes] == ["same", "same", "refused"], outcomes
    assert good == 1, outcomes[2]


def test_consolidate_refuses_a_damaged_shard_and_copies_only_intact_episodes(sharded, tmp_path, capsys, report):
    root, recorded = sharded
    damaged = copy(root, tmp_path / "store")
    first = first_shard(damaged)
    other = next(p for p in (damaged / "shards").iterdir() if p != first)
    (other / chunk("state")).unlink()  # the second shard: episodes 6..11
    out = tmp_path / "out.zarr"
    code = main(["consolidate", "--store", str(damaged), "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 1 and named_line(err, damaged, "data/state", recorded[6].meta.episode_id, "missing")
    copied = ZarrEpisodeReader(out)
    assert len(copied) == 6 and all(same_episode(copied.episode(i), recorded[i]) for i in range(6))
    report.add("store damage: consolidate, replay, export_lerobot on a damaged store", runs=1, refused_naming_it=1,
               damaged_episodes_copied=0)


def test_export_lerobot_refuses_a_damaged_store_and_writes_nothing(single, tmp_path, capsys, report):
    pytest.importorskip("pyarrow")
    pytest.importorskip("av")
    path, recorded = single
    damaged = copy(path, tmp_path / "s.zarr")
    flip_bit(damaged / chunk("image_front"), 20)
    out = tmp_path / "dataset"
    # the store records no env (no rate): the rate is given
    code = main(["export_lerobot", "--store", str(damaged), "--out", str(out), "--no-progress", "--fps", "10"])
    err = capsys.readouterr().err
    assert code == 1 and named_line(err, damaged, "data/image_front", recorded[0].meta.episode_id, "cannot be decoded")
    assert not out.exists() and not list(tmp_path.glob(".dataset*"))
    report.add("store damage: consolidate, replay, export_lerobot on a damaged store", runs=1, refused_naming_it=1,
               damaged_episodes_copied=0)


def test_replay_refuses_a_recorded_episode_whose_chunk_is_missing(tmp_path, capsys, report):
    from tests.policies.tiny import save_tiny_checkpoints

    policy, critic = save_tiny_checkpoints(tmp_path / "ckpt")
    run = tmp_path / "run"
    assert main(["sim_rollout", "--actors", "0", "--episodes", "1", "--out", str(run), "--policy", policy,
                 "--critic", critic, "--n_exec", "2", "--no-progress", "--video", "false"]) == 0
    store = run / "episodes.zarr"
    (store / chunk("state")).unlink()
    capsys.readouterr()
    code = main(["replay", "--store", str(store), "--episode", "pick_place-s1000000"])
    err = capsys.readouterr().err
    assert code == 1 and named_line(err, store, "data/state", "pick_place-s1000000", "missing")
    report.add("store damage: consolidate, replay, export_lerobot on a damaged store", runs=1, refused_naming_it=1,
               damaged_episodes_copied=0)


def test_verify_store_reports_every_episode_and_exits_1_on_damage(single, sharded, tmp_path, report):
    path, recorded = single
    assert main(["verify_store", "--store", str(path), "--no-progress", "--json", str(tmp_path / "ok.json")]) == 0
    clean = json.loads((tmp_path / "ok.json").read_text())
    assert (clean["ok"], clean["damaged"], clean["unverified"]) == (3, 0, 0)
    damaged = copy(path, tmp_path / "s.zarr")
    (damaged / chunk("action")).unlink()
    flip_bit(damaged / chunk("image_front"), 40)
    assert main(["verify_store", "--store", str(damaged), "--no-progress", "--json", str(tmp_path / "d.json")]) == 1
    found = json.loads((tmp_path / "d.json").read_text())
    assert found["damaged"] == 3 and found["repair"].startswith("nothing repaired")
    for verdict, ep in zip(found["verdicts"], recorded):
        assert verdict["episode_id"] == ep.meta.episode_id and verdict["status"] == "damaged"
        assert "missing" in verdict["problems"]["data/action"] and "data/image_front" in verdict["problems"]
    root, recorded = sharded
    store = copy(root, tmp_path / "store")
    shard = first_shard(store)
    (shard / chunk("state")).unlink()
    assert main(["verify_store", "--store", str(store), "--no-progress", "--json", str(tmp_path / "sh.json")]) == 1
    found = json.loads((tmp_path / "sh.json").read_text())
    assert (found["ok"], found["damaged"], found["unverified"]) == (6, 6, 0)
    where = f"shards/{shard.name}/data/state"
    assert [v["episode_id"] for v in found["verdicts"] if v["status"] == "damaged"] == \
        [ep.meta.episode_id for ep in recorded[:6]]
    assert all("missing" in v["problems"][where] for v in found["verdicts"][:6])
    report.add("store damage: verify_store", stores=3, damaged_episodes=3 + 6, reported_damaged=found["damaged"] + 3,
               intact_reported_ok=found["ok"] + clean["ok"])


def test_a_store_without_checksums_opens_reads_and_is_reported_unverified(tmp_path, report):
    path = tmp_path / "old.zarr"
    recorded = single_store(path, checksums=False)
    assert not (path / "meta/checksums").exists()  # the format written before checksums
    reader = ZarrEpisodeReader(path)
    assert all(same_episode(reader.episode(i), ep) for i, ep in enumerate(recorded))
    assert not any(reader.verified(i) for i in range(len(reader)))
    assert main(["verify_store", "--store", str(path), "--no-progress", "--json", str(tmp_path / "v.json")]) == 0
    assert json.loads((tmp_path / "v.json").read_text())["unverified"] == 3
    with ZarrRecorder(path) as recorder:  # appended to by this code: the new episode has checksums
        recorder.write(episode(3))
    reader = ZarrEpisodeReader(path)
    assert [reader.verified(i) for i in range(4)] == [False, False, False, True]
    assert all(same_episode(reader.episode(i), ep) for i, ep in enumerate([*recorded, episode(3)]))
    assert main(["verify_store", "--store", str(path), "--no-progress", "--json", str(tmp_path / "v.json")]) == 0
    found = json.loads((tmp_path / "v.json").read_text())
    assert (found["ok"], found["unverified"]) == (1, 3)
    report.add("store damage: stores without checksums", stores=1, episodes_read=4, reported_unverified=found["unverified"])
    (path / chunk("image_front")).unlink()  # an old episode's missing chunk cannot be told: read as zeros
    assert main(["verify_store", "--store", str(path), "--no-progress", "--json", str(tmp_path / "v.json")]) == 1
    found = json.loads((tmp_path / "v.json").read_text())
    assert [v["status"] for v in found["verdicts"]] == ["unverified"] * 3 + ["damaged"]
