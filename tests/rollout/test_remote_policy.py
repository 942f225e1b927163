"""A policy served elsewhere as this project's rollout policy (`--policy ws://host:port`): the same episodes as
the policy in process, recorded and replayed from the recorded actions; never captured mid-episode (restores and
branch values refused, saying why); and every way a server can fail ends the episode with a clear error, never a
hang or an action that is not a finite chunk of the right shape reaching the env."""

from __future__ import annotations

import signal
import socket

import numpy as np
import pytest

from capsule_rollout.capsules import CapsuleMismatchError, restore
from capsule_rollout.cli import replay, sim_rollout
from capsule_rollout.cli.run import main
from capsule_rollout.commands.configs import ReplayConfig, SimRolloutConfig
from capsule_rollout.learning.branch_values import BranchPlan, collect_branches
from capsule_rollout.learning.ceiling_measure import BoundaryKeeper, judge_state
from capsule_rollout.learning.options import Acting, Models, Seeds
from capsule_rollout.policies import openpi_wire as W
from capsule_rollout.policies.remote_policy import RemotePolicy
from capsule_rollout.policies.websocket_policy_client import RemotePolicyError, WebsocketPolicyClient
from capsule_rollout.rollout.branching import NotCapturableError, branch_episode, branch_value
from capsule_rollout.rollout.host_config import file_safe
from capsule_rollout.rollout.host_factory import RunSpec, build_host
from capsule_rollout.rollout.observer import EpisodeObserver
from capsule_rollout.rollout.policy_server import PolicyServer, serve_spec
from capsule_rollout.rollout.rollout_host import HostConfig
from capsule_rollout.stores.sharded_reader import open_episode_reader
from tests.rollout.fake_policy_servers import FakePolicyServer, chunk, good_then
from tests.rollout.policy_server_process import start_server

ENV = "examples.own_env_and_policy:make_env"
POLICY = "examples.own_env_and_policy:make_policy"
CRITIC = "tests.rollout.test_plug_in:Distance"


@pytest.fixture(scope="module")
def server():
    with PolicyServer(serve_spec(RunSpec(env=ENV, policy=POLICY))) as server:
        yield server


def _episodes(store):
    reader = open_episode_reader(store)
    return {eid: reader.episode(i) for i, eid in enumerate(reader.episode_ids)}


def _sim_rollout(out, policy, **kw):
    config = SimRolloutConfig(actors=0, env=ENV, seeds=Seeds(first=0, count=3), repeats=2, out=str(out),
                              model=Models(policy=policy, critic=CRITIC), video=False, progress=False, **kw)
    return sim_rollout.run(config)


def test_sim_rollout_through_a_server_plays_the_in_process_episodes_and_replays_them(server, tmp_path):
    remote, local = _sim_rollout(tmp_path / "remote", server.url), _sim_rollout(tmp_path / "local", POLICY)
    assert remote.exit_code == local.exit_code == 0
    got, expected = _episodes(tmp_path / "remote" / "episodes.zarr"), _episodes(tmp_path / "local" / "episodes.zarr")
    assert sorted(got) == sorted(expected) and len(got) == 6
    for eid, episode in got.items():
        assert episode.meta.stop_reason == expected[eid].meta.stop_reason
        for key in ("action", "policy_action", "value", "state", "reward", "image_free"):
            assert np.array_equal(episode.steps[key], expected[eid].steps[key], equal_nan=True), (eid, key)
    assert remote.summary["reset_kinds"] == {"cold": 3, "restore": 3}  # repeats restored the initial capsules
    # the server is not asked: the recorded actions are played into the env, compared bit for bit
    for eid in (f"{file_safe(ENV)}-s0000001", f"{file_safe(ENV)}-s0000002-r1"):
        result = replay.run(ReplayConfig(store=str(tmp_path / "remote" / "episodes.zarr"), episode=eid))
        assert result.exit_code == 0 and result.summary["mode"] == "recorded_actions"
        assert all(result.summary["checks"].values())


class Keep(EpisodeObserver):
    """Capsules at the chunk starts of an episode."""

    def __init__(self):
        self.capsules = {}

    def chunk_start(self, host, obs):
        self.capsules[host.env.steps] = host.snapshot()


def test_a_capsule_says_the_policy_cannot_be_captured_and_only_an_episode_start_restores(server):
    keep = Keep()
    host = build_host(RunSpec(env=ENV, policy=server.url, critic=CRITIC), observers=[keep])
    first = host.run_episode(0)
    start, later = keep.capsules[0], keep.capsules[8]
    assert start.meta.fingerprint["policy/capturable"].startswith("no")
    with pytest.raises(CapsuleMismatchError, match="policy server .*after 1 chunk.*replays its recorded actions"):
        restore(host.arena, later)
    restore(host.arena, start)  # an episode start: the next request starts the episode's stream over
    assert host.run_episode(0).meta.length == first.meta.length
    asked = server.counts["requests"]
    with pytest.raises(NotCapturableError, match="policy server"):
        branch_value(host, later, seed=0, step=8, branches=2)
    with pytest.raises(NotCapturableError):
        branch_episode(host, 0, steps=(8,), branches=2)
    with pytest.raises(NotCapturableError):
        judge_state(host, BoundaryKeeper(4), 0, 4, branches=2, critic=True)
    with pytest.raises(NotCapturableError, match="label the recorded episodes with a critic"):
        collect_branches(RunSpec(env=ENV, policy=server.url), "unused.zarr", ["x"], BranchPlan(), max_steps=10,
                         actors=0)
    assert server.counts["requests"] == asked  # refused before anything was played
    host.close()


def test_remote_sources_are_checked_before_anything_plays(server, tmp_path):
    with pytest.raises(ValueError, match="not on this machine: give a token"):
        WebsocketPolicyClient("ws://10.9.8.7:8000")  # no connection is attempted
    with pytest.raises(ValueError, match="is a policy server; a critic is a checkpoint"):
        build_host(RunSpec(env=ENV, policy=POLICY, critic=server.url))
    config = SimRolloutConfig(actors=0, env=ENV, out=str(tmp_path / "x"), model=Models(policy=server.url),
                              act=Acting(advantage="positive"), progress=False)
    with pytest.raises(ValueError, match="RECAP conditioning"):
        sim_rollout.run(config)
    with socket.socket() as s:  # a port where nothing listens: one error line, exit 2
        s.bind(("127.0.0.1", 0))
        nowhere = f"ws://127.0.0.1:{s.getsockname()[1]}"
    assert main(["sim_rollout", "--env", ENV, "--policy", nowhere, "--actors", "0", "--out", str(tmp_path / "y")]) == 2
    asked = server.counts["requests"]
    assert main(["value_ceiling", "--env", ENV, "--model.policy", server.url, "--episodes", "2"]) == 2
    assert server.counts["requests"] == asked


def test_slots_each_hold_a_connection_and_replay_with_the_recorded_actions(server, tmp_path):
    assert _sim_rollout(tmp_path / "slots", server.url, slots=2).exit_code == 0
    result = replay.run(ReplayConfig(store=str(tmp_path / "slots" / "episodes.zarr"), episode=f"{ENV}-s0000002"))
    # the id as written with the task (`module:factory`) finds its file-safe form in the store
    assert result.exit_code == 0 and result.summary["mode"] == "recorded_actions"


def _fault(answer, *, metadata=None, seed=0, **options):
    """One episode against a server that answers the first chunk and then `answer`: (result, env actions)."""
    with FakePolicyServer(answer, metadata) as fake:
        host = build_host(RunSpec(env=ENV, policy=fake.url(**options), host=HostConfig(n_exec=8)))
        sent = []
        step = host.env.step
        host.env.step = lambda action: sent.append(np.array(action)) or step(action)
        result = host.run_episode(seed)
        host.close()
    return result, np.array(sent)


@pytest.mark.parametrize("bad, reason, why", [
    (lambda r: None, "error", "no answer (an action chunk) within 1 s: the server is stalled"),
    (lambda r: b"\xc1", "error", "malformed answer"),
    (lambda r: W.encode([1, 2]), "error", "a map with 'actions' expected, got list"),
    (lambda r: W.encode({"action": np.zeros((8, 2), np.float32)}), "error", "got ['action']"),
    (lambda r: W.encode({"actions": {b"__ndarray__": True, b"data": b"", b"dtype": "|O", b"shape": [0]}}), "error",
     "dtype '|O'"),
    (lambda r: "Traceback: the model fell over", "error", "answered an error: Traceback: the model fell over"),
    (lambda r: W.encode({"actions": "left"}), "safety", "must be a numeric array"),
    (lambda r: chunk(np.zeros((8, 3), np.float32)), "safety", "actions of shape (8, 3)"),
    (lambda r: chunk(np.zeros((4, 2), np.float32)), "safety", "actions of shape (4, 2)"),
    (lambda r: chunk(np.where(np.arange(16).reshape(8, 2) == 5, np.nan, 0.1).astype(np.float32)), "safety",
     "non-finite action nan at row 2"),
    (lambda r: chunk(np.full((8, 2), 1e300)), "safety", "non-finite action 1e+300"),  # inf as float32
])
def test_a_failing_server_ends_the_episode_and_nothing_bad_reaches_the_env(bad, reason, why):
    result, sent = _fault(good_then(bad))
    assert result.meta.stop_reason == reason and why in result.error, result.error
    assert result.meta.length == 8 and len(sent) == 8  # the first chunk's actions only
    assert np.isfinite(sent).all() and np.array_equal(sent, np.zeros((8, 2), np.float32))


def test_a_server_that_never_answers_at_all():
    result, sent = _fault(lambda r: None)
    assert result.episode is None and "no answer" in result.error and len(sent) == 0


def test_stalled_handshakes_and_metadata_fail_the_connection_with_a_clear_error():
    with socket.socket() as listener:  # accepts TCP, never speaks websocket
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(RemotePolicyError, match="cannot connect"):
            WebsocketPolicyClient(f"ws://127.0.0.1:{port}?connect_timeout_s=0.5")
    with FakePolicyServer(lambda r: None, metadata=[1]) as fake:
        with pytest.raises(RemotePolicyError, match="not openpi's metadata map"):
            WebsocketPolicyClient(fake.url())


def test_a_foreign_server_gets_openpi_keys_and_its_chunk_length_is_asked(tmp_path):
    """A server that announces nothing: the address's key names, the chunk length from one probe."""
    with FakePolicyServer(lambda r: chunk(np.full((5, 2), 0.25, np.float32))) as fake:
        url = f"ws://127.0.0.1:{fake.port}/?keys=openpi&timeout_s=5"
        host = build_host(RunSpec(env=ENV, policy=url, host=HostConfig(n_exec=5)))
        assert isinstance(host.policy, RemotePolicy) and host.policy.spec.chunk_length == 5
        result = host.run_episode(1)
        host.close()
        probe, first = fake.requests[0], fake.requests[1]
    assert result.meta.length > 5 and np.all(result.episode.steps["action"] == 0.25)
    assert set(probe) == {"observation/state", "observation/image", "observation"}
    assert W.EPISODE_SEED not in first  # the server did not announce it


def test_a_server_killed_mid_episode_ends_it_and_the_next_cannot_start():
    proc, url = start_server("--env", ENV, "--policy", POLICY)

    class Kill(EpisodeObserver):
        def step(self, host, tick):
            if host.env.steps == 20:
                proc.send_signal(signal.SIGKILL)
                proc.wait()

    try:
        host = build_host(RunSpec(env=ENV, policy=url + "?timeout_s=5&connect_timeout_s=2",
                                   host=HostConfig(n_exec=8)), observers=[Kill()])
        result = host.run_episode(0)
        assert result.meta.stop_reason == "error" and result.meta.length == 24, result.error
        assert "connection was lost" in result.error
        assert np.isfinite(result.episode.steps["action"]).all()
        again = host.run_episode(1)
        assert again.episode is None and "cannot connect" in again.error
        host.close()
    finally:
        proc.kill()
        proc.wait()
