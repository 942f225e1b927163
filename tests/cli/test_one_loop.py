"""One episode loop: eval_policy, sim_rollout (Ray), replay and real_recap play a seed identically.

Every entry point drives `RolloutHost`, and the policy's noise is seeded per (task, seed), so a
seed's episode does not depend on which other seeds ran, in which order, or on which host.
A RECAP checkpoint records how it acts (positive indicator, guidance weight), and every entry
point runs it that way by default.
"""

import json

import numpy as np
import pytest

from capsule_rollout.cli.run import main
from capsule_rollout.models.checkpoint import update_info
from capsule_rollout.policies.conditioning import CONDITIONING_INFO, Conditioning
from capsule_rollout.rollout.host_factory import DEFAULT_N_EXEC, resolve_acting
from capsule_rollout.stores.zarr_reader import ZarrEpisodeReader
from capsule_rollout.tabletop.sim_robot import SimRobotServer
from capsule_rollout.tabletop.tabletop_eval import play
from tests.policies.tiny import save_tiny_checkpoints

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]
COMPARED = ("action", "policy_action", "value", "state", "reward", "subtask_id")
SEEDS = [1_000_000, 1_000_001, 1_000_002]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return save_tiny_checkpoints(tmp_path_factory.mktemp("ckpt"))


@pytest.fixture(scope="module")
def recap_checkpoints(tmp_path_factory):
    """A tiny policy that records RECAP conditioning: positive indicator, guidance weight 2."""
    policy, critic = save_tiny_checkpoints(tmp_path_factory.mktemp("recap"), seed=1)
    update_info(policy, **{CONDITIONING_INFO: Conditioning("positive", 2.0).to_json()})
    return policy, critic


def _same(a, b, keys=COMPARED) -> bool:
    return all(np.array_equal(np.asarray(a.steps[k]), np.asarray(b.steps[k]), equal_nan=True) for k in keys)


def _episodes(reports) -> dict:
    return {r.episode.meta.seed: r.episode for r in reports}


def _store_episodes(store) -> dict:
    reader = ZarrEpisodeReader(store)
    return {reader.meta(i).seed: reader.episode(i) for i in range(len(reader))}


def test_a_seed_plays_the_same_through_eval_sim_rollout_and_replay_in_any_order(checkpoints, tmp_path):
    policy, critic = checkpoints
    kw = dict(family="pick_place", n_exec=2, critics=[critic])
    together = _episodes(play(policy, seeds=SEEDS, **kw)[0])
    shuffled = _episodes(play(policy, seeds=[SEEDS[2], 1_000_017, SEEDS[0], SEEDS[1]], **kw)[0])
    alone = _episodes(play(policy, seeds=[SEEDS[1]], **kw)[0])
    on_ray = _episodes(play(policy, seeds=SEEDS[::-1], actors=2, **kw)[0])
    assert all(_same(together[s], shuffled[s]) and _same(together[s], on_ray[s]) for s in SEEDS)
    assert _same(together[SEEDS[1]], alone[SEEDS[1]])
    assert not _same(together[SEEDS[0]], together[SEEDS[1]], keys=("action",))  # seeds do differ
    out = tmp_path / "run"
    assert main(["sim_rollout", "--actors", "2", "--episodes", "3", "--out", str(out), "--policy", policy,
                 "--critic", critic, "--n_exec", "2", "--no-progress", "--video", "false"]) == 0
    recorded = _store_episodes(out / "episodes.zarr")
    assert all(_same(together[s], recorded[s]) for s in SEEDS)
    assert main(["replay", "--store", str(out / "episodes.zarr"), "--episode", "pick_place-s1000001"]) == 0
    # and eval_policy's own figures are those episodes'
    summary = tmp_path / "eval.json"
    assert main(["eval_policy", "--policy", policy, "--episodes", "3", "--n_exec", "2", "--no-expert",
                 "--actors", "2", "--json", str(summary)]) == 0
    assert json.loads(summary.read_text())["policy"]["success_by_seed"] == [int(together[s].meta.success)
                                                                          for s in SEEDS]


def test_a_recap_checkpoint_deploys_with_its_conditioning_on_ray_and_on_the_robot(recap_checkpoints, tmp_path):
    policy, critic = recap_checkpoints
    kw = dict(family="pick_place", seeds=SEEDS[:2], n_exec=2, critics=[critic])
    evaluated = _episodes(play(policy, **kw)[0])  # eval_policy's loop, conditioning from the checkpoint
    explicit = _episodes(play(policy, advantage="positive", beta=2.0, **kw)[0])
    unconditioned = _episodes(play(policy, advantage="none", **kw)[0])
    assert all(_same(evaluated[s], explicit[s]) for s in SEEDS[:2])
    assert not any(_same(evaluated[s], unconditioned[s], keys=("action",)) for s in SEEDS[:2])

    out, summary = tmp_path / "sim", tmp_path / "sim.json"
    assert main(["sim_rollout", "--actors", "1", "--episodes", "2", "--out", str(out), "--policy", policy,
                 "--critic", critic, "--n_exec", "2", "--no-progress", "--video", "false",
                 "--json", str(summary)]) == 0
    data = json.loads(summary.read_text())
    assert (data["advantage"], data["beta"]) == ("positive", 2.0)
    on_ray = _store_episodes(out / "episodes.zarr")
    assert all(_same(evaluated[s], on_ray[s]) for s in SEEDS[:2])

    robot_out, robot_summary = tmp_path / "robot", tmp_path / "robot.json"
    with SimRobotServer(image_size=16, realtime=False) as server:  # what `sim_robot_server --no-realtime` serves
        assert main(["real_recap", "--robot.port", str(server.address[1]), "--episodes", "2",
                     "--seed", str(SEEDS[0]), "--out", str(robot_out), "--policy", policy, "--critic", critic,
                     "--n_exec", "2", "--operator", "none", "--json", str(robot_summary)]) == 0
    data = json.loads(robot_summary.read_text())
    assert (data["advantage"], data["beta"]) == ("positive", 2.0)
    on_robot = _store_episodes(robot_out / "episodes.zarr")
    # the robot's observations cross the wire (uint8 images, float32 state) unchanged: the same episode
    assert all(_same(evaluated[s], on_robot[s]) for s in SEEDS[:2])


def test_a_checkpoint_records_how_it_is_deployed_and_every_entry_point_acts_on_it(checkpoints, tmp_path):
    """`export_checkpoint --n_exec 3 --noise_scale 0.5`: eval_policy, sim_rollout and real_recap then execute 3
    actions of each chunk with half the noise unless told otherwise; a checkpoint without the record keeps the
    old defaults, 8 and 1 (this one's chunk is 4, so without the record these commands refuse to run it)."""
    policy, critic = checkpoints
    assert resolve_acting(policy) == (DEFAULT_N_EXEC, 1.0) == (8, 1.0) and resolve_acting(policy, 5, 0.1) == (5, 0.1)
    assert resolve_acting(str(tmp_path / "missing")) == (8, 1.0)  # check_spec says what is missing, not this
    shipped = str(tmp_path / "shipped")
    assert main(["export_checkpoint", "--src", policy, "--out", shipped, "--n_exec", "3", "--noise_scale", "0.5"]) == 0
    assert resolve_acting(shipped) == (3, 0.5) and resolve_acting(shipped, 2, 1.0) == (2, 1.0)
    again = str(tmp_path / "again")  # a re-export that sets one keeps the other
    assert main(["export_checkpoint", "--src", shipped, "--out", again, "--noise_scale", "0"]) == 0
    assert resolve_acting(again) == (3, 0.0)
    # refused before anything is written: longer than the chunk, no horizon, a negative scale
    for bad in (["--n_exec", "99"], ["--n_exec", "0"], ["--noise_scale", "-1"]):
        assert main(["export_checkpoint", "--src", policy, "--out", str(tmp_path / "bad"), *bad]) == 2
    assert not (tmp_path / "bad").exists()

    kw = dict(family="pick_place", seeds=SEEDS[:2], critics=[critic])
    deployed = _episodes(play(shipped, n_exec=3, noise_scale=0.5, **kw)[0])
    for other in (dict(n_exec=2, noise_scale=0.5), dict(n_exec=3, noise_scale=1.0)):  # both settings matter
        played = _episodes(play(shipped, **other, **kw)[0])
        assert not any(_same(deployed[s], played[s], keys=("action",)) for s in SEEDS[:2])

    summary = tmp_path / "eval.json"
    assert main(["eval_policy", "--policy", shipped, "--episodes", "2", "--no-expert", "--json", str(summary)]) == 0
    data = json.loads(summary.read_text())
    assert (data["n_exec"], data["noise_scale"]) == (3, 0.5)
    assert data["policy"]["success_by_seed"] == [int(deployed[s].meta.success) for s in SEEDS[:2]]

    out = tmp_path / "sim"
    assert main(["sim_rollout", "--actors", "1", "--episodes", "2", "--out", str(out), "--policy", shipped,
                 "--critic", critic, "--no-progress", "--video", "false", "--json", str(tmp_path / "sim.json")]) == 0
    assert [json.loads((tmp_path / "sim.json").read_text())[k] for k in ("n_exec", "noise_scale")] == [3, 0.5]
    assert all(_same(deployed[s], e) for s, e in _store_episodes(out / "episodes.zarr").items())
    assert main(["replay", "--store", str(out / "episodes.zarr"), "--episode", "pick_place-s1000001"]) == 0

    robot_out = tmp_path / "robot"
    with SimRobotServer(image_size=16, realtime=False) as server:
        assert main(["real_recap", "--robot.port", str(server.address[1]), "--episodes", "2", "--seed", str(SEEDS[0]),
                     "--out", str(robot_out), "--policy", shipped, "--critic", critic, "--operator", "none"]) == 0
    assert all(_same(deployed[s], e) for s, e in _store_episodes(robot_out / "episodes.zarr").items())
