"""A sharded store from the command line: consolidate, and the entry points that read stores (train_policy,
label_advantages, replay, export_lerobot) reading a sharded store as the single store it equals; sim_rollout
--shards true without Ray, its resume, and damaged input refused without losing what is recorded."""

import json

import numpy as np
import pytest

from capsule_rollout.cli.run import main
from capsule_rollout.learning.policy_data import load_training_arrays
from capsule_rollout.stores.shard_manifest import MANIFEST_FILE
from capsule_rollout.stores.sharded_reader import ShardedEpisodeReader, open_episode_reader
from capsule_rollout.stores.sharded_store import ShardedStore, ShardWriter
from capsule_rollout.stores.zarr_reader import ZarrEpisodeReader
from capsule_rollout.tabletop.tokenizer import Tokenizer
from tests.policies.tiny import save_tiny_checkpoints
from tests.rollout.fakes import assert_same_episode


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """Three demonstrations as a single store, and the same episodes spread over two shards."""
    base = tmp_path_factory.mktemp("stores")
    single, sharded = base / "demos.zarr", base / "sharded.zarr"
    assert main(["collect_demos", "--episodes", "3", "--out", str(single), "--no-progress"]) == 0
    with ShardedStore(sharded) as store:
        writers = [ShardWriter(sharded, prefix=f"a{i:03d}") for i in range(2)]
        for i, episode in enumerate(ZarrEpisodeReader(single).episodes()):
            store.commit(writers[i % 2].write(episode))
        for writer in writers:
            writer.close()
    return single, sharded


def assert_same_store(a, b):
    assert a.episode_ids == b.episode_ids and a.keys == b.keys and np.array_equal(a.ends, b.ends)
    whole_a, whole_b = a.steps(0, a.n_steps), b.steps(0, b.n_steps)
    for key in a.keys:
        assert whole_a[key].dtype == whole_b[key].dtype
        assert np.array_equal(whole_a[key], whole_b[key], equal_nan=whole_a[key].dtype.kind == "f"), key
    for i in range(len(a)):
        assert_same_episode(a.episode(i), b.episode(i))


def test_consolidate_writes_the_single_store_and_refuses_an_existing_out(stores, tmp_path, capsys):
    single, sharded = stores
    out, summary = tmp_path / "single.zarr", tmp_path / "c.json"
    args = ["consolidate", "--store", f"file://{sharded}", "--out", str(out), "--no-progress"]
    assert main([*args, "--json", str(summary)]) == 0
    assert json.loads(summary.read_text())["episodes"] == 3
    assert_same_store(ZarrEpisodeReader(out), ZarrEpisodeReader(single))
    assert main(args) == 2 and "already exists: pass --resume true" in capsys.readouterr().err
    assert main([*args, "--resume", "true", "--json", str(summary)]) == 0
    assert json.loads(summary.read_text())["copied"] == 0
    assert main(["consolidate", "--store", "s3://bucket/episodes", "--out", str(tmp_path / "x.zarr")]) == 2
    assert "scheme 's3' is not supported" in capsys.readouterr().err
    assert main(["consolidate", "--store", str(tmp_path / "none"), "--out", str(tmp_path / "x.zarr")]) == 2
    assert "not an episode store" in capsys.readouterr().err
    assert not (tmp_path / "x.zarr").exists()


def test_training_and_labelling_read_a_sharded_store_as_the_single_one(stores, tmp_path):
    single, sharded = stores
    tokenizer = Tokenizer()
    a, b = (load_training_arrays(str(p), ("front",), tokenizer) for p in (sharded, single))
    for key in ("images", "states", "actions", "tokens", "episode_ends", "actors", "rewards"):
        x, y = (v["images"]["front"] if key == "images" else v[key] for v in (a, b))
        assert np.array_equal(x, y), key
    sidecars = tmp_path / "sharded.npz", tmp_path / "single.npz"
    for store, sidecar in zip((f"file://{sharded}", single), sidecars):
        assert main(["label_advantages", "--data", str(store), "--out", str(sidecar)]) == 0
    with np.load(sidecars[0]) as x, np.load(sidecars[1]) as y:
        for key in ("advantage", "indicator", "value", "episode_ids"):
            assert np.array_equal(x[key], y[key]), key
    summary = tmp_path / "t.json"
    assert main(["train_policy", "--data", str(sharded), "--out", str(tmp_path / "policy"), "--steps", "2",
                 "--batch_size", "4", "--noise_samples", "1", "--eval_every", "2", "--eval_episodes", "1",
                 "--no-progress", "--json", str(summary)]) == 0
    assert [e["step"] for e in json.loads(summary.read_text())["evals"]] == [2]


def test_export_lerobot_reads_a_sharded_store(stores, tmp_path):
    pytest.importorskip("pyarrow")
    pytest.importorskip("av")
    _, sharded = stores
    dataset, back = tmp_path / "ds", tmp_path / "back.zarr"
    # episodes copied shard by shard, by hand: the store records no env (no rate), so the rate is given
    assert main(["export_lerobot", "--store", str(sharded), "--out", str(dataset), "--no-video", "--no-progress",
                 "--fps", "10"]) == 0
    assert main(["import_lerobot", "--src", str(dataset), "--out", str(back), "--no-progress"]) == 0
    source, imported = open_episode_reader(sharded), ZarrEpisodeReader(back)
    assert imported.episode_ids == source.episode_ids
    for i in range(len(source)):
        for key in ("state", "action", "image_front"):
            assert np.array_equal(imported.episode(i).steps[key], source.episode(i).steps[key]), key


def test_sim_rollout_sharded_in_process_resumes_replays_and_refuses_damage(tmp_path, capsys):
    policy, critic = save_tiny_checkpoints(tmp_path / "ckpt")
    out, summary = tmp_path / "run", tmp_path / "s.json"
    args = ["sim_rollout", "--actors", "0", "--episodes", "3", "--out", f"file://{out}", "--policy", policy,
            "--critic", critic, "--n_exec", "2", "--no-progress", "--video", "false", "--shards", "true"]
    assert main([*args, "--json", str(summary)]) == 0
    data = json.loads(summary.read_text())
    assert (data["episodes"], data["sharded"], data["orphans"]) == (3, True, 0)
    store = out / "episodes.zarr"
    reader = open_episode_reader(store)
    assert isinstance(reader, ShardedEpisodeReader) and len(reader) == 3
    assert main(["replay", "--store", str(store), "--episode", reader.episode_ids[1]]) == 0  # bit-identical
    assert main([*args[:-2], "--shards", "false"]) == 2
    assert "is a sharded store: resume it with --shards true" in capsys.readouterr().err
    assert main([*args, "--episodes", "4", "--json", str(summary)]) == 0  # resumed: only the new seed runs
    assert json.loads(summary.read_text())["episodes"] == 1 and len(open_episode_reader(store)) == 4
    manifest = store / MANIFEST_FILE
    lines = manifest.read_bytes().splitlines(keepends=True)
    damaged = b"".join([*lines[:3], b"{oops\n", *lines[3:]])
    manifest.write_bytes(damaged)
    assert main([*args, "--episodes", "5"]) == 2
    assert "line 4 is not a valid manifest entry" in capsys.readouterr().err
    assert main(["consolidate", "--store", str(store), "--out", str(tmp_path / "c.zarr")]) == 2
    assert "line 4 is not a valid manifest entry" in capsys.readouterr().err
    assert manifest.read_bytes() == damaged and not (tmp_path / "c.zarr").exists()
    manifest.write_bytes(b"".join(lines))  # repaired by hand: all four episodes are there
    assert open_episode_reader(store).episode_ids == reader.episode_ids + ["pick_place-s1000003"]
