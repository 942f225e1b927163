"""A policy served elsewhere plays episodes on the Ray actors: `sim_rollout --actors 2 --policy ws://...` records
the same episodes as the policy in process on one actor, and a replay plays their recorded actions bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from capsule_rollout.cli import replay, sim_rollout
from capsule_rollout.commands.configs import ReplayConfig, SimRolloutConfig
from capsule_rollout.learning.options import Models, Seeds
from capsule_rollout.rollout.host_config import file_safe
from capsule_rollout.rollout.host_factory import RunSpec
from capsule_rollout.rollout.policy_server import PolicyServer, serve_spec
from tests.rollout.test_remote_policy import CRITIC, ENV, POLICY, _episodes

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("ray_session")]


def test_ray_actors_play_a_served_policy_as_the_policy_in_process(tmp_path):
    def run(out, policy, actors):
        return sim_rollout.run(SimRolloutConfig(actors=actors, env=ENV, seeds=Seeds(first=0, count=4), repeats=2,
                                                out=str(out), model=Models(policy=policy, critic=CRITIC),
                                                video=False, progress=False))

    with PolicyServer(serve_spec(RunSpec(env=ENV, policy=POLICY))) as server:
        remote = run(tmp_path / "remote", server.url, 2)
        assert server.counts["connections"] >= 2 and server.counts["bad_requests"] == 0
    local = run(tmp_path / "local", POLICY, 0)
    assert remote.exit_code == local.exit_code == 0 and remote.summary["episodes"] == 8
    got, expected = _episodes(tmp_path / "remote" / "episodes.zarr"), _episodes(tmp_path / "local" / "episodes.zarr")
    assert sorted(got) == sorted(expected)
    for eid, episode in got.items():
        for key in ("action", "policy_action", "value", "state", "reward", "image_free"):
            assert np.array_equal(episode.steps[key], expected[eid].steps[key], equal_nan=True), (eid, key)
    store = str(tmp_path / "remote" / "episodes.zarr")
    result = replay.run(ReplayConfig(store=store, episode=f"{file_safe(ENV)}-s0000003-r1"))
    assert result.exit_code == 0 and result.summary["mode"] == "recorded_actions"
