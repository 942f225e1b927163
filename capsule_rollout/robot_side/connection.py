"""The robot server's connections (`robot_side.server`): frames read from a socket against an idle deadline and a
per-frame one (`FrameReader`), calls handed to the robot thread (`Job`), and sending and closing so that a last
error frame reaches the peer. numpy-free: the robot side ships it (packaging/robot)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from capsule_rollout.robot_side.protocol import (
    PREFIX_BYTES,
    ConnectionClosed,
    Message,
    ProtocolError,
    decode_body,
    encode,
    error_message,
    parse_prefix,
)

POLL_S = 0.05  # how often a connection thread looks at the clock and the stop flag
HANDOVER_S = 1.0  # beyond its frame's deadline, how long a hello waits for a stalled controller to be dropped


class Idle(Exception):
    pass


class Job:
    """One call for the robot thread."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn, self.done = fn, threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def run(self) -> None:
        try:
            self._value = self.fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting connection
            self._error = exc
        finally:
            self.done.set()

    def cancel(self) -> None:
        self._error = ConnectionClosed("server stopping")
        self.done.set()

    def result(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value


class FrameReader:
    """Frames from a socket polled every `POLL_S`: waiting for a frame to start ends at an idle
    deadline (`Idle`); once its first byte is in, the whole frame must arrive within `frame_timeout_s`
    (a slow drip is cut off, `frame_timeout`), whatever the pace of the bytes. `frame_started`: when the frame
    in progress began (None between frames; it stays set once a frame fails, the connection then closing)."""

    def __init__(self, conn: socket.socket, stop: threading.Event, frame_timeout_s: float, max_payload: int) -> None:
        self.conn, self.stop = conn, stop
        self.frame_timeout_s, self.max_payload = frame_timeout_s, max_payload
        self.frame_started: float | None = None

    def read(self, idle_deadline: float) -> Message:
        prefix, deadline = self._recv(PREFIX_BYTES, idle_deadline, idle=True)
        if not prefix:
            raise ConnectionClosed("peer closed the connection")
        h_len, p_len = parse_prefix(prefix, max_payload=self.max_payload, peer="client")
        body, _ = self._recv(h_len + p_len, deadline)
        self.frame_started = None
        return decode_body(body[:h_len], body[h_len:])

    def _recv(self, n: int, deadline: float, idle: bool = False) -> tuple[bytes, float]:
        """`n` bytes and the frame's deadline. With `idle`, `deadline` is the idle one until the first byte
        arrives; from then on the frame must be whole within `frame_timeout_s`."""
        buf = bytearray()
        while len(buf) < n:
            if self.stop.is_set():
                raise ConnectionClosed("server stopping")
            if time.monotonic() > deadline:
                if idle and not buf:
                    raise Idle()
                raise ProtocolError("frame_timeout", f"the frame did not arrive within {self.frame_timeout_s:g} s "
                                    f"({len(buf)} of {n} bytes)", fatal=True)
            try:
                chunk = self.conn.recv(min(n - len(buf), 1 << 20))
            except TimeoutError:
                continue
            if not chunk:
                if idle and not buf:
                    return b"", deadline
                raise ProtocolError("truncated", f"connection ended {n - len(buf)} bytes before the frame's end")
            if idle and not buf:  # the frame starts: its own deadline from now
                self.frame_started = time.monotonic()
                deadline = self.frame_started + self.frame_timeout_s
            buf += chunk
        return bytes(buf), deadline


def close_gracefully(conn: socket.socket) -> None:
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


def send(conn: socket.socket, msg: Message | bytes) -> bool:
    """Send one frame (a message, or one already encoded); False when the peer is gone."""
    try:
        data = msg if isinstance(msg, bytes) else encode(msg)
    except (ValueError, TypeError, OverflowError) as exc:
        data = encode(error_message("robot_fault", f"reply could not be encoded ({type(exc).__name__})",
                                    seq=msg.seq))
    try:
        conn.sendall(data)
        return True
    except OSError:
        return False
