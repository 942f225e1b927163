"""The driver recording sharded without Ray (actors=0: this process writes its own shard): only manifest entries
and image-free episodes come back, and a process killed between its shard write and the commit, then resumed,
records every episode exactly once."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from capsule_rollout.rollout.host_factory import RunSpec
from capsule_rollout.rollout.ray_rollout import run_rollouts
from capsule_rollout.rollout.rollout_actor import WorkItem
from capsule_rollout.rollout.rollout_host import HostConfig
from capsule_rollout.stores.sharded_reader import open_episode_reader
from capsule_rollout.stores.sharded_store import ShardedStore
from capsule_rollout.stores.zarr_reader import ZarrEpisodeReader
from tests.policies.tiny import save_tiny_checkpoints

ROOT = Path(__file__).resolve().parents[2]
IDS = [f"pick_place-s{s:07d}" for s in range(1_000_000, 1_000_004)]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return save_tiny_checkpoints(tmp_path_factory.mktemp("ckpt"))


def _items():
    return [WorkItem(episode_id, 1_000_000 + i) for i, episode_id in enumerate(IDS)]


def test_killed_after_the_shard_write_then_resumed_records_each_episode_once(checkpoints, tmp_path):
    policy, critic = checkpoints
    root, marker, victim = tmp_path / "episodes.zarr", tmp_path / "killed", IDS[2]
    child = subprocess.run([sys.executable, "-m", "tests.rollout.sharded_driver", policy, critic, str(root), "4",
                            victim, str(marker)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert child.returncode == 1 and marker.read_text() == "exit_after_record\n", child.stderr
    assert open_episode_reader(root).episode_ids == IDS[:2]  # the victim is in the shard, not in the store
    (shard,) = (root / "shards").iterdir()
    assert ZarrEpisodeReader(shard).episode_ids == IDS[:3]
    spec = RunSpec(env="tabletop:pick_place", policy=policy, critic=critic, host=HostConfig(n_exec=2, max_steps=6))
    with ShardedStore(root) as store:  # the driver restarted: the manifest says what is done
        assert [o[2] for o in store.orphans()] == [victim]
        reports, stats = run_rollouts(spec, _items(), actors=0, recorder=store, done=store.outcomes())
    assert stats.episodes == 2 and [r.item.episode_id for r in reports] == IDS[2:]
    for report in reports:  # the images stayed in the shard; the entry says where
        assert report.shard is not None and report.shard.episode_id == report.episode.meta.episode_id
        assert report.episode.image_keys == [] and "action" in report.episode.steps
    reader = open_episode_reader(root)
    assert reader.episode_ids == IDS and len(reader.shards) == 2  # each exactly once, over two shards
    first_copy = ZarrEpisodeReader(shard).episode(2)  # the orphan: the same seed played the same way
    rerun = reader.episode(2)
    assert rerun.meta.episode_id == victim and rerun.meta.length == first_copy.meta.length
    for key in ("action", "image_front"):
        assert np.array_equal(rerun.steps[key], first_copy.steps[key])
