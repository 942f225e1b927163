"""The robot side of the bridge over TCP (protocol: `robot_side.protocol`): `RobotServer`.

`RobotServer` owns the socket, the protocol and the safety layer; a `RobotBackend`
(`robot_side.backend`) is the part a user writes for their hardware. The example's `SimRobotServer`
(`tabletop.sim_robot`) is the server over the tabletop sim, speaking the real protocol.

Safety, enforced by the server whatever the backend does:
- actions are clipped to the advertised bounds and rate-limited (each component
  moves at most `max_rate` from the previous action; by default the backend's, or
  half the component's range); the ack returns what was actually sent (what the backend's `apply` returns
  when the hardware clipped further), and the rate limit goes on from that;
- a NaN/inf action is refused: the robot holds (`backend.hold()`), the episode
  is safe-stopped and further actions are refused until the next reset;
- a controller that completes no frame for `heartbeat_timeout_s` during an episode
  makes the robot hold and the episode aborted: the watchdog runs on the robot
  thread's own timer, whatever any connection is doing (a client dripping bytes
  resets nothing); the client learns it on its next request (error
  `heartbeat_timeout`), and what was recorded is kept; a controller that leaves
  during an episode has the robot hold too, and the next client is told `not_ready`;
- the server binds 127.0.0.1 by default; any other address needs a shared token, which every client proves
  it knows in `hello`: an HMAC of it over the nonce of the server's `challenge`, so the token never crosses the
  wire and a recorded hello is refused on any other connection (`robot_side.protocol`).
Admission (`robot_side.admission`): a connection must say a valid hello within `auth_timeout_s` of
connecting; until then it waits, threadless, in a pool of at most `max_pending` (a full pool never closes one
whose hello had the right token) and never counts against `max_connections`, the limit on admitted
connections. Every hello is checked as it arrives and the right token is answered at once, whatever wrong tokens
came from its address (a shared host, a NAT). A wrong token's refusal comes `auth_backoff_s` after its check,
doubling with each failure in a row from that address up to `auth_backoff_max_s`, each after the address's
previous refusal; all addresses together have wrong tokens checked at most `auth_checks_per_s` a second, after
a burst of as many: a hello from an address that has never presented the right token waits for that budget (a
guess that brings no welcome is known wrong, so only a bound on checks bounds guessing). `status()` reports
these limits and counts.
Connections are served concurrently, and the robot has one controller: the first
client whose `hello` is accepted; another gets `busy` at once until it leaves, unless the controller is in
the middle of a frame begun before that hello: then the hello waits for the frame, `busy` if it completes,
the robot if the controller is dropped for it (`frame_timeout_s`), ahead of any later hello (a client that
stalls mid-frame and reconnects at once finds the robot taken).
A frame must arrive whole within `frame_timeout_s` of its first byte, and a controller silent for
`idle_timeout_s` is dropped, so no connection can keep the robot. A broken frame gets an error frame
and, when the stream cannot be trusted, the connection is closed; an exception in
a handler becomes an error frame (the robot held) or a clean close; the server
keeps accepting.
Operator input near the robot (`operator`: a teleoperator's buttons, the robot computer's keys) is polled on
the robot thread at each observation and its events travel with it (`operator_events`; the welcome says
`operator`), for the rollout host to apply as its own operator's (`robot_side.operator`).
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from capsule_rollout.robot_side.admission import WAIT, Admission, PeerBackoff, TokenBudget
from capsule_rollout.robot_side.backend import RobotBackend
from capsule_rollout.robot_side.connection import HANDOVER_S, POLL_S, FrameReader, Idle, Job, close_gracefully, send
from capsule_rollout.robot_side.operator_input import OperatorSource
from capsule_rollout.robot_side.protocol import (
    MAX_INT,
    ConnectionClosed,
    Message,
    ProtocolError,
    encode,
    error_message,
)

LOOPBACK = ("127.0.0.1", "localhost", "::1")
MIN_TOKEN_CHARS = 16  # a token that exposes the robot beyond this machine: 16 hex digits are 64 bits


class RobotServer:
    """The robot side of the bridge: socket, protocol, safety layer (see the module docstring).

    Threads: one accepts connections and reads their hellos (`Admission`), one per admitted connection
    reads its frames, and one, the robot thread, makes every backend call (so a backend sees one thread,
    the one that will close it) and runs the heartbeat watchdog on its own timer.
    """

    def __init__(self, backend: RobotBackend, *, host: str = "127.0.0.1", port: int = 0, token: str = "",
                 max_rate: float | np.ndarray | None = None, heartbeat_timeout_s: float = 1.0,
                 max_payload: int = 16 * 1024 * 1024, idle_timeout_s: float = 5.0, frame_timeout_s: float = 2.0,
                 max_connections: int = 8, auth_timeout_s: float = 2.0, max_pending: int = 32,
                 auth_backoff_s: float = 0.25, auth_backoff_max_s: float = 4.0, auth_checks_per_s: float = 5.0,
                 operator: OperatorSource | None = None):
        if host not in LOOPBACK and len(token) < MIN_TOKEN_CHARS:
            # a client admitted before may guess from its address as fast as it likes (the right token is always
            # checked and answered at once): only the token's length bounds that
            raise ValueError(f"binding {host!r} exposes the robot beyond this machine: set a shared token of "
                             f"{MIN_TOKEN_CHARS} characters or more (e.g. python -c 'import secrets; "
                             "print(secrets.token_hex(16))'), give it to the clients, or bind 127.0.0.1")
        for name, value in (("heartbeat_timeout_s", heartbeat_timeout_s), ("idle_timeout_s", idle_timeout_s),
                            ("frame_timeout_s", frame_timeout_s), ("auth_timeout_s", auth_timeout_s),
                            ("auth_checks_per_s", auth_checks_per_s)):
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        for name, count in (("max_connections", max_connections), ("max_pending", max_pending)):
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ValueError(f"{name} must be a positive int, got {count!r}")
        if not 0 <= auth_backoff_s <= auth_backoff_max_s:
            raise ValueError(f"need 0 <= auth_backoff_s <= auth_backoff_max_s, got {auth_backoff_s!r} and "
                             f"{auth_backoff_max_s!r} seconds")
        low = np.asarray(backend.action_low, np.float64)
        high = np.asarray(backend.action_high, np.float64)
        rate = backend.max_rate if max_rate is None else max_rate
        if rate is None:
            rate = 0.5 * (high - low)  # a component crosses half its range per control step at most
        try:
            self.max_rate = np.broadcast_to(np.asarray(rate, np.float64), low.shape).copy()
        except ValueError:
            raise ValueError(f"max_rate {rate!r} does not fit the robot's {low.shape[0]} action components") from None
        if not np.all(self.max_rate > 0):
            raise ValueError(f"max_rate must be > 0 for every action component, got {self.max_rate.tolist()}")
        self.backend, self.token, self.operator = backend, token, operator
        self.heartbeat_timeout_s, self.max_payload = heartbeat_timeout_s, max_payload
        self.idle_timeout_s = idle_timeout_s  # a silent client is dropped, so it cannot keep the robot
        self.frame_timeout_s = frame_timeout_s  # a whole frame must arrive within this of its first byte
        self.max_connections = max_connections  # admitted connections served at once
        self._sock = socket.create_server((host, port), backlog=1024)
        self.address = self._sock.getsockname()[:2]
        self._stop = threading.Event()
        self._admission = Admission(self._sock, self._stop, self._admit, token=token, auth_timeout_s=auth_timeout_s,
                                    max_pending=max_pending, backoff=PeerBackoff(auth_backoff_s, auth_backoff_max_s),
                                    budget=TokenBudget(auth_checks_per_s))
        self._threads: list[threading.Thread] = []
        self._conn_threads: list[threading.Thread] = []
        self._jobs: queue.Queue[Job] = queue.Queue()
        self._lock = threading.Lock()
        self._open = 0  # admitted connections being served
        self._next_id = 0
        self._controller: int | None = None  # the connection that said hello: the robot has one controller
        self._controller_reader: FrameReader | None = None  # its frames: whether one is in progress, since when
        self.episode_owner: int | None = None  # the connection that reset the current episode
        self.episode_state = "idle"  # idle | running | safe_stopped | aborted | estopped
        self.last_action: np.ndarray | None = None
        self.last_heard = time.monotonic()  # the controller's last complete frame
        self.events: list[str] = []  # what the safety layer did, for logs and tests

    # -- lifecycle ----------------------------------------------------------------
    def start(self) -> RobotServer:
        for target, name in ((self._robot_loop, "robot-server"), (self._accept_loop, "robot-server-accept")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def close(self) -> None:
        self._stop.set()
        for thread in reversed(self._threads):  # accept loop first (and its connections), the robot last
            thread.join(5)
        self._sock.close()

    def __enter__(self) -> RobotServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        """Both server threads are running (for health checks)."""
        return bool(self._threads) and all(t.is_alive() for t in self._threads)

    def status(self) -> dict:
        """Health, the episode, admitted connections and their limit, how long the controller's frame in progress
        has been coming (0: none), and admission: connections waiting to say hello or for the robot, their limit
        and time, wrong tokens whose answer is still due, closed ones by cause (protocol 1 hellos that carried the
        token: `plaintext_tokens`), failed tokens by peer address and in all (any thread)."""
        with self._lock:
            connections, controller, reader = self._open, self._controller is not None, self._controller_reader
        started = reader.frame_started if reader else None
        mid_frame = round(time.monotonic() - started, 3) if started is not None else 0.0
        return {"alive": self.alive, "episode_state": self.episode_state, "controller": controller,
                "controller_mid_frame_s": mid_frame, "connections": connections,
                "max_connections": self.max_connections, **self._admission.status()}

    # -- the robot thread: every backend call, and the watchdog --------------------------
    def _robot_loop(self) -> None:
        tick = min(0.05, self.heartbeat_timeout_s / 4)
        try:
            while not self._stop.is_set():
                try:
                    job = self._jobs.get(timeout=tick)
                except queue.Empty:
                    job = None
                if job is not None:
                    job.run()
                self._watchdog()
        finally:
            self._hold_if_running("server stopping")
            self.backend.close()  # in the thread that used it (GL contexts are per thread)
            if self.operator is not None:
                self.operator.close()
            while not self._jobs.empty():
                self._jobs.get_nowait().cancel()

    def _call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the robot thread and return its result (or raise its exception)."""
        job = Job(fn)
        self._jobs.put(job)
        while not job.done.wait(0.1):
            if self._stop.is_set() and not job.done.is_set():
                raise ConnectionClosed("server stopping")
        return job.result()

    def _watchdog(self) -> None:
        if self.episode_state == "running" and time.monotonic() - self.last_heard > self.heartbeat_timeout_s:
            self.backend.hold()
            self.episode_state = "aborted"
            self.events.append("heartbeat lost: holding, episode aborted")

    def _hold_if_running(self, why: str) -> None:
        if self.episode_state == "running":
            self.backend.hold()
            self.episode_state = "aborted"
            self.events.append(f"{why}: holding, episode aborted")

    # -- connections ------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        self._admission.run()
        for thread in self._conn_threads:  # they see the stop flag within POLL_S
            thread.join(2)

    def _admit(self, conn: socket.socket, hello: Message, peer: str, heard: float) -> Message | None | Literal["wait"]:
        """On the accept thread, a hello with the right token, whole at `heard`: the connection becomes the
        controller, served on a thread of its own, gets the `busy` error to be answered with, or `WAIT`s (asked
        again each tick) while the controller is in the middle of a frame begun before the hello."""
        with self._lock:
            if self._controller is not None:
                started = self._controller_reader.frame_started if self._controller_reader else None
                if started is not None and started <= heard and \
                        time.monotonic() < started + self.frame_timeout_s + HANDOVER_S:
                    return WAIT
                return error_message("busy", "another client controls the robot; try again when it has left",
                                     fatal=True, seq=hello.seq)
            if self._open >= self.max_connections:
                return error_message("busy", f"the robot server is serving its {self.max_connections} connections",
                                     fatal=True, seq=hello.seq)
            cid, self._next_id = self._next_id, self._next_id + 1
            reader = FrameReader(conn, self._stop, self.frame_timeout_s, self.max_payload)
            self._controller, self._controller_reader, self._open = cid, reader, self._open + 1
            self.last_heard = time.monotonic()
        thread = threading.Thread(target=self._serve_connection, args=(conn, cid, hello.seq, reader),
                                  name=f"robot-conn-{cid}", daemon=True)
        try:
            thread.start()
        except BaseException:
            with self._lock:
                self._controller, self._controller_reader, self._open = None, None, self._open - 1
            raise
        self._conn_threads = [t for t in self._conn_threads if t.is_alive()] + [thread]
        return None

    def _serve_connection(self, conn: socket.socket, cid: int, hello_seq: int, reader: FrameReader) -> None:
        try:
            conn.settimeout(POLL_S)
            if send(conn, self._welcome(hello_seq)):
                self._converse(conn, cid, reader)
        except Exception as exc:  # a bug in a handler must not take the server down, nor leave the robot moving
            self.events.append(f"handler failed: {type(exc).__name__}: {exc}")
            send(conn, error_message("robot_fault", f"server error ({type(exc).__name__}); connection closed",
                                      fatal=True))
        finally:
            self._release(cid)
            close_gracefully(conn)
            with self._lock:
                self._open -= 1

    def _release(self, cid: int) -> None:
        """The controller left: hold a running episode, then free the robot for the next client."""
        self._call_quietly(lambda: self._hold_if_running("client disconnected"))
        with self._lock:
            if self._controller == cid:
                self._controller, self._controller_reader = None, None

    def _converse(self, conn: socket.socket, cid: int, reader: FrameReader) -> None:
        """Serve the controller's frames until it leaves."""
        last = time.monotonic()
        while not self._stop.is_set():
            try:
                msg = reader.read(idle_deadline=last + self.idle_timeout_s)
            except Idle:
                send(conn, error_message("idle_timeout", "idle connection closed", fatal=True))
                return
            except ConnectionClosed:
                return
            except ProtocolError as exc:
                fatal = exc.fatal or exc.code in ("truncated", "frame_timeout")
                send(conn, error_message(exc.code, exc.message, fatal=fatal))
                if fatal:
                    return
                continue
            except OSError:
                return
            last = self.last_heard = time.monotonic()
            if msg.type == "bye" or not send(conn, self._reply(msg, cid)):
                return

    def _welcome(self, seq: int) -> Message:
        b = self.backend
        return Message("welcome", {"robot": b.name, "control_hz": b.control_hz, "cameras": list(b.cameras),
                                   "state_dim": int(b.state_dim), "image_shape": [int(x) for x in b.image_shape],
                                   "operator": self.operator is not None,
                                   "teleop": bool(getattr(b, "has_teleop", True))},
                       {"action_low": np.asarray(b.action_low, np.float32),
                        "action_high": np.asarray(b.action_high, np.float32)}, seq)

    def _reply(self, msg: Message, cid: int) -> bytes:
        """The encoded answer to one request from the controller; never raises."""
        if msg.type == "heartbeat":  # answered here: no backend call, no wait behind the robot
            t = msg.fields.get("t", 0)
            if isinstance(t, bool) or not isinstance(t, (int, float)):
                return encode(error_message("bad_header", "heartbeat 't' must be a number", seq=msg.seq))
            return encode(Message("heartbeat_ack", {"t": t}, {}, msg.seq))
        try:
            return encode(self._call(lambda: self._on_robot(msg, cid)))
        except ConnectionClosed:
            return encode(error_message("robot_fault", "the server is stopping", fatal=True, seq=msg.seq))
        except Exception as exc:  # the backend returned what the protocol cannot carry: hold, tell the client
            why = f"unsendable reply ({type(exc).__name__}: {exc})"  # bound now: `exc` is gone after the block
            self._call_quietly(lambda: self._fault(why))
            return encode(error_message("robot_fault", f"{type(exc).__name__}: {exc}", seq=msg.seq))

    def _call_quietly(self, fn: Callable[[], Any]) -> None:
        try:
            self._call(fn)
        except ConnectionClosed:
            pass  # the server is stopping: the robot thread holds the robot on its way out
        except Exception as exc:  # noqa: BLE001 - already reporting a fault
            self.events.append(f"while handling a fault: {type(exc).__name__}: {exc}")

    def _on_robot(self, msg: Message, cid: int) -> Message:
        """On the robot thread: dispatch, with every failure an error frame and the robot held on a fault."""
        try:
            return self._dispatch(msg, cid)
        except ProtocolError as exc:
            return error_message(exc.code, exc.message, fatal=exc.fatal, seq=msg.seq)
        except Exception as exc:  # the backend failed: hold, tell the client
            self._fault(f"{type(exc).__name__}: {exc}")
            return error_message("robot_fault", f"{type(exc).__name__}: {exc}", seq=msg.seq)

    def _fault(self, why: str) -> None:
        self.backend.hold()
        self._hold_if_running(f"robot fault ({why})")

    def _dispatch(self, msg: Message, cid: int) -> Message:
        b = self.backend
        if msg.type == "reset":
            seed = msg.fields.get("seed")
            if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < MAX_INT):
                raise ProtocolError("bad_header", "reset 'seed' must be null or an integer in 0 .. 2**63 - 1 (like "
                                    "'seq': a backend may hand it to a 64-bit seed)")
            instruction = b.reset(seed)
            self.episode_state, self.last_action, self.episode_owner = "running", _present(b), cid
            self.last_heard = time.monotonic()
            return Message("reset_done", {"instruction": instruction, "task": b.task, "subtasks": b.subtasks()},
                           {}, msg.seq)
        if msg.type == "teleop":
            if self.episode_state == "idle":
                raise ProtocolError("not_ready", "reset before teleoperating")
            action = np.asarray(b.teleop_action(), np.float32)
            return Message("teleop_action", {}, {"action": action}, msg.seq)
        if msg.type == "estop":
            b.estop()
            self.episode_state = "estopped"
            self.events.append("e-stop")
            return Message("estop_ack", {}, {}, msg.seq)
        if msg.type == "observe":
            if self.episode_state == "idle":
                raise ProtocolError("not_ready", "reset before observing")
            arrays, fields = b.observe()
            fields = {**fields, "episode_state": self.episode_state}
            if self.operator is not None:  # what the operator did near the robot, with the observation
                fields["operator_events"] = [f"{e.kind.value}:{e.text}" if e.text else e.kind.value
                                             for e in self.operator.poll(int(fields.get("step", 0)))]
            return Message("observation", fields, arrays, msg.seq)
        if msg.type == "action":
            return self._action(msg, cid)
        raise ProtocolError("unknown_type", f"a server does not handle {msg.type!r}")

    def _action(self, msg: Message, cid: int) -> Message:
        b = self.backend
        state = self.episode_state
        if state != "running" and self.episode_owner != cid:
            raise ProtocolError("not_ready", f"no running episode (the last one is {state}); reset first")
        if state == "aborted":
            raise ProtocolError("heartbeat_timeout", "the episode was aborted (heartbeat lost); reset to continue")
        if state != "running":
            raise ProtocolError("not_ready", f"no running episode ({state}); reset first")
        action = msg.arrays.get("action")
        low, high = np.asarray(b.action_low, np.float64), np.asarray(b.action_high, np.float64)
        if action is None or action.shape != low.shape:
            raise ProtocolError("bad_array", f"action must be an array of shape {low.shape}")
        a = action.astype(np.float64)
        if not np.all(np.isfinite(a)):
            b.hold()
            self.episode_state = "safe_stopped"
            self.events.append("non-finite action: safe stop")
            raise ProtocolError("unsafe_action", f"action {a.tolist()} is not finite: the robot holds (safe stop)")
        sent = np.clip(a, low, high)
        if self.last_action is not None:
            sent = np.clip(sent, self.last_action - self.max_rate, self.last_action + self.max_rate)
        applied = b.apply(sent.astype(np.float32))
        if applied is not None:  # the hardware clipped further (LeRobot's `send_action` returns what it sent)
            applied = np.asarray(applied, np.float64).reshape(low.shape)
            if np.all(np.isfinite(applied)):
                sent = applied
        clipped = bool(np.any(sent != a))
        self.last_action = sent
        return Message("action_ack", {"clipped": clipped, "safe_stop": False, "reason": ""},
                       {"sent": sent.astype(np.float32)}, msg.seq)


def _present(backend: RobotBackend) -> np.ndarray | None:
    """Where the rate limit starts after a reset: the backend's present action, when it gives a usable one."""
    present = getattr(backend, "present_action", None)
    action = present() if callable(present) else None
    if action is None:
        return None
    action = np.asarray(action, np.float64).reshape(-1)
    low = np.asarray(backend.action_low, np.float64)
    if action.shape != low.shape or not np.all(np.isfinite(action)):
        return None
    return np.clip(action, low, np.asarray(backend.action_high, np.float64))
