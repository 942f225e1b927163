"""Robot bridge on loopback: the SimRobotServer over the real protocol, safety, tokens, broken frames."""

import json
import socket
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capsule_rollout.envs.robot_bridge import (
    RobotClient,
    RobotDisconnected,
    RobotError,
    RobotServer,
)
from capsule_rollout.envs.robot_client import MAX_OPERATOR_EVENTS
from capsule_rollout.robot_side.protocol import (
    NONCE_BYTES,
    PREFIX,
    VERSION,
    ConnectionClosed,
    Message,
    ProtocolError,
    challenge_message,
    decode,
    encode,
    hello_message,
    read_frame,
)
from capsule_rollout.tabletop.sim_robot import SimBackend, SimRobotServer


@pytest.fixture(scope="module")
def server():
    with SimRobotServer(image_size=32, heartbeat_timeout_s=0.5) as srv:
        yield srv


def _client(server, **kw):
    return RobotClient(*server.address, **kw)


def test_observe_act_and_clip_over_the_real_protocol(server):
    with _client(server) as robot:
        assert robot.robot == "sim-pick_place" and robot.cameras == ("front",)
        instruction = robot.reset_to_initial(seed=3)
        obs, info = robot.observe()
        assert obs["instruction"] == instruction and obs["image_front"].shape == (32, 32, 3)
        assert obs["state"].dtype == np.float32 and info["step"] == 0 and info["episode_state"] == "running"
        sent = robot.send_action(np.array([0.5, 0.0, 0.0, 1.0]))
        assert np.array_equal(sent, np.array([0.5, 0.0, 0.0, 1.0], np.float32))
        sent = robot.send_action(np.array([3.0, -0.5, 0.0, 1.0]))  # out of bounds: clipped to 1
        assert sent[0] == 1.0 and robot.observe()[1]["step"] == 2


def test_rate_limit_bounds_the_change_between_actions():
    with SimRobotServer(image_size=32, max_rate=0.5) as srv, RobotClient(*srv.address) as robot:
        robot.reset_to_initial(seed=0)
        robot.send_action(np.array([-1.0, 0.0, 0.0, -1.0]))
        sent = robot.send_action(np.array([1.0, 0.0, 0.0, 1.0]))
        assert np.allclose(sent, [-0.5, 0.0, 0.0, -0.5])


def test_nan_action_is_a_safe_stop_until_the_next_reset(server):
    with _client(server) as robot:
        robot.reset_to_initial(seed=1)
        with pytest.raises(RobotError, match="unsafe_action"):
            robot.send_action(np.array([np.nan, 0.0, 0.0, 0.0]))
        assert server.backend.held and server.episode_state == "safe_stopped"
        with pytest.raises(RobotError, match="not_ready"):
            robot.send_action(np.zeros(4))
        robot.reset_to_initial(seed=1)
        robot.send_action(np.zeros(4))


def test_heartbeat_loss_holds_the_robot_and_aborts_the_episode(server):
    with _client(server, heartbeat_s=None) as robot:
        robot.reset_to_initial(seed=2)
        robot.send_action(np.zeros(4))
        time.sleep(1.2)  # longer than the server's 0.5 s heartbeat timeout
        assert server.episode_state == "aborted" and server.backend.held
        with pytest.raises(RobotError, match="heartbeat_timeout"):
            robot.send_action(np.zeros(4))
        obs, info = robot.observe()  # what happened is still observable: the episode is kept
        assert info["episode_state"] == "aborted" and info["step"] == 1


def test_heartbeats_keep_an_idle_episode_alive(server):
    with _client(server, heartbeat_s=0.1) as robot:
        robot.reset_to_initial(seed=2)
        time.sleep(1.0)
        assert server.episode_state == "running"
        robot.send_action(np.zeros(4))


def test_tokens_and_non_loopback_binds():
    with pytest.raises(ValueError, match="shared token"):
        RobotServer(SimBackend(image_size=32), host="0.0.0.0")
    # a short token beyond this machine: an admitted address may guess at any rate, only length bounds it
    with pytest.raises(ValueError, match="16 characters or more"):
        RobotServer(SimBackend(image_size=32), host="0.0.0.0", token="t0ken")
    token = "a-long-enough-t0ken"
    with SimRobotServer(image_size=32, host="0.0.0.0", token=token) as srv:
        port = srv.address[1]
        with pytest.raises(RobotError, match="unauthorized"):
            RobotClient("127.0.0.1", port, token="wrong")
        with RobotClient("127.0.0.1", port, token=token) as robot:
            assert robot.reset_to_initial(seed=0)


def test_a_closed_server_gives_a_clear_disconnect_error():
    srv = SimRobotServer(image_size=32).start()
    robot = RobotClient(*srv.address, heartbeat_s=None)
    robot.reset_to_initial(seed=0)
    srv.close()
    with pytest.raises((RobotDisconnected, RobotError)):
        for _ in range(3):
            robot.send_action(np.zeros(4))
    with pytest.raises(RobotDisconnected, match="cannot reach"):
        RobotClient(*srv.address)


def _raw(server, data: bytes) -> Message | None:
    """Send raw bytes on a fresh connection and read the reply frame after the server's challenge (None if the
    server closed)."""
    with socket.create_connection(server.address, timeout=5) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        buf = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    if not buf:
        return None
    stream = bytearray(buf)

    def recv_exactly(n):
        out = bytes(stream[:n])
        del stream[:n]
        return out

    challenge = read_frame(recv_exactly)
    assert challenge.type == "challenge", challenge
    return read_frame(recv_exactly) if stream else None


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(st.one_of(
    st.binary(min_size=1, max_size=300),
    st.builds(lambda h, p: PREFIX.pack(b"CRBP", VERSION, 0, len(h), len(p)) + h + p,
              st.binary(min_size=1, max_size=200), st.binary(max_size=64)),
))
def test_garbage_gets_an_error_frame_and_never_wedges_the_server(server, data):
    reply = _raw(server, data)
    assert reply is None or reply.type == "error"
    # the server still serves a proper client afterwards
    with _client(server) as robot:
        robot.reset_to_initial(seed=0)


def test_oversized_wrong_version_and_truncated_frames(server):
    big = PREFIX.pack(b"CRBP", VERSION, 0, 10, 2**31)
    assert _raw(server, big).fields["code"] == "oversized"
    wrong = encode(Message("observe"))
    wrong = wrong[:4] + (VERSION + 1).to_bytes(2, "little") + wrong[6:]
    assert _raw(server, wrong).fields["code"] == "bad_version"
    assert _raw(server, encode(Message("hello", {"client": "raw"}))[:-2]).fields["code"] == "truncated"
    assert _raw(server, encode(Message("observe"))).fields["code"] == "unauthorized"  # no hello
    with pytest.raises(ProtocolError):
        decode(big)


def test_a_realtime_sim_robot_paces_actions_to_its_control_rate(monkeypatch):
    import capsule_rollout.tabletop.sim_robot as bridge

    clock, sleeps = [100.0], []

    def sleep(seconds):
        sleeps.append(round(seconds, 6))
        clock[0] += seconds

    monkeypatch.setattr(bridge.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(bridge.time, "sleep", sleep)
    backend = SimBackend(cameras=(), realtime=True)
    backend.reset(0)
    action = np.zeros_like(backend.action_low)
    for _ in range(3):
        backend.apply(action)
    assert sleeps == [0.1, 0.1]  # the first action goes at once, then one per 1/control_hz
    clock[0] += 5.0  # the client was slow: no sleeping to catch up, and no burst afterwards
    backend.apply(action)
    backend.apply(action)
    assert sleeps == [0.1, 0.1, 0.1]
    backend.reset(1)  # homing: the next action goes at once
    clock[0] += 0.01
    backend.apply(action)
    assert len(sleeps) == 3
    fast = SimBackend(cameras=())
    fast.reset(0)
    fast.apply(action)
    fast.apply(action)
    assert len(sleeps) == 3  # not realtime: never sleeps


class _Raw:
    """A hand-driven connection: send frames (or raw bytes), read reply frames; `challenge`: the server's first."""

    def __init__(self, address, timeout=5.0):
        self.sock = socket.create_connection(address, timeout=timeout)
        self.challenge = self.recv()

    def hello(self, token: str = "") -> Message | None:
        return self.ask(hello_message(self.challenge, token))

    def send(self, msg_or_bytes):
        self.sock.sendall(msg_or_bytes if isinstance(msg_or_bytes, bytes) else encode(msg_or_bytes))

    def recv(self) -> Message | None:
        def recv_exactly(n):
            buf = b""
            while len(buf) < n:
                chunk = self.sock.recv(n - len(buf))
                if not chunk:
                    break
                buf += chunk
            return buf

        try:
            return read_frame(recv_exactly)
        except (ConnectionClosed, ConnectionResetError):
            return None

    def ask(self, msg):
        self.send(msg)
        return self.recv()

    def close(self):
        self.sock.close()


def test_a_slow_dripping_controller_neither_disables_the_watchdog_nor_locks_others_out():
    with SimRobotServer(image_size=16, heartbeat_timeout_s=0.5) as srv:  # frames must arrive within 2 s
        dripper = _Raw(srv.address)
        assert dripper.hello().type == "welcome"
        assert dripper.ask(Message("reset", {"seed": 0})).type == "reset_done"
        frame = encode(Message("observe"))
        for byte in frame[:12]:  # one byte per 0.1 s: every byte used to restart the stall timer
            dripper.send(bytes([byte]))
            time.sleep(0.1)
        assert srv.episode_state == "aborted" and srv.backend.held  # 1.2 s without a whole frame
        assert "heartbeat lost" in " ".join(srv.events)
        # another client, arriving mid-frame, waits for that frame: it is dropped at its deadline (2 s after its
        # first byte), and the robot goes to the client that waited
        with RobotClient(*srv.address, timeout_s=5.0) as robot:
            assert robot.observe()[1]["episode_state"] == "aborted"
        reply = dripper.recv()  # the dripper was closed with a reason
        assert reply.type == "error" and reply.fields["code"] == "frame_timeout" and dripper.recv() is None
        dripper.close()


def test_a_silent_connection_does_not_keep_a_proper_client_waiting(server):
    silent = _Raw(server.address)
    try:
        with RobotClient(*server.address, timeout_s=1.0) as robot:  # served while the silent one says nothing
            robot.reset_to_initial(seed=0)
        reply = silent.recv()  # and the silent one is dropped once its time to say hello is up
        assert reply.type == "error" and reply.fields["code"] == "idle_timeout"
    finally:
        silent.close()


def test_a_silent_controller_is_dropped_after_the_idle_limit():
    with SimRobotServer(image_size=16, idle_timeout_s=0.6) as srv:
        quiet = RobotClient(*srv.address, heartbeat_s=None)
        with pytest.raises(RobotError, match="busy"):
            RobotClient(*srv.address, timeout_s=1.0)
        time.sleep(1.0)
        with RobotClient(*srv.address, timeout_s=1.0) as robot:
            robot.reset_to_initial(seed=0)
        quiet.close()


def test_a_nan_heartbeat_gets_an_error_frame_and_the_episode_keeps_running(server):
    raw = _Raw(server.address)
    try:
        assert raw.hello().type == "welcome"
        assert raw.ask(Message("reset", {"seed": 0})).type == "reset_done"
        header = json.dumps({"type": "heartbeat", "seq": 5, "fields": {"t": float("nan")}, "arrays": []}).encode()
        reply = raw.ask(PREFIX.pack(b"CRBP", VERSION, 0, len(header), 0) + header)
        assert reply is not None and reply.type == "error" and reply.fields["code"] == "bad_header"
        assert not reply.fields["fatal"]
        assert raw.ask(Message("heartbeat", {"t": 1.5}, seq=6)).fields == {"t": 1.5}  # the connection lives on
        assert server.episode_state == "running" and not server.backend.held
    finally:
        raw.close()


def test_a_non_ascii_token_is_answered_unauthorized():
    with SimRobotServer(image_size=16, token="t0ken") as srv:
        with pytest.raises(RobotError, match="unauthorized"):
            RobotClient(*srv.address, token="t\u00f6k\u00e9n", timeout_s=2.0)
        with RobotClient(*srv.address, token="t0ken") as robot:
            assert robot.reset_to_initial(seed=0)


def test_the_sim_robot_allows_a_full_swing_as_the_sim_env_does(server):
    with _client(server) as robot:
        robot.reset_to_initial(seed=0)
        robot.send_action(np.array([-1.0, 0.0, 0.0, -1.0]))
        sent = robot.send_action(np.array([1.0, 0.0, 0.0, 1.0]))
        assert np.array_equal(sent, np.array([1.0, 0.0, 0.0, 1.0], np.float32))


def test_a_backend_without_a_rate_limit_gets_half_of_each_range():
    backend = SimBackend(image_size=16)
    backend.max_rate = None  # a backend that names no limit
    with RobotServer(backend) as srv, RobotClient(*srv.address) as robot:
        assert np.array_equal(srv.max_rate, np.ones(4))
        robot.reset_to_initial(seed=0)
        robot.send_action(np.array([-1.0, 0.0, 0.0, -1.0]))
        sent = robot.send_action(np.array([1.0, 0.0, 0.0, 1.0]))
        assert np.array_equal(sent, np.array([0.0, 0.0, 0.0, 0.0], np.float32))


def test_after_a_client_left_mid_episode_the_next_one_is_told_to_reset(server):
    with _client(server) as first:
        first.reset_to_initial(seed=0)
        first.send_action(np.zeros(4))
    assert server.episode_state == "aborted" and server.backend.held  # held when the client left (close waits)
    with _client(server) as second:
        with pytest.raises(RobotError, match="not_ready"):
            second.send_action(np.zeros(4))
        second.reset_to_initial(seed=0)
        second.send_action(np.zeros(4))


def test_a_protocol_1_client_is_told_to_upgrade_and_its_plaintext_token_is_never_checked():
    with SimRobotServer(image_size=16, token="t0ken") as srv:
        v1 = encode(Message("hello", {"token": "t0ken", "client": "rollout"}))
        v1 = v1[:4] + (1).to_bytes(2, "little") + v1[6:]  # what a protocol 1 client sends as it connects
        reply = _raw(srv, v1)
        assert reply.fields["code"] == "bad_version" and reply.fields["fatal"]
        assert f"speaks protocol {VERSION}" in reply.fields["message"] and "upgrade the client" in \
            reply.fields["message"]
        raw = _Raw(srv.address)  # a protocol 2 frame with protocol 1's hello in it
        try:
            reply = raw.ask(Message("hello", {"token": "t0ken", "client": "rollout"}))
            assert reply.fields["code"] == "unauthorized" and "carries the token itself" in reply.fields["message"]
            assert "upgrade the client" in reply.fields["message"] and raw.recv() is None
        finally:
            raw.close()
        status = srv.status()
        assert status["plaintext_tokens"] == 1 and status["failed_tokens"] == 0  # refused, never checked


def test_a_reset_seed_is_bounded_like_seq(server):
    raw = _Raw(server.address)
    try:
        assert raw.hello().type == "welcome"
        reply = raw.ask(Message("reset", {"seed": 2**63}))
        assert reply.type == "error" and reply.fields["code"] == "bad_header" and not reply.fields["fatal"]
        assert "2**63" in reply.fields["message"]
        assert raw.ask(Message("reset", {"seed": 2**63 - 1})).type == "reset_done"
    finally:
        raw.close()


def _fake_robot(welcome: Message, replies: list[Message] = ()) -> tuple[tuple[str, int], threading.Thread]:
    """A scripted robot side on loopback for one client: its challenge, `welcome` to the hello, then `replies` in
    turn, one for each request."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with listener, listener.accept()[0] as conn:
            raw = _RawConn(conn)
            raw.send(challenge_message(bytes(NONCE_BYTES)))
            for reply in (welcome, *replies):
                request = raw.recv()
                if request is None or request.type == "bye":
                    return
                reply.seq = request.seq
                raw.send(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener.getsockname()[:2], thread


class _RawConn(_Raw):
    def __init__(self, sock: socket.socket) -> None:  # an accepted connection: the server speaks first
        self.sock = sock


def _welcome(**fields) -> Message:
    base = {"robot": "fake", "control_hz": 10, "cameras": ["front"], "state_dim": 8, "image_shape": [64, 64]}
    return Message("welcome", {**base, **fields}, {"action_low": -np.ones(4, np.float32),
                                                   "action_high": np.ones(4, np.float32)})


@pytest.mark.parametrize("fields, why", [
    ({"state_dim": 10**12}, "do not fit in an observation frame"),
    ({"image_shape": [100_000, 100_000]}, "do not fit in an observation frame"),
    ({"cameras": [f"c{i}" for i in range(100)]}, "fewer than 32 names"),
    ({"image_shape": [64, 64, 3]}, "'image_shape' must be [height, width]"),
    ({"state_dim": -1}, "'state_dim' must be a non-negative integer"),
])
def test_a_welcome_announcing_counts_no_frame_can_carry_is_refused(fields, why):
    address, thread = _fake_robot(_welcome(**fields))
    with pytest.raises(ProtocolError, match="welcome is not one this client can use") as info:
        RobotClient(*address, heartbeat_s=None)
    assert why in info.value.message and info.value.code == "bad_header"
    thread.join(5)


def test_operator_events_a_host_never_takes_are_bounded_to_the_latest():
    image = np.zeros((64, 64, 3), np.uint8)
    observations = [Message("observation", {"instruction": "x", "step": i,
                                            "operator_events": [f"coach:{i}-{j}" for j in range(700)]},
                            {"image_front": image, "state": np.zeros(8, np.float32)}) for i in range(3)]
    address, thread = _fake_robot(_welcome(), observations)
    with RobotClient(*address, heartbeat_s=None) as robot:
        for _ in range(3):
            robot.observe()
        events = robot.operator_events()
    assert len(events) == MAX_OPERATOR_EVENTS and events[-1] == "coach:2-699" and events[0] == "coach:1-376"
    thread.join(5)
