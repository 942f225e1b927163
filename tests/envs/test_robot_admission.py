"""Admission to the robot bridge: the per-address token backoff and the global budget on their own clocks,
and a server's pending pool (what a full pool closes, what it never closes), hello deadline, admitted-connection
limit, hellos waiting for a controller stalled mid-frame, and status on loopback."""

import socket
import threading
import time

import pytest

from capsule_rollout.envs.robot_admission import PeerBackoff, TokenBudget
from capsule_rollout.envs.robot_bridge import RobotClient
from capsule_rollout.envs.robot_protocol import ConnectionClosed, Message, encode, error_message, read_frame
from capsule_rollout.tabletop.sim_robot import SimRobotServer
from tests.reliability.bridge_squat import socket_reader


def test_backoff_doubles_to_its_cap_serialises_a_peer_and_forgets():
    backoff = PeerBackoff(0.5, 3.0, forget_s=60.0, max_peers=2)
    assert [backoff.delay(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert backoff.delay(10_000) == 3.0  # no overflow however long a peer keeps at it
    assert backoff.ready_at("a", 100.0) == 100.0  # a new peer is checked at once
    assert backoff.failed("a", 100.0) == 0.5
    assert backoff.ready_at("a", 100.1) == 100.5  # its next hello waits for the answer to be due
    assert backoff.failed("a", 100.5) == 1.0 and backoff.ready_at("a", 100.6) == 101.5
    assert backoff.ready_at("b", 100.6) == 100.6  # another address is not slowed
    summary = backoff.summary(100.6)
    assert summary["failed_tokens"] == 2 and summary["peers_backing_off"] == 1
    assert summary["most_failures_in_a_row"] == 2 and summary["longest_backoff_s"] == pytest.approx(0.9)
    backoff.succeeded("a")  # the right token: starts again from nothing
    assert backoff.failed("a", 102.0) == 0.5
    assert backoff.failed("a", 103.0) == 1.0 and backoff.failed("a", 170.0) == 0.5  # a minute quiet: forgotten
    backoff.failed("b", 171.0)
    backoff.failed("c", 172.0)  # at most two peers kept: the least recent ("a") is dropped
    assert backoff.ready_at("a", 170.1) == 170.1 and backoff.summary(172.0)["peers_with_failures"] == 2


def test_the_global_budget_refills_at_its_rate_and_trusts_only_addresses_that_had_the_right_token():
    budget = TokenBudget(2.0, burst=2.0, max_trusted=2)
    assert budget.ready_at("a", 10.0) == 10.0  # a full budget: checked at once
    budget.spent(10.0)
    budget.spent(10.0)  # two wrong tokens, from any addresses: the budget is spent
    assert budget.ready_at("b", 10.0) == 10.5  # a unit comes back in 1 / 2 s
    assert budget.ready_at("b", 10.5) == 10.5
    budget.spent(10.5)
    budget.trust("r")  # an address that presented the right token
    assert budget.ready_at("r", 10.5) == 10.5  # is checked whatever the budget
    budget.spent(10.5)  # its wrong tokens are spent too
    assert budget.ready_at("b", 10.5) == 11.5
    budget.trust("s")
    budget.trust("t")  # at most two trusted: the least recent ("r") dropped
    assert budget.ready_at("r", 11.0) == 11.5
    summary = budget.summary(11.0)
    assert summary["trusted_peers"] == 2 and summary["auth_checks_left"] == 0.0 and summary["auth_checks_per_s"] == 2.0
    assert budget.summary(20.0)["auth_checks_left"] == 2.0  # refilled up to its burst, no further


def test_bad_admission_limits_are_refused_with_the_fix():
    for kw, match in (({"max_pending": 0}, "max_pending must be a positive int"),
                      ({"auth_timeout_s": 0}, "auth_timeout_s must be > 0"),
                      ({"auth_checks_per_s": 0}, "auth_checks_per_s must be > 0"),
                      ({"auth_backoff_s": 2.0, "auth_backoff_max_s": 1.0}, "auth_backoff_s <= auth_backoff_max_s")):
        with pytest.raises(ValueError, match=match):
            SimRobotServer(image_size=16, **kw)


def _frames(sock: socket.socket) -> list[Message]:
    """Every frame the server sends until it closes the connection."""
    out, recv_exactly = [], socket_reader(sock)
    while True:
        try:
            out.append(read_frame(recv_exactly))
        except (ConnectionClosed, ConnectionResetError):
            return out


def test_pending_connections_have_their_own_pool_and_deadline_and_status_shows_them():
    with SimRobotServer(image_size=16, max_connections=1, max_pending=2, auth_timeout_s=0.5) as srv:
        silent = [socket.create_connection(srv.address, timeout=5) for _ in range(3)]
        try:
            evicted = _frames(silent[0])  # the third pushed the oldest out, with a reason
            assert [(m.fields["code"], "oldest" in m.fields["message"]) for m in evicted] == [("busy", True)]
            # the pool is full of silent connections, and the one admitted slot is free: a client gets in
            with RobotClient(*srv.address, timeout_s=2.0) as robot:
                robot.reset_to_initial(seed=0)
                status = srv.status()
                assert status["connections"] == 1 and status["controller"] and status["max_connections"] == 1
                assert status["max_pending"] == 2 and status["auth_timeout_s"] == 0.5 and status["evicted"] == 2
            assert [m.fields["code"] for m in _frames(silent[1])] == ["busy"]  # made room for the client
            timed_out = _frames(silent[2])  # said nothing within auth_timeout_s
            assert [m.fields["code"] for m in timed_out] == ["idle_timeout"]
            assert "0.5 s" in timed_out[0].fields["message"]
        finally:
            for sock in silent:
                sock.close()
        assert srv.status()["auth_timeouts"] >= 1


def test_a_hello_pipelined_with_its_first_request_is_served():
    with SimRobotServer(image_size=16) as srv, socket.create_connection(srv.address, timeout=5) as sock:
        sock.sendall(encode(Message("hello", {"token": ""}, seq=1)) + encode(Message("reset", {"seed": 0}, seq=2)))
        sock.shutdown(socket.SHUT_WR)
        assert [m.type for m in _frames(sock)] == ["welcome", "reset_done"]


def test_while_an_address_backs_off_its_hellos_go_unchecked_and_other_addresses_are_served():
    with SimRobotServer(image_size=16, token="t0ken", auth_timeout_s=0.3, auth_backoff_s=5.0,
                        auth_backoff_max_s=5.0) as srv:
        guess = socket.create_connection(srv.address, timeout=10, source_address=("127.0.0.2", 0))
        guess.sendall(encode(Message("hello", {"token": "wrong"})))  # its refusal is due 5 s after the check
        try:
            with socket.create_connection(srv.address, timeout=10, source_address=("127.0.0.2", 0)) as right:
                right.sendall(encode(Message("hello", {"token": "t0ken"})))  # the right token, same address
                refused = _frames(right)
            assert [m.fields["code"] for m in refused] == ["unauthorized"]
            assert "not checked" in refused[0].fields["message"]
            with RobotClient(*srv.address, token="t0ken", timeout_s=2.0) as robot:  # from 127.0.0.1: at once
                robot.reset_to_initial(seed=0)
            status = srv.status()
            assert status["failed_tokens"] == 1 and status["peers_backing_off"] == 1 and status["not_checked"] == 1
        finally:
            guess.close()


def test_a_backend_server_reports_its_status_before_any_client():
    with SimRobotServer(image_size=16) as srv:
        status = srv.status()
    assert status["alive"] and not status["controller"] and status["pending"] == 0 and status["failed_tokens"] == 0


class _HeldServer(SimRobotServer):
    """Its accept thread stops in the first `_admit` until `go` is set (then refuses that hello): connections
    made meanwhile queue up in the listen backlog, as they do behind a flood."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.held, self.go = threading.Event(), threading.Event()

    def _admit(self, conn, hello, *args):
        if not self.held.is_set():
            self.held.set()
            self.go.wait(10)
            return error_message("busy", "held", fatal=True, seq=hello.seq)
        return super()._admit(conn, hello, *args)


def test_a_hello_that_came_with_its_connection_is_heard_before_a_later_connection_can_push_it_out():
    with _HeldServer(image_size=16, max_pending=1) as srv:
        first = socket.create_connection(srv.address, timeout=5)
        first.sendall(encode(Message("hello", {"token": ""})))
        assert srv.held.wait(5)
        rightful = socket.create_connection(srv.address, timeout=5)
        rightful.sendall(encode(Message("hello", {"token": ""})))  # the whole hello, before it is even accepted
        silent = socket.create_connection(srv.address, timeout=5)  # accepted right after it: the pool holds one
        try:
            srv.go.set()
            reply = read_frame(socket_reader(rightful))
            assert reply.type == "welcome", reply.fields
            assert [m.fields["code"] for m in _frames(first)] == ["busy"]
        finally:
            for sock in (first, rightful, silent):
                sock.close()


def _stall(server, token: str = "") -> socket.socket:
    """A controller that has the robot and sent half a frame."""
    sock = socket.create_connection(server.address, timeout=5)
    sock.sendall(encode(Message("hello", {"token": token})))
    assert read_frame(socket_reader(sock)).type == "welcome"
    sock.sendall(encode(Message("observe", seq=1))[:10])
    assert _until(lambda: server.status()["controller_mid_frame_s"] > 0)  # the server has the half frame
    return sock


def _until(condition, timeout_s: float = 5.0) -> bool:
    end = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def test_a_full_pool_never_closes_a_hello_with_the_right_token_and_it_gets_the_robot_from_a_stalled_controller():
    with SimRobotServer(image_size=16, token="t0ken", max_pending=2, frame_timeout_s=1.0) as srv:
        stalled = _stall(srv, "t0ken")
        waiting = socket.create_connection(srv.address, timeout=5)
        waiting.sendall(encode(Message("hello", {"token": "t0ken"})))
        silent = []
        try:
            assert _until(lambda: srv.status()["waiting_for_robot"] == 1)
            silent = [socket.create_connection(srv.address, timeout=5) for _ in range(3)]
            assert [m.fields["code"] for m in _frames(silent[0])] == ["busy"]  # the pool made room with them
            assert [m.fields["code"] for m in _frames(silent[1])] == ["busy"]
            reply = read_frame(socket_reader(waiting))  # the stalled frame's deadline passes: the robot is its
            assert reply.type == "welcome", reply.fields
            assert [m.fields["code"] for m in _frames(stalled)] == ["frame_timeout"]
            status = srv.status()
            assert status["evicted"] == 2 and status["waited_for_robot"] == 1 and status["controller"]
        finally:
            for sock in (stalled, waiting, *silent):
                sock.close()


def test_a_pool_full_of_hellos_waiting_for_the_robot_refuses_a_new_connection():
    with SimRobotServer(image_size=16, max_pending=1, frame_timeout_s=1.0) as srv:
        stalled = _stall(srv)
        waiting = socket.create_connection(srv.address, timeout=5)
        waiting.sendall(encode(Message("hello", {"token": ""})))
        try:
            assert _until(lambda: srv.status()["waiting_for_robot"] == 1)
            with socket.create_connection(srv.address, timeout=5) as late:
                refused = _frames(late)
            assert [m.fields["code"] for m in refused] == ["busy"] and "waiting for the robot" in \
                refused[0].fields["message"]
            assert read_frame(socket_reader(waiting)).type == "welcome"
            assert srv.status()["refused_full"] == 1
        finally:
            stalled.close()
            waiting.close()


def test_a_hello_waits_for_a_frame_in_progress_and_is_told_busy_when_it_completes():
    with SimRobotServer(image_size=16) as srv:
        frame = encode(Message("heartbeat", {"t": 1.0}, seq=1))
        controller = socket.create_connection(srv.address, timeout=5)
        controller.sendall(encode(Message("hello", {"token": ""})))
        assert read_frame(socket_reader(controller)).type == "welcome"
        controller.sendall(frame[:10])
        assert _until(lambda: srv.status()["controller_mid_frame_s"] > 0)
        other = socket.create_connection(srv.address, timeout=5)
        other.sendall(encode(Message("hello", {"token": ""})))
        try:
            assert _until(lambda: srv.status()["waiting_for_robot"] == 1)
            controller.sendall(frame[10:])  # the frame completes: the controller is alive, the robot stays its
            assert read_frame(socket_reader(controller)).type == "heartbeat_ack"
            answer = _frames(other)
            assert [m.fields["code"] for m in answer] == ["busy"] and "another client" in answer[0].fields["message"]
        finally:
            controller.close()
            other.close()
