"""Robot bridge over TCP (protocol: `envs.robot_protocol`): `RobotServer`, `RobotBackend`, `RobotClient`.

Robot side: `RobotServer` owns the socket, the protocol and the safety layer;
a `RobotBackend` is the part a user writes for their hardware (five hooks, see
the class). `SimBackend` serves the tabletop sim, and `SimRobotServer(...)` is the
server over it, speaking the real protocol.

Safety, enforced by the server whatever the backend does:
- actions are clipped to the advertised bounds and rate-limited (each component
  moves at most `max_rate` from the previous action); the ack returns what was
  actually sent;
- a NaN/inf action is refused: the robot holds (`backend.hold()`), the episode
  is safe-stopped and further actions are refused until the next reset;
- a client that sends nothing for `heartbeat_timeout_s` during an episode makes
  the robot hold and the episode aborted; the client learns it on its next
  request (error `heartbeat_timeout`), and what was recorded is kept;
- the server binds 127.0.0.1 by default; any other address needs a shared token,
  which every client must present in `hello`.
One client is served at a time (a robot has one controller); a broken frame gets
an error frame and, when the stream cannot be trusted, the connection is closed;
the server keeps accepting.
"""

from __future__ import annotations

import hmac
import socket
import threading
import time
from typing import Any

import numpy as np

from envs.robot_protocol import (
    ConnectionClosed,
    Message,
    ProtocolError,
    encode,
    error_message,
    read_frame,
    require_fields,
)

LOOPBACK = ("127.0.0.1", "localhost", "::1")


class RobotBackend:
    """What a hardware integration fills in (the server calls these from one thread at a time)."""

    action_low: np.ndarray = -np.ones(4, np.float32)
    action_high: np.ndarray = np.ones(4, np.float32)
    control_hz: float = 10.0
    name: str = "robot"
    cameras: tuple[str, ...] = ()
    state_dim: int = 8
    """Length of the `state` observation vector."""
    image_shape: tuple[int, int] = (64, 64)
    """(H, W) of every camera image."""

    task: str = "task"

    def reset(self, seed: int | None) -> str:
        """Home the robot and set up the task; returns the instruction."""
        raise NotImplementedError

    def subtasks(self) -> list[str]:
        """The current task's subtask texts, if the robot side knows them (else [])."""
        return []

    def teleop_action(self) -> np.ndarray:
        """The operator's device action now (a leader arm); used while the operator has taken over."""
        raise NotImplementedError("this robot has no teleoperation device")

    def observe(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """(arrays: image_<camera> uint8 (H, W, 3), state float32; fields: instruction, subtask, subtask_id, step,
        success)."""
        raise NotImplementedError

    def apply(self, action: np.ndarray) -> None:
        """Send one (already clipped, rate-limited, finite) action to the robot."""
        raise NotImplementedError

    def hold(self) -> None:
        """Stop moving and hold position (safe stop, heartbeat loss, disconnect)."""
        raise NotImplementedError

    def estop(self) -> None:
        """Emergency stop (cut power to the motors, engage brakes)."""
        self.hold()

    def close(self) -> None:
        """Release the hardware (called once, from the server's thread, when it stops)."""


class SimBackend(RobotBackend):
    """The tabletop sim as a robot (`apply` steps the env once).

    `realtime`: pace `apply` to `control_hz` like a robot's controller (one action per
    tick), so an operator at a keyboard has time to act; off, the sim runs as fast
    as the client sends.
    """

    def __init__(self, family: str = "pick_place", cameras: tuple[str, ...] = ("front",), image_size: int = 64,
                 realtime: bool = False):
        from envs.tabletop_env import ACTION_DIM, TabletopEnv

        self.env = TabletopEnv(family, cameras=cameras, image_size=image_size)
        self.cameras = tuple(cameras)
        self.state_dim = self.env.observation_spec.state_dim
        self.image_shape = (image_size, image_size)
        self.name = f"sim-{family}"
        self.task = family
        self._expert = None
        self.action_low = -np.ones(ACTION_DIM, np.float32)
        self.action_high = np.ones(ACTION_DIM, np.float32)
        self.control_hz = 10.0
        self.realtime = realtime
        self._next_tick = 0.0
        self.held = False
        self._obs: dict | None = None
        self._info: dict = {}

    def reset(self, seed: int | None) -> str:
        from envs.scripted_expert import ScriptedExpert

        self._obs, self._info = self.env.reset(seed=seed)
        self.held, self._next_tick = False, 0.0
        self._expert = ScriptedExpert(self.env)  # the sim's teleoperator
        return self.env.instruction

    def subtasks(self) -> list[str]:
        return [s.text for s in self.env.subtasks]

    def teleop_action(self) -> np.ndarray:
        if self._expert is None:
            raise RuntimeError("reset first")
        return self._expert.act()

    def observe(self):
        if self._obs is None:
            raise RuntimeError("reset first")
        arrays = {k: v for k, v in self._obs.items() if k.startswith("image_")}
        arrays["state"] = self._obs["state"]
        fields = {"instruction": self.env.instruction, "subtask": self._info.get("subtask", ""),
                  "subtask_id": int(self._info.get("subtask_id", 0)), "step": int(self.env.steps),
                  "success": bool(self._info.get("success", False))}
        return arrays, fields

    def apply(self, action: np.ndarray) -> None:
        if self.realtime:
            now = time.monotonic()
            if now < self._next_tick:
                time.sleep(self._next_tick - now)
            self._next_tick = max(now, self._next_tick) + 1.0 / self.control_hz
        self.held = False
        self._obs, _, _, _, self._info = self.env.step(action)

    def hold(self) -> None:
        self.held = True

    def close(self) -> None:
        self.env.close()


class RobotServer:
    def __init__(self, backend: RobotBackend, *, host: str = "127.0.0.1", port: int = 0, token: str = "",
                 max_rate: float = 2.0, heartbeat_timeout_s: float = 1.0, max_payload: int = 16 * 1024 * 1024,
                 idle_timeout_s: float = 30.0):
        if host not in LOOPBACK and not token:
            raise ValueError(f"binding {host!r} exposes the robot beyond this machine: set a shared token "
                             "(and give it to the clients), or bind 127.0.0.1")
        self.backend, self.token, self.max_rate = backend, token, float(max_rate)
        self.heartbeat_timeout_s, self.max_payload = heartbeat_timeout_s, max_payload
        self.idle_timeout_s = idle_timeout_s  # a silent client is dropped, so it cannot wedge the robot
        self._sock = socket.create_server((host, port))
        self._sock.settimeout(0.2)
        self.address = self._sock.getsockname()[:2]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.episode_state = "idle"  # idle | running | safe_stopped | aborted | estopped
        self.last_action: np.ndarray | None = None
        self.last_heard = time.monotonic()
        self.events: list[str] = []  # what the safety layer did, for logs and tests

    # -- lifecycle ----------------------------------------------------------------
    def start(self) -> RobotServer:
        self._thread = threading.Thread(target=self._serve, name="robot-server", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self._sock.close()

    def __enter__(self) -> RobotServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- serving --------------------------------------------------------------------
    def _serve(self) -> None:
        try:
            self._accept_loop()
        finally:
            self._hold_if_running("server stopping")
            self.backend.close()  # in the thread that used it (GL contexts are per thread)

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, socket.timeout):
                self._watchdog()
                continue
            except OSError:
                return
            try:
                self._handle(conn)
            except Exception as exc:  # a bug in a handler must not take the server down
                self.events.append(f"handler failed: {type(exc).__name__}: {exc}")
            finally:
                _close_gracefully(conn)
                self._hold_if_running("client disconnected")

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

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(min(0.2, self.heartbeat_timeout_s / 2))
        authed = False
        reader = _Reader(conn, self._stop)
        idle_since = time.monotonic()
        while not self._stop.is_set():
            try:
                reader.mid_frame = False
                msg = read_frame(reader.recv_exactly, max_payload=self.max_payload)
            except _Idle:
                self._watchdog()
                if time.monotonic() - idle_since > self.idle_timeout_s:
                    _send(conn, error_message("heartbeat_timeout", "idle connection closed", fatal=True))
                    return
                continue
            except ConnectionClosed:
                return
            except ProtocolError as exc:
                _send(conn, error_message(exc.code, exc.message, fatal=exc.fatal or exc.code == "truncated"))
                if exc.fatal or exc.code == "truncated":
                    return
                continue
            except OSError:
                return
            self.last_heard = idle_since = time.monotonic()
            if msg.type == "bye":
                return
            if not authed:
                if msg.type != "hello":
                    _send(conn, error_message("unauthorized", "send hello first", fatal=True, seq=msg.seq))
                    return
                token = msg.fields.get("token", "")
                if self.token and not (isinstance(token, str) and hmac.compare_digest(token, self.token)):
                    _send(conn, error_message("unauthorized", "wrong or missing token", fatal=True, seq=msg.seq))
                    return
                authed = True
                b = self.backend
                _send(conn, Message("welcome", {"robot": b.name, "control_hz": b.control_hz, "cameras": list(b.cameras),
                                                "state_dim": int(b.state_dim),
                                                "image_shape": [int(x) for x in b.image_shape]},
                                    {"action_low": np.asarray(b.action_low, np.float32),
                                     "action_high": np.asarray(b.action_high, np.float32)}, msg.seq))
                continue
            try:
                reply = self._dispatch(msg)
            except ProtocolError as exc:
                reply = error_message(exc.code, exc.message, fatal=exc.fatal, seq=msg.seq)
            except Exception as exc:  # the backend failed: hold, tell the client
                self.backend.hold()
                self._hold_if_running("robot fault")
                reply = error_message("robot_fault", f"{type(exc).__name__}: {exc}", seq=msg.seq)
            _send(conn, reply)

    def _dispatch(self, msg: Message) -> Message:
        b = self.backend
        if msg.type == "heartbeat":
            return Message("heartbeat_ack", {"t": msg.fields.get("t", 0)}, {}, msg.seq)
        if msg.type == "reset":
            seed = msg.fields.get("seed")
            if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
                raise ProtocolError("bad_header", "reset 'seed' must be a non-negative integer or null")
            instruction = b.reset(seed)
            self.episode_state, self.last_action = "running", None
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
            return Message("observation", {**fields, "episode_state": self.episode_state}, arrays, msg.seq)
        if msg.type == "action":
            return self._action(msg)
        raise ProtocolError("unknown_type", f"a server does not handle {msg.type!r}")

    def _action(self, msg: Message) -> Message:
        b = self.backend
        state = self.episode_state
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
        clipped = bool(np.any(sent != a))
        b.apply(sent.astype(np.float32))
        self.last_action = sent
        return Message("action_ack", {"clipped": clipped, "safe_stop": False, "reason": ""},
                       {"sent": sent.astype(np.float32)}, msg.seq)


def SimRobotServer(family: str = "pick_place", *, cameras=("front",), image_size: int = 64, realtime: bool = False,
                   **kw) -> RobotServer:
    """A `RobotServer` over the tabletop sim (for tests, demos and `real_recap` without a robot)."""
    return RobotServer(SimBackend(family, cameras=cameras, image_size=image_size, realtime=realtime), **kw)


class _Idle(Exception):
    pass


class _Reader:
    """recv_exactly over a socket with a short timeout: idle time before a frame starts is reported
    (`_Idle`); a frame that stalls midway for `stall_s` ends short (answered as truncated)."""

    def __init__(self, conn: socket.socket, stop: threading.Event, stall_s: float = 2.0) -> None:
        self.conn, self.stop, self.stall_s = conn, stop, stall_s
        self.mid_frame = False

    def recv_exactly(self, n: int) -> bytes:
        chunks, got = [], 0
        last = time.monotonic()
        while got < n:
            try:
                chunk = self.conn.recv(min(n - got, 1 << 20))
            except (TimeoutError, socket.timeout):
                if got == 0 and not self.mid_frame:
                    raise _Idle() from None
                if self.stop.is_set() or time.monotonic() - last > self.stall_s:
                    break
                continue
            last = time.monotonic()
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        # after a complete prefix the body follows: waiting for it is not idling
        self.mid_frame = not self.mid_frame if got == n else False
        return b"".join(chunks)


def _close_gracefully(conn: socket.socket) -> None:
    """Close so that a last error frame reaches the peer: unread input would turn close() into a reset."""
    try:
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(0.2)
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline and conn.recv(65536):
            pass
    except OSError:
        pass
    conn.close()


def _send(conn: socket.socket, msg: Message) -> None:
    try:
        conn.sendall(encode(msg))
    except OSError:
        pass


# -- client --------------------------------------------------------------------------------


class RobotDisconnected(ConnectionError):
    """The robot side closed the connection or stopped answering."""


class RobotError(RuntimeError):
    """The robot answered with an error frame (`code` from the protocol's ERROR_CODES)."""

    STOP_REASONS = {"heartbeat_timeout": "aborted", "unsafe_action": "safety"}

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"robot error {code}: {message}")
        self.code, self.message = code, message

    @property
    def stop_reason(self) -> str:
        """How a rollout episode ends on this error."""
        return self.STOP_REASONS.get(self.code, "error")


class RobotClient:
    """The rollout side of the bridge: observe, send_action (returns what was sent), reset, e-stop.

    A background thread sends heartbeats every `heartbeat_s` (None: never, e.g. to
    test heartbeat loss). Requests are serialised by a lock.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, token: str = "", timeout_s: float = 5.0,
                 heartbeat_s: float | None = 0.2) -> None:
        self.address = (host, port)
        try:
            self._sock = socket.create_connection((host, port), timeout=timeout_s)
        except OSError as exc:
            raise RobotDisconnected(f"cannot reach the robot at {host}:{port} ({exc})") from None
        self._lock = threading.Lock()
        self._seq = 0
        welcome = self._request(Message("hello", {"token": token, "client": "rollout"}))
        self.robot = welcome.fields.get("robot", "")
        self.control_hz = welcome.fields.get("control_hz")
        self.cameras = tuple(welcome.fields.get("cameras", ()))
        self.state_dim = welcome.fields.get("state_dim")
        self.image_shape = tuple(welcome.fields.get("image_shape") or ())
        self.action_low, self.action_high = welcome.arrays["action_low"], welcome.arrays["action_high"]
        self._stop = threading.Event()
        self._beat = None
        if heartbeat_s:
            self._beat = threading.Thread(target=self._heartbeat, args=(heartbeat_s,), daemon=True)
            self._beat.start()

    def _recv_exactly(self, n: int) -> bytes:
        chunks, got = [], 0
        while got < n:
            try:
                chunk = self._sock.recv(n - got)
            except (TimeoutError, socket.timeout):
                raise RobotDisconnected(f"the robot at {self.address[0]}:{self.address[1]} stopped answering") from None
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def _request(self, msg: Message) -> Message:
        with self._lock:
            self._seq += 1
            msg.seq = self._seq
            try:
                self._sock.sendall(encode(msg))
                reply = read_frame(self._recv_exactly)
            except ConnectionClosed:
                raise RobotDisconnected(f"the robot at {self.address[0]}:{self.address[1]} closed the connection") \
                    from None
            except OSError as exc:
                raise RobotDisconnected(f"connection to the robot lost ({exc})") from None
        if reply.type == "error":
            raise RobotError(str(reply.fields.get("code")), str(reply.fields.get("message")))
        return reply

    def _heartbeat(self, every: float) -> None:
        while not self._stop.wait(every):
            try:
                self._request(Message("heartbeat", {"t": time.monotonic()}))
            except (RobotDisconnected, RobotError):
                return

    # -- the interface the rollout host uses ------------------------------------------
    def reset_to_initial(self, seed: int | None = None) -> str:
        """Home the robot and set up the episode; returns the instruction."""
        return self.reset(seed)["instruction"]

    def reset(self, seed: int | None = None) -> dict:
        """Like `reset_to_initial`, with everything the robot side said (task, subtasks)."""
        return dict(self._request(Message("reset", {"seed": seed})).fields)

    def teleop_action(self) -> np.ndarray:
        """The operator's device action (leader arm; the scripted expert of a sim robot)."""
        return self._request(Message("teleop")).arrays["action"]

    def observe(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(observation like TabletopEnv's: image_<camera>, state, instruction; info: subtask, success, ...)."""
        reply = self._request(Message("observe"))
        require_fields(reply, {"instruction": str})
        obs = dict(reply.arrays)
        obs["instruction"] = reply.fields["instruction"]
        return obs, dict(reply.fields)

    def send_action(self, action: np.ndarray) -> np.ndarray:
        """Send one action; returns the action actually sent (clipped, rate-limited)."""
        reply = self._request(Message("action", {}, {"action": np.asarray(action, np.float32)}))
        return reply.arrays["sent"]

    def estop(self) -> None:
        self._request(Message("estop"))

    def close(self) -> None:
        self._stop.set()
        try:
            with self._lock:
                self._sock.sendall(encode(Message("bye")))
        except OSError:
            pass
        self._sock.close()

    def __enter__(self) -> RobotClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
