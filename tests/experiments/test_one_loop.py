"""One episode loop: eval_policy, sim_rollout (Ray), replay and real_recap play a seed identically.

Every entry point drives `RolloutHost`, and the policy's noise is seeded per (task, seed), so a
seed's episode does not depend on which other seeds ran, in which order, or on which host.
A RECAP checkpoint records how it acts (positive indicator, guidance weight), and every entry
point runs it that way by default.
"""

import json

import numpy as np
import pytest

from envs.robot_bridge import SimRobotServer
from experiments.run import main
from learning.evaluation import play
from models.checkpoint import update_info
from policies.flow_policy import CONDITIONING_INFO, Conditioning
from rollout.zarr_reader import ZarrEpisodeReader
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
