"""Admission to the robot bridge: the per-address answer backoff and the global budget on their own clocks;
on loopback, the challenge-response hello (a recorded hello replayed is refused), a guesser on the rightful
client's own address that never locks it out (its hellos are checked at once, only wrong answers wait), the
global budget on checks, and a server's pending pool (what a full pool closes, what it never closes), hello
deadline, admitted-connection limit, hellos waiting for a controller stalled mid-frame, and status."""

import socket
import threading
import time

import pytest

from capsule_rollout.envs.robot_bridge import RobotClient, RobotDisconnected, RobotError
from capsule_rollout.robot_side.admission import PeerBackoff, TokenBudget
from capsule_rollout.robot_side.protocol import (
    PREFIX,
    PREFIX_BYTES,
    VERSION,
    ConnectionClosed,
    Message,
    ProtocolError,
    challenge_message,
    challenge_nonce,
    decode,
    encode,
    error_message,
    hello_message,
    read_frame,
)
from capsule_rollout.tabletop.sim_robot import SimRobotServer
from tests.reliability.bridge_squat import socket_reader

TOKEN = "t0ken"


def test_backoff_doubles_to_its_cap_answers_a_peer_one_after_another_and_forgets():
    backoff = PeerBackoff(0.5, 3.0, forget_s=60.0, max_peers=2)
    assert [backoff.delay(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert backoff.delay(10_000) == 3.0  # no overflow however long a peer keeps at it
    assert backoff.failed("a", 100.0) == 100.5  # answered delay(1) after its check
    assert backoff.failed("a", 100.5) == 101.5  # the next, delay(2) after the check (the previous answer is due)
    assert backoff.failed("a", 100.6) == 103.5  # checked at once, answered delay(3) after the previous answer
    assert backoff.failed("b", 100.6) == 101.1  # another address is not slowed
    summary = backoff.summary(100.6)
    assert summary["failed_tokens"] == 4 and summary["peers_backing_off"] == 2
    assert summary["most_failures_in_a_row"] == 3 and summary["longest_backoff_s"] == pytest.approx(2.9)
    backoff.succeeded("a")  # the right token: starts again from nothing
    assert backoff.failed("a", 104.0) == 104.5
    assert backoff.failed("a", 105.0) == 106.0 and backoff.failed("a", 170.0) == 170.5  # a minute quiet: forgotten
    backoff.failed("b", 171.0)
    backoff.failed("c", 172.0)  # at most two peers kept: the least recent ("a") is dropped
    assert backoff.failed("a", 172.0) == 172.5 and backoff.summary(172.0)["peers_with_failures"] == 2


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
    """Every frame the server sends until it closes the connection, less its challenge (the first frame, unless
    the connection was refused as it was accepted)."""
    out, recv_exactly = [], socket_reader(sock)
    while True:
        try:
            out.append(read_frame(recv_exactly))
        except (ConnectionClosed, ConnectionResetError):
            return out[1:] if out and out[0].type == "challenge" else out


def _connect(server, source: str | None = None) -> tuple[socket.socket, Message]:
    """A raw connection (from `source`, else 127.0.0.1) and the server's challenge."""
    sock = socket.create_connection(server.address, timeout=10, source_address=(source, 0) if source else None)
    challenge = read_frame(socket_reader(sock))
    assert challenge.type == "challenge", challenge
    return sock, challenge


def _say_hello(server, token: str = "", source: str | None = None) -> socket.socket:
    """A raw connection that has answered its challenge with a hello proving `token`."""
    sock, challenge = _connect(server, source)
    sock.sendall(encode(hello_message(challenge, token)))
    return sock


def _first_frame(stream: bytes) -> bytes:
    h_len, p_len = PREFIX.unpack(stream[:PREFIX_BYTES])[3:]
    return stream[:PREFIX_BYTES + h_len + p_len]


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
    with SimRobotServer(image_size=16) as srv:  # no token: the hello needs no proof, it may go with the connection
        with socket.create_connection(srv.address, timeout=5) as sock:
            sock.sendall(encode(Message("hello", {"client": "raw"}, seq=1)) + encode(Message("reset", {"seed": 0},
                                                                                             seq=2)))
            sock.shutdown(socket.SHUT_WR)
            assert [m.type for m in _frames(sock)] == ["welcome", "reset_done"]
        sock, challenge = _connect(srv)  # and with the proof of the (empty) token, as RobotClient sends it
        with sock:
            sock.sendall(encode(hello_message(challenge, "", seq=1)) + encode(Message("reset", {"seed": 0}, seq=2)))
            sock.shutdown(socket.SHUT_WR)
            assert [m.type for m in _frames(sock)] == ["welcome", "reset_done"]


def test_a_wrong_token_is_answered_late_while_the_right_one_from_its_address_is_admitted_at_once():
    # before: the address's next hello was not checked until the wrong token's answer was due (2 s), and was
    # refused unchecked at its hello deadline (0.5 s): the rightful client on the guesser's address was locked out
    with SimRobotServer(image_size=16, token=TOKEN, auth_timeout_s=0.5, auth_backoff_s=2.0,
                        auth_backoff_max_s=2.0) as srv:
        guess = _say_hello(srv, "wrong", source="127.0.0.2")
        try:
            assert _until(lambda: srv.status()["failed_tokens"] == 1)  # checked as it came
            status = srv.status()
            assert status["wrong_answers_due"] == 1 and status["peers_backing_off"] == 1
            guess.setblocking(False)
            with pytest.raises(BlockingIOError):  # its answer waits for the backoff
                guess.recv(1)
            guess.setblocking(True)
            right = _say_hello(srv, TOKEN, source="127.0.0.2")  # the right token from the same address
            with right:
                assert read_frame(socket_reader(right)).type == "welcome"
            refused = _frames(guess)  # then the wrong token's answer, and the close
            assert [m.fields["code"] for m in refused] == ["unauthorized"]
            assert "wrong or missing token" in refused[0].fields["message"]
            status = srv.status()
            assert status["failed_tokens"] == 1 and status["not_checked"] == 0 and status["wrong_answers_due"] == 0
        finally:
            guess.close()


def test_a_guesser_on_the_rightful_clients_address_never_locks_it_out():
    """A guesser on 127.0.0.1, as the rightful client (a shared host, a NAT), a wrong token every 2 s: before,
    the backoff (4 s) outlasted the hello deadline (1 s) and the rightful client's hellos were refused unchecked
    (about one in four admitted); now every hello is checked as it comes."""
    with SimRobotServer(image_size=16, token=TOKEN, auth_timeout_s=1.0, auth_backoff_s=4.0,
                        auth_backoff_max_s=4.0) as srv:
        stop, guesses = threading.Event(), []

        def guesser() -> None:
            while not stop.is_set():
                start = time.monotonic()
                try:
                    RobotClient(*srv.address, token="wrong", timeout_s=1.0, heartbeat_s=None).close()
                    guesses.append("welcome")
                except (RobotError, RobotDisconnected, ProtocolError) as exc:
                    guesses.append(type(exc).__name__)  # answered late: gave up waiting (RobotDisconnected)
                stop.wait(max(0.0, 2.0 - (time.monotonic() - start)))

        thread = threading.Thread(target=guesser, daemon=True)
        thread.start()
        outcomes, answers_due = [], []
        try:
            assert _until(lambda: srv.status()["failed_tokens"] >= 1)  # 127.0.0.1 backs off from now on
            for _ in range(10):
                answers_due.append(srv.status()["wrong_answers_due"])  # the guesser's, still unanswered
                try:
                    RobotClient(*srv.address, token=TOKEN, timeout_s=5.0, heartbeat_s=None).close()
                    outcomes.append("admitted")
                except (RobotError, RobotDisconnected) as exc:
                    outcomes.append(str(exc))
                time.sleep(0.5)
        finally:
            stop.set()
            thread.join(5)
        status = srv.status()
    assert outcomes == ["admitted"] * 10, outcomes
    assert status["failed_tokens"] >= 2 and status["not_checked"] == 0  # the guesser kept guessing meanwhile
    assert sum(due > 0 for due in answers_due) >= 5, answers_due  # most attempts came while a guess awaited its answer
    assert "welcome" not in guesses


def test_a_recorded_hello_replayed_on_a_new_connection_is_refused():
    with SimRobotServer(image_size=16, token=TOKEN, auth_backoff_s=0.05, auth_backoff_max_s=0.05) as srv, \
            _Recorder(srv.address) as tap:
        with RobotClient(*tap.address, token=TOKEN, heartbeat_s=None) as robot:  # through a tap that records
            robot.reset_to_initial(seed=0)
        tap.join()
        sent, received = bytes(tap.sent), bytes(tap.received)
        assert TOKEN.encode() not in sent  # the token never crossed the wire
        recorded = _first_frame(sent)
        hello = decode(recorded)
        assert hello.type == "hello" and "token" not in hello.fields and "proof" in hello.fields
        sock, challenge = _connect(srv)  # the same bytes on a new connection: a new nonce
        with sock:
            assert challenge_nonce(challenge) != challenge_nonce(decode(_first_frame(received)))
            sock.sendall(recorded)
            refused = _frames(sock)
        assert [m.fields["code"] for m in refused] == ["unauthorized"]
        assert "wrong or missing token" in refused[0].fields["message"]
        status = srv.status()
        assert status["failed_tokens"] == 1 and status["plaintext_tokens"] == 0


def test_wrong_tokens_from_many_addresses_are_checked_within_the_global_budget():
    """Thirty addresses guess at once against a budget of 2 checks a second (2 at once): at most 2 + 2 t wrong
    tokens are checked in t seconds, the others refused unchecked at their hello deadline, while the rightful
    client, whose address has presented the right token before, is checked and admitted at once."""
    per_s, sources = 2.0, [f"127.0.0.{i}" for i in range(2, 32)]
    with SimRobotServer(image_size=16, token=TOKEN, auth_checks_per_s=per_s, auth_timeout_s=1.0,
                        auth_backoff_s=0.05, auth_backoff_max_s=0.05, max_pending=64) as srv:
        RobotClient(*srv.address, token=TOKEN, heartbeat_s=None).close()  # 127.0.0.1 has worked with the server
        answers, lock = [], threading.Lock()

        def guess(source: str) -> None:
            try:
                sock = _say_hello(srv, "wrong", source=source)
                with sock:
                    message = " ".join(m.fields.get("message", m.type) for m in _frames(sock))
            except OSError as exc:
                message = f"no answer ({exc})"
            with lock:
                answers.append("checked" if "wrong or missing token" in message else
                               "not checked" if "was not checked" in message else message)

        start = time.monotonic()
        threads = [threading.Thread(target=guess, args=(s,)) for s in sources]
        for t in threads:
            t.start()
        admitted = 0
        for _ in range(3):
            with RobotClient(*srv.address, token=TOKEN, heartbeat_s=None):
                admitted += 1
        for t in threads:
            t.join(10)
        elapsed = time.monotonic() - start
        status = srv.status()
    assert admitted == 3
    assert sorted(set(answers)) == ["checked", "not checked"], answers
    assert status["failed_tokens"] == answers.count("checked") <= per_s + per_s * elapsed
    assert status["not_checked"] == answers.count("not checked") == len(sources) - answers.count("checked")


def test_a_full_pool_closes_connections_from_addresses_never_admitted_before_the_rightful_clients():
    """The hello comes a round trip after the challenge: meanwhile newer connections from elsewhere must not push
    out a connection from an address that has presented the right token, as the oldest that said nothing."""
    with SimRobotServer(image_size=16, token=TOKEN, max_pending=2) as srv:
        RobotClient(*srv.address, token=TOKEN, heartbeat_s=None).close()  # 127.0.0.1 has worked with the server
        rightful, challenge = _connect(srv)  # has its challenge, has not answered yet
        flood = []
        try:
            flood = [socket.create_connection(srv.address, timeout=5, source_address=("127.0.0.2", 0))
                     for _ in range(4)]
            assert _until(lambda: srv.status()["evicted"] == 3)  # each newcomer closed the oldest from 127.0.0.2
            rightful.sendall(encode(hello_message(challenge, TOKEN)))
            assert read_frame(socket_reader(rightful)).type == "welcome"
            closed = _frames(flood[0])
            assert [(m.fields["code"], m.fields.get("unheard")) for m in closed] == [("busy", True)]  # try again
        finally:
            for sock in (rightful, *flood):
                sock.close()


class _ClosesUnheard:
    """A front for `server` on another port: its first `unheard` connections get a challenge and, once they answer,
    `closing` (by default the frame a full pool sends to a connection it closes before reading its hello); later
    connections are relayed to the server."""

    def __init__(self, server, unheard: int, closing: Message | None = None) -> None:
        self.server, self.unheard, self.connections = server, unheard, 0
        self.closing = closing or error_message("busy", "closed to make room", fatal=True, unheard=True)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = self.sock.getsockname()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            if self.connections > self.unheard:
                backend = socket.create_connection(self.server.address, timeout=10)
                for a, b in ((conn, backend), (backend, conn)):
                    threading.Thread(target=_relay, args=(a, b), daemon=True).start()
                continue
            with conn:
                conn.sendall(encode(challenge_message(bytes(32))))
                read_frame(socket_reader(conn))  # its hello, never checked
                conn.sendall(encode(self.closing))

    def close(self) -> None:
        self.sock.close()


def _relay(src: socket.socket, dst: socket.socket) -> None:
    try:
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        dst.close()


def test_a_client_closed_unheard_connects_again_and_is_served_while_any_other_refusal_stands():
    """A full pool closes a connection that has not said hello yet, the rightful client's too while its hello is on
    its way (a burst of new connections during the challenge's round trip); nothing was done, so the client
    connects again, a little later each time, within its timeout."""
    with SimRobotServer(image_size=16, token=TOKEN) as srv:
        front = _ClosesUnheard(srv, unheard=3)
        try:
            with RobotClient(*front.address, token=TOKEN, heartbeat_s=None) as robot:
                robot.reset_to_initial(seed=1)
                assert robot.observe()[0]["image_front"].shape == (16, 16, 3)
            assert front.connections == 4
        finally:
            front.close()
        front = _ClosesUnheard(srv, unheard=1, closing=error_message("busy", "the robot is taken", fatal=True))
        try:
            with pytest.raises(RobotError, match="the robot is taken") as refused:
                RobotClient(*front.address, token=TOKEN, heartbeat_s=None)
            assert not refused.value.unheard and front.connections == 1  # not closed unheard: told at once
        finally:
            front.close()
        front = _ClosesUnheard(srv, unheard=10**6)
        try:
            start = time.monotonic()
            with pytest.raises(RobotError, match="closed to make room") as closed:
                RobotClient(*front.address, token=TOKEN, timeout_s=0.5, heartbeat_s=None)
            # until its timeout (0.5 s), then told: the upper bound only says it stopped trying (a loaded machine
            # may take a while over the last connection), not how fast
            assert closed.value.unheard and 0.3 < time.monotonic() - start < 10.0
            assert 3 <= front.connections < 40
        finally:
            front.close()


def test_before_hello_a_broken_frame_closes_the_connection():
    with SimRobotServer(image_size=16) as srv:
        sock, challenge = _connect(srv)
        with sock:
            header = b"[1, 2]"  # not a JSON object: a bad_header, which after hello leaves the connection open
            sock.sendall(PREFIX.pack(b"CRBP", VERSION, 0, len(header), 0) + header
                         + encode(hello_message(challenge, "")))
            assert [(m.fields["code"], m.fields["fatal"]) for m in _frames(sock)] == [("bad_header", True)]


class _Recorder:
    """A TCP tap between one client and the server: relays both ways and keeps what each side sent."""

    def __init__(self, target) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = self.listener.getsockname()[:2]
        self.sent, self.received = bytearray(), bytearray()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "_Recorder":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.listener.close()

    def join(self) -> None:
        self._thread.join(10)

    def _run(self) -> None:
        conn, _ = self.listener.accept()
        upstream = socket.create_connection(self.target, timeout=10)
        back = threading.Thread(target=_pump, args=(upstream, conn, self.received))
        back.start()
        _pump(conn, upstream, self.sent)
        back.join(10)
        conn.close()
        upstream.close()


def _pump(src: socket.socket, dst: socket.socket, keep: bytearray) -> None:
    while True:
        try:
            data = src.recv(65536)
        except OSError:
            data = b""
        if not data:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            return
        keep += data
        dst.sendall(data)


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
    with _HeldServer(image_size=16, max_pending=1) as srv:  # no token: a hello needs no proof, and may come early
        first = _say_hello(srv)
        assert srv.held.wait(5)
        rightful = socket.create_connection(srv.address, timeout=5)
        rightful.sendall(encode(Message("hello", {"client": "raw"})))  # the whole hello, before it is even accepted
        silent = socket.create_connection(srv.address, timeout=5)  # accepted right after it: the pool holds one
        try:
            srv.go.set()
            assert read_frame(socket_reader(rightful)).type == "challenge"
            reply = read_frame(socket_reader(rightful))
            assert reply.type == "welcome", reply.fields
            assert [m.fields["code"] for m in _frames(first)] == ["busy"]
        finally:
            for sock in (first, rightful, silent):
                sock.close()


def _stall(server, token: str = "") -> socket.socket:
    """A controller that has the robot and sent half a frame."""
    sock = _say_hello(server, token)
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
    with SimRobotServer(image_size=16, token=TOKEN, max_pending=2, frame_timeout_s=1.0) as srv:
        stalled = _stall(srv, TOKEN)
        waiting = _say_hello(srv, TOKEN)
        silent = []
        try:
            assert _until(lambda: srv.status()["waiting_for_robot"] == 1)
            silent = [socket.create_connection(srv.address, timeout=5) for _ in range(3)]
            assert [(m.fields["code"], m.fields.get("unheard")) for m in _frames(silent[0])] == [("busy", True)]
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
        waiting = _say_hello(srv)
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
        controller = _say_hello(srv)
        assert read_frame(socket_reader(controller)).type == "welcome"
        controller.sendall(frame[:10])
        assert _until(lambda: srv.status()["controller_mid_frame_s"] > 0)
        other = _say_hello(srv)
        try:
            assert _until(lambda: srv.status()["waiting_for_robot"] == 1)
            controller.sendall(frame[10:])  # the frame completes: the controller is alive, the robot stays its
            assert read_frame(socket_reader(controller)).type == "heartbeat_ack"
            answer = _frames(other)
            assert [m.fields["code"] for m in answer] == ["busy"] and "another client" in answer[0].fields["message"]
        finally:
            controller.close()
            other.close()
