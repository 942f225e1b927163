"""The rollout side of the robot bridge: `RobotClient` (observe, act, reset, e-stop) and its errors.

The client says hello as protocol 2 asks (`robot_side.protocol`): it waits for the server's challenge and
answers with a proof of the token over its nonce, so the token never leaves this process. A connection the server
closed before reading its hello (`unheard`: a full pool of connections yet to say hello made room) is opened
again, within the client's timeout: a burst of new connections during the challenge's round trip cannot keep a
client with the token out. What the welcome
announces (cameras, image shape, state size) is checked against what a frame can carry before anything is sized
by it, and operator events are kept up to `MAX_OPERATOR_EVENTS`: no count the robot side sends is unbounded here.
"""

from __future__ import annotations

import random
import socket
import threading
import time
from typing import Any

import numpy as np

from capsule_rollout.robot_side.protocol import (
    MAX_ARRAYS,
    MAX_PAYLOAD,
    ConnectionClosed,
    Message,
    ProtocolError,
    encode,
    hello_message,
    read_frame,
    require_fields,
)

MAX_OPERATOR_EVENTS = 1024  # operator events kept until `operator_events()` takes them (the oldest dropped)
_UNHEARD_RETRY_S, _UNHEARD_RETRY_MAX_S = 0.005, 0.2  # the pause before connecting again after an unheard close


class RobotDisconnected(ConnectionError):
    """The robot side closed the connection or stopped answering."""


class RobotError(RuntimeError):
    """The robot answered with an error frame (`code` from the protocol's ERROR_CODES)."""

    STOP_REASONS = {"heartbeat_timeout": "aborted", "unsafe_action": "safety"}

    def __init__(self, code: str, message: str, *, unheard: bool = False) -> None:
        super().__init__(f"robot error {code}: {message}")
        self.code, self.message = code, message
        self.unheard = unheard
        """The server closed the connection before reading anything it sent: nothing was done."""

    @classmethod
    def from_frame(cls, msg: Message) -> RobotError:
        return cls(str(msg.fields.get("code")), str(msg.fields.get("message")),
                   unheard=msg.fields.get("unheard") is True)

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
        self._lock = threading.Lock()
        self._seq = 0
        self._silence = "stopped answering"  # what a timeout says
        welcome = self._connect(token, timeout_s)
        self.robot = welcome.fields.get("robot", "")
        self.control_hz = welcome.fields.get("control_hz")
        self.cameras = tuple(welcome.fields.get("cameras", ()))
        self.state_dim = welcome.fields.get("state_dim")
        self.image_shape = tuple(welcome.fields.get("image_shape") or ())
        self.action_low, self.action_high = welcome.arrays["action_low"], welcome.arrays["action_high"]
        self.has_operator = bool(welcome.fields.get("operator", False))
        """The robot side reads operator input of its own (a teleoperator's buttons, its computer's keys)."""
        self.has_teleop = bool(welcome.fields.get("teleop", True))
        """The robot side has a teleoperation device for takeovers (`teleop_action`)."""
        self._operator_events: list[str] = []  # what came with observations, until `operator_events()` takes it
        self._stop = threading.Event()
        self._beat = None
        if heartbeat_s:
            self._beat = threading.Thread(target=self._heartbeat, args=(heartbeat_s,), daemon=True)
            self._beat.start()

    def _connect(self, token: str, timeout_s: float) -> Message:
        """Connect and say hello; returns the welcome. A connection the server closed unheard (its pool of
        connections yet to say hello was full: see `robot_side.admission`) is opened again, a little later each
        time, until `timeout_s` has passed since the first."""
        deadline, pause = time.monotonic() + timeout_s, _UNHEARD_RETRY_S
        while True:
            try:
                self._sock = socket.create_connection(self.address, timeout=timeout_s)
            except OSError as exc:
                raise RobotDisconnected(f"cannot reach the robot at {self.address[0]}:{self.address[1]} ({exc})") \
                    from None
            try:
                return self._hello(token)
            except RobotError as exc:
                self._sock.close()
                if not exc.unheard or time.monotonic() + pause > deadline:
                    raise
            except BaseException:
                self._sock.close()
                raise
            time.sleep(pause * random.uniform(0.5, 1.0))  # apart from other clients closed in the same burst
            pause = min(2 * pause, _UNHEARD_RETRY_MAX_S)

    def _hello(self, token: str) -> Message:
        """The server's challenge, then a hello that proves `token` over its nonce; returns the welcome."""
        self._silence = "sent no challenge (a robot side older than protocol 2 sends none: upgrade it)"
        with self._lock:
            challenge = self._receive()
        self._silence = "stopped answering"
        if challenge.type == "error":
            raise RobotError.from_frame(challenge)
        welcome = self._request(hello_message(challenge, token, client="rollout"))
        _check_welcome(welcome)
        return welcome

    def _recv_exactly(self, n: int) -> bytes:
        chunks, got = [], 0
        while got < n:
            try:
                chunk = self._sock.recv(n - got)
            except TimeoutError:
                raise RobotDisconnected(f"the robot at {self.address[0]}:{self.address[1]} {self._silence}") \
                    from None
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
            except OSError as exc:
                raise RobotDisconnected(f"connection to the robot lost ({exc})") from None
            reply = self._receive()
        if reply.type == "error":
            raise RobotError.from_frame(reply)
        return reply

    def _receive(self) -> Message:
        """The next frame from the robot side (the lock held)."""
        try:
            return read_frame(self._recv_exactly, peer="robot side")
        except ConnectionClosed:
            raise RobotDisconnected(f"the robot at {self.address[0]}:{self.address[1]} closed the connection") \
                from None
        except OSError as exc:
            raise RobotDisconnected(f"connection to the robot lost ({exc})") from None

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
        events = reply.fields.pop("operator_events", None)
        if isinstance(events, list):
            self._operator_events += [e for e in events if isinstance(e, str)]
            del self._operator_events[:-MAX_OPERATOR_EVENTS]  # a host that never asks keeps the latest only
        obs = dict(reply.arrays)
        obs["instruction"] = reply.fields["instruction"]
        return obs, dict(reply.fields)

    def operator_events(self) -> list[str]:
        """Operator events the robot side sent with its observations since the last call (`kind` or
        `kind:text`, kinds of `robot_side.operator_input.Kind`; the latest `MAX_OPERATOR_EVENTS`);
        `robot_side.operator.RobotOperator` reads them."""
        events, self._operator_events = self._operator_events, []
        return events

    def send_action(self, action: np.ndarray) -> np.ndarray:
        """Send one action; returns the action actually sent (clipped, rate-limited)."""
        reply = self._request(Message("action", {}, {"action": np.asarray(action, np.float32)}))
        return reply.arrays["sent"]

    def estop(self) -> None:
        self._request(Message("estop"))

    def close(self) -> None:
        """Say bye and wait (up to a second) for the server to close: the robot is then free for the next client."""
        self._stop.set()
        try:
            with self._lock:
                self._sock.sendall(encode(Message("bye")))
                self._sock.settimeout(1.0)
                while self._sock.recv(65536):
                    pass
        except OSError:
            pass
        self._sock.close()

    def __enter__(self) -> RobotClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_welcome(welcome: Message) -> None:
    """Refuse a welcome whose counts no observation frame could carry (ProtocolError `bad_header`): the rollout
    host sizes its observation buffers by them, so they must be bounded like every count in a frame."""
    f = welcome.fields
    cameras, shape, state_dim = f.get("cameras", []), f.get("image_shape") or [], f.get("state_dim") or 0
    low, high = welcome.arrays.get("action_low"), welcome.arrays.get("action_high")
    problems = []
    if not isinstance(cameras, list) or len(cameras) >= MAX_ARRAYS or not all(isinstance(c, str) for c in cameras):
        problems.append(f"'cameras' must be a list of fewer than {MAX_ARRAYS} names (each is an array of an "
                        "observation)")
        cameras = []
    if not isinstance(shape, list) or len(shape) not in (0, 2) or not all(_count(d) for d in shape):
        problems.append("'image_shape' must be [height, width]")
        shape = []
    if not _count(state_dim):
        problems.append("'state_dim' must be a non-negative integer")
        state_dim = 0
    if not problems and len(cameras) * 3 * (shape[0] * shape[1] if shape else 0) + 4 * state_dim > MAX_PAYLOAD:
        problems.append(f"{len(cameras)} cameras of {shape} and a state of {state_dim} do not fit in an observation "
                        f"frame ({MAX_PAYLOAD} bytes of payload at most)")
    if low is None or high is None or low.ndim != 1 or low.shape != high.shape:
        problems.append("'action_low' and 'action_high' must be 1-d arrays of the same size")
    if problems:
        raise ProtocolError("bad_header", f"the robot's welcome is not one this client can use: {'; '.join(problems)}"
                            "; fix the robot side's backend (RobotBackend) or upgrade it")
