"""Squatting and brute force against the robot bridge: silent connections that come back whenever one is
dropped (`Squatters`), and wrong tokens from one peer address (`wrong_token`) while the rightful client,
from another address, tries to be served.

Loopback has a whole /8: an attacker connects from 127.0.0.2, so the server sees a peer of its own.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time

from capsule_rollout.envs.robot_bridge import RobotServer
from capsule_rollout.envs.robot_protocol import ConnectionClosed, Message, ProtocolError, encode, read_frame
from tests.reliability.bridge_fuzz import CLIENT_TIMEOUT_S, checked_server

TOKEN = "the-rightful-token"
ATTACKER = "127.0.0.2"


def squat_server(**kw) -> RobotServer:
    """The checked sim robot server with a token (what a server beyond loopback needs)."""
    return checked_server(token=TOKEN, heartbeat_timeout_s=0.5, **kw)


class Squatters:
    """`n` silent connections, each reopened at once whenever the server drops it; `opened` counts them all."""

    def __init__(self, address, n: int) -> None:
        self.address, self.n = address, n
        self.opened = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Squatters:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

    def _open(self, sel: selectors.BaseSelector) -> None:
        try:
            sock = socket.create_connection(self.address, timeout=2.0)
        except OSError:
            return
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ)
        self.opened += 1

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        try:
            while not self._stop.is_set():
                while len(sel.get_map()) < self.n and not self._stop.is_set():
                    self._open(sel)
                for key, _ in sel.select(0.02):
                    try:
                        gone = not key.fileobj.recv(65536)  # an error frame, then the end: dropped
                    except BlockingIOError:
                        continue
                    except OSError:
                        gone = True
                    if gone:
                        sel.unregister(key.fileobj)
                        key.fileobj.close()
        finally:
            for key in list(sel.get_map().values()):
                key.fileobj.close()
            sel.close()


def silent_connections(address, n: int) -> list[socket.socket]:
    """`n` connections opened at once that never say anything."""
    return [socket.create_connection(address, timeout=CLIENT_TIMEOUT_S) for _ in range(n)]


def socket_reader(sock: socket.socket):
    """`read_frame`'s reader over a socket: n bytes, or fewer where the peer closed."""

    def recv_exactly(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                break
            buf += chunk
        return buf

    return recv_exactly


def wrong_token(address, *, source: str = ATTACKER) -> tuple[float, str]:
    """One hello with a wrong token from `source`: (seconds from the hello to the answer, the answer: an error
    code, with ':checked' when the server said the token was wrong, or 'welcome' or 'no reply')."""
    try:
        with socket.create_connection(address, timeout=CLIENT_TIMEOUT_S, source_address=(source, 0)) as sock:
            sock.sendall(encode(Message("hello", {"token": "guess", "client": "brute"})))
            start = time.monotonic()

            reply = read_frame(socket_reader(sock))
            waited = time.monotonic() - start
    except (OSError, ConnectionClosed, ProtocolError):
        return float("nan"), "no reply"
    if reply.type != "error":
        return waited, reply.type
    code = str(reply.fields.get("code"))
    return waited, code + (":checked" if "wrong or missing token" in str(reply.fields.get("message")) else "")


def most_checks(elapsed_s: float, delay) -> int:
    """The most wrong tokens one peer can have checked in `elapsed_s` when the n-th waits `delay(n)` for its
    answer before the next is checked: the largest k with delay(1) + ... + delay(k - 1) <= elapsed_s."""
    k, spent = 1, 0.0
    while spent + delay(k) <= elapsed_s:
        spent += delay(k)
        k += 1
    return k
