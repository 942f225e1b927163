"""sim_rollout on local Ray (2 actors), a killed actor, and bit-exact replay."""

import json
import os

import numpy as np
import pytest

from experiments.run import main
from rollout.zarr_reader import ZarrEpisodeReader
from tests.policies.tiny import save_tiny_checkpoints

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return save_tiny_checkpoints(tmp_path_factory.mktemp("ckpt"))


def test_rollout_records_every_episode_once_even_when_an_actor_dies(checkpoints, tmp_path):
    policy, critic = checkpoints
    out, summary = tmp_path / "run", tmp_path / "s.json"
    marker = tmp_path / "crashed"
    victim = "pick_place-s1000002"
    args = ["sim_rollout", "--actors", "2", "--episodes", "5", "--out", str(out), "--policy", policy,
            "--critic", critic, "--n_exec", "2", "--no-progress", "--json", str(summary), "--crash", victim, "3", str(marker)]
    assert main(args) == 0
    data = json.loads(summary.read_text())
    assert marker.exists()  # the actor really died mid-episode
    assert data["actor_failures"] == 1 and data["resubmitted"] == 1
    assert data["episodes"] == 5 and set(data["stop_reasons"]) <= {"timeout", "success"}
    assert {"successes", "success_rate", "reset_ms_median", "steps_per_s", "store"} <= set(data)
    reader = ZarrEpisodeReader(data["store"])
    ids = reader.episode_ids
    assert sorted(ids) == [f"pick_place-s{1000000 + i:07d}" for i in range(5)]  # each exactly once
    assert (out / "rollout.png").stat().st_size > 0 and (out / "episode.gif").stat().st_size > 0
    # replay is bit-exact, also for the episode whose first attempt was killed
    for episode in (ids[0], victim):
        assert main(["replay", "--store", data["store"], "--episode", episode, "--json", str(tmp_path / "r.json")]) == 0
        assert json.loads((tmp_path / "r.json").read_text())["exact"]
    # running again skips what is recorded
    assert main(args[:-4] + ["--json", str(summary)]) == 0
    assert json.loads(summary.read_text())["episodes"] == 0 and len(ZarrEpisodeReader(data["store"])) == 5


def test_checkpoints_that_do_not_fit_are_refused_before_ray_starts(checkpoints, tmp_path):
    policy, critic = checkpoints
    with pytest.raises(ValueError, match="n_exec 8 exceeds"):
        main(["sim_rollout", "--out", str(tmp_path), "--policy", policy, "--critic", critic])
    with pytest.raises(FileNotFoundError, match="critic checkpoint"):
        main(["sim_rollout", "--out", str(tmp_path), "--policy", policy, "--critic", str(tmp_path / "none")])


def test_replay_detects_a_changed_recording_and_bad_arguments(checkpoints, tmp_path):
    policy, critic = checkpoints
    out = tmp_path / "run"
    assert main(["sim_rollout", "--actors", "1", "--episodes", "1", "--out", str(out), "--policy", policy,
                 "--critic", critic, "--n_exec", "2", "--no-progress", "--video", "false"]) == 0
    store = out / "episodes.zarr"
    import zarr

    group = zarr.open_group(str(store), mode="r+", zarr_format=2)
    actions = group["data/action"]
    tampered = np.asarray(actions[:]).copy()
    tampered[0, 0] += 0.5
    actions[:] = tampered
    assert main(["replay", "--store", str(store), "--episode", "pick_place-s1000000"]) == 1
    with pytest.raises(ValueError, match="not in"):
        main(["replay", "--store", str(store), "--episode", "nope"])


class _PlannerActor:
    """A planner in its own Ray worker process, writing into a shared subtask channel."""

    def __init__(self, channel):
        self.channel = channel  # unpickled: attached to the same shared-memory block

    def plan(self, texts):
        versions = [self.channel.publish(t, i) for i, t in enumerate(texts)]
        return versions[-1], os.getpid()


def test_a_planner_in_its_own_ray_actor_hands_off_through_shared_memory(ray_session):
    from rollout.handoff import SubtaskChannel

    with SubtaskChannel.create_shared() as channel:
        planner = ray_session.remote(_PlannerActor).options(num_cpus=0).remote(channel)
        version, pid = ray_session.get(planner.plan.remote(["pick up the red block", "place it on the blue pad"]))
        assert pid != os.getpid()  # really another process
        sub = channel.read()  # nothing was sent back but the version: the text is in the shared block
        assert (sub.version, sub.index, sub.text) == (version, 1, "place it on the blue pad")
        ray_session.kill(planner)
