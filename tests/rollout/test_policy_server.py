"""The policy server's side of openpi's protocol: metadata first, naming exactly what a client sends; each
request checked against it (one text frame saying what is wrong, then the connection closed, as openpi's server
does); a session per connection with the policy's own noise stream; a token beyond loopback."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import websockets
import websockets.sync.client

from capsule_rollout.capsules import Arena
from capsule_rollout.envs.suites import make_env
from capsule_rollout.policies import openpi_wire as W
from capsule_rollout.rollout.host_factory import RunSpec
from capsule_rollout.rollout.policy_server import PolicyServer, serve_spec
from capsule_rollout.rollout.sources import as_rollout_policy, make_from_factory

ENV = "examples.own_env_and_policy:make_env"
POLICY = "examples.own_env_and_policy:make_policy"


@pytest.fixture(scope="module")
def served():
    return serve_spec(RunSpec(env=ENV, policy=POLICY))


@pytest.fixture(scope="module")
def server(served):
    with PolicyServer(served) as server:
        yield server


@pytest.fixture(scope="module")
def observations():
    env = make_env(ENV, cameras=("free",))
    obs, _ = env.reset(seed=3)
    seen = [obs]
    for _ in range(2):
        obs = env.step(np.array([0.5, -0.3], np.float32))[0]
        seen.append(obs)
    env.close()
    return [{k: v for k, v in o.items() if k in ("state", "image_free", "observation")} for o in seen]


def _connect(server, path="", headers=None):
    ws = contextlib.ExitStack().enter_context(websockets.sync.client.connect(
        server.url + path, compression=None, proxy=None, additional_headers=headers))
    return ws, W.decode(ws.recv(timeout=5), max_bytes=1 << 20)


def _ask(ws, request):
    ws.send(W.encode(request))
    return ws.recv(timeout=5)


def in_process_chunks(observations, seed: int, prompt: str | None = None, episode_seed_at: int | None = None):
    """The example policy in this process, fed the same observations after reset(seed)."""
    env = make_env(ENV, cameras=("free",))
    policy = as_rollout_policy(make_from_factory(POLICY, "policy"), env)
    Arena([policy]).allocate()
    policy.reset(seed)
    if prompt is not None:
        policy.set_language(prompt)
    chunks = [policy.load_observation(o) or policy.act().numpy().copy() for o in observations]
    env.close()
    return chunks


def test_metadata_names_the_observation_the_prompt_and_the_chunk(server):
    ws, meta = _connect(server)
    ws.close()
    assert meta["observation"] == {"state": {"key": "state", "shape": [6], "dtype": "float32"},
                                   "image_free": {"key": "image_free", "shape": [64, 64, 3], "dtype": "uint8"},
                                   "observation": {"key": "observation", "shape": [6], "dtype": "float64"}}
    assert meta["prompt"]["key"] == "prompt" and meta["actions"] == {"key": "actions", "shape": [8, 2],
                                                                      "dtype": "float32"}
    assert meta["action_horizon"] == 8 and meta["action_dim"] == 2 and "episode_seed" in meta


def test_a_session_answers_the_policys_own_chunks(server, observations):
    ws, _ = _connect(server, "/?seed=5")
    got = [W.decode(_ask(ws, {**o, "prompt": "push"}), max_bytes=1 << 20) for o in observations]
    ws.close()
    expected = in_process_chunks(observations, 5, "push")
    for answer, chunk in zip(got, expected, strict=True):
        assert answer["actions"].dtype == np.float32 and np.array_equal(answer["actions"], chunk)
        assert answer["server_timing"]["infer_ms"] >= 0
    assert not np.array_equal(expected[0], in_process_chunks(observations[:1], 6, "push")[0])  # the seed matters


def test_sessions_interleaved_keep_their_own_noise_and_episode_seed_starts_over(server, observations):
    a, _ = _connect(server, "/?seed=1")
    b, _ = _connect(server, "/?seed=2")
    got_a, got_b = [], []
    for o in observations:  # a and b take turns: each keeps its own stream
        got_a.append(W.decode(_ask(a, o), max_bytes=1 << 20)["actions"])
        got_b.append(W.decode(_ask(b, o), max_bytes=1 << 20)["actions"])
    again = W.decode(_ask(a, {**observations[0], "episode_seed": 2}), max_bytes=1 << 20)["actions"]
    a.close()
    b.close()
    assert all(map(np.array_equal, got_a, in_process_chunks(observations, 1)))
    assert all(map(np.array_equal, got_b, in_process_chunks(observations, 2)))
    assert np.array_equal(again, got_b[0])  # a new episode at seed 2: b's first chunk


@pytest.mark.parametrize("change, why", [
    (lambda o: {k: v for k, v in o.items() if k != "state"}, "missing 'state'"),
    (lambda o: {**o, "state": o["state"].astype(np.float64)}, "'state' is (6,) float64, expected (6,) float32"),
    (lambda o: {**o, "image_free": o["image_free"][:32]}, "'image_free' is (32, 64, 3) uint8"),
    (lambda o: {**o, "observation/state": o["state"]}, "unknown key 'observation/state'"),
    (lambda o: {**o, "prompt": 7}, "'prompt' must be text"),
    (lambda o: {**o, "episode_seed": -1}, "'episode_seed' must be an int"),
    (lambda o: [1, 2], "a request is a map"),
])
def test_a_wrong_request_gets_one_error_frame_and_the_connection_closes(server, observations, change, why):
    ws, meta = _connect(server)
    reply = _ask(ws, change(observations[0]))
    assert isinstance(reply, str) and reply.startswith("bad request") and why in reply
    assert "the metadata names the request" in reply or "a request is a map" in reply
    with pytest.raises(websockets.exceptions.ConnectionClosed) as closed:
        ws.recv(timeout=5)
    assert closed.value.rcvd.code == 1008


def test_frames_that_are_not_requests_are_refused(server):
    for frame, why in ((b"\xc1", "not a msgpack message"), ("hello", "a text frame is not a request"),
                       (W.encode({"x": {b"__ndarray__": True}}), "array map")):
        ws, _ = _connect(server)
        ws.send(frame)
        reply = ws.recv(timeout=5)
        assert isinstance(reply, str) and why in reply
        ws.close()


def test_a_request_past_its_size_closes_the_connection(server, served):
    ws, _ = _connect(server)
    ws.send(b"\0" * (served.max_request_bytes + 1))
    with pytest.raises(websockets.exceptions.ConnectionClosed) as closed:
        ws.recv(timeout=5)
    assert closed.value.rcvd.code == 1009  # message too big, before any of it is decoded


def test_a_token_is_checked_and_needed_beyond_loopback(served, observations):
    with pytest.raises(ValueError, match="give a token"):
        PolicyServer(served, host="0.0.0.0")  # refused before anything is bound
    with PolicyServer(served, token="s3cret") as server:
        for headers in (None, {"Authorization": "Api-Key wrong"}, {"Authorization": "Bearer s3cret"}):
            with pytest.raises(websockets.exceptions.InvalidStatus, match="401"):
                _connect(server, headers=headers)
        ws, meta = _connect(server, headers={"Authorization": "Api-Key s3cret"})  # openpi-client's api_key header
        assert isinstance(W.decode(_ask(ws, observations[0]), max_bytes=1 << 20)["actions"], np.ndarray)
        ws.close()
        assert server.counts["refused"] == 3


def test_more_clients_than_allowed_are_refused_and_a_bad_seed_too(served):
    with PolicyServer(served, max_connections=1) as server:
        first, _ = _connect(server)
        with pytest.raises(websockets.exceptions.InvalidStatus, match="503"):
            _connect(server)
        first.close()
        with pytest.raises(websockets.exceptions.InvalidStatus, match="400"):
            _connect(server, "/?seed=abc")


def test_openpi_key_names_on_the_wire(observations):
    served = serve_spec(RunSpec(env=ENV, policy=POLICY), keys="openpi")
    assert set(served.metadata()["observation"]) == {"observation/state", "observation/image", "observation"}
    with PolicyServer(served) as server:
        ws, _ = _connect(server)
        o = observations[0]
        answer = W.decode(_ask(ws, {"observation/state": o["state"], "observation/image": o["image_free"],
                                    "observation": o["observation"]}), max_bytes=1 << 20)
        ws.close()
    assert np.array_equal(answer["actions"], in_process_chunks(observations[:1], 0)[0])
