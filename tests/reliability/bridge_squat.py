"""Squatting and brute force against the robot bridge: silent connections that come back whenever one is
dropped (`Squatters`), a flood of new connections (`Flood`), wrong tokens from one peer address
(`wrong_token`) or from many in turn (`Guessers`), and a client with the token that stalls mid-frame and
reconnects at once (`Staller`), while the rightful client, from 127.0.0.1, tries to be served.

Loopback has a whole /8: an attacker connects from 127.0.0.2, or from thousands of addresses
(`loopback_sources`), so the server sees peers of their own.
"""

from __future__ import annotations

import ipaddress
import selectors
import socket
import threading
import time

from capsule_rollout.envs.robot_bridge import RobotServer
from capsule_rollout.robot_side.protocol import (
    ConnectionClosed,
    Message,
    ProtocolError,
    encode,
    hello_message,
    read_frame,
)
from tests.reliability.bridge_fuzz import CLIENT_TIMEOUT_S, checked_server

TOKEN = "the-rightful-token"
ATTACKER = "127.0.0.2"


def squat_server(**kw) -> RobotServer:
    """The checked sim robot server with a token (what a server beyond loopback needs)."""
    return checked_server(token=TOKEN, heartbeat_timeout_s=0.5, **kw)


def loopback_sources(n: int) -> list[str]:
    """`n` loopback addresses from 127.0.0.2 on: as many peers to the server."""
    first = ipaddress.IPv4Address("127.0.0.2")
    return [str(first + i) for i in range(n)]


class _Attack:
    """A background attacker on `threads` threads; a context manager that starts and stops it."""

    def __init__(self, threads: int = 1) -> None:
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def __enter__(self):
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)

    def _run(self) -> None:
        raise NotImplementedError


class Squatters(_Attack):
    """`n` silent connections, each reopened at once whenever the server drops it, from `sources` in turn (else
    127.0.0.1); `opened` counts them all."""

    def __init__(self, address, n: int, sources: list[str] | None = None) -> None:
        super().__init__()
        self.address, self.n, self.sources = address, n, sources
        self.opened = 0

    def _open(self, sel: selectors.BaseSelector) -> None:
        source = (self.sources[self.opened % len(self.sources)], 0) if self.sources else None
        try:
            sock = socket.create_connection(self.address, timeout=2.0, source_address=source)
        except OSError:
            return
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ)
        self.opened += 1

    def _run(self) -> None:  # one thread: a selector over its connections
        sel = selectors.DefaultSelector()
        try:
            while not self._stop.is_set():
                while len(sel.get_map()) < self.n and not self._stop.is_set():
                    self._open(sel)
                _drop_closed(sel, 0.02)
        finally:
            for key in list(sel.get_map().values()):
                key.fileobj.close()
            sel.close()


def _drop_closed(sel: selectors.BaseSelector, timeout_s: float) -> bool:
    """Close the connections the server has dropped (an error frame, then the end); False when none was readable
    within `timeout_s`."""
    events = sel.select(timeout_s)
    for key, _ in events:
        try:
            gone = not key.fileobj.recv(65536)
        except BlockingIOError:
            continue
        except OSError:
            gone = True
        if gone:
            sel.unregister(key.fileobj)
            key.fileobj.close()
    return bool(events)


class Flood(_Attack):
    """Bursts of `burst` new connections at once (non-blocking: no waiting for the handshakes), each from the next
    of `sources`, never a byte said; the next burst as soon as the server has gone `quiet_s` without dropping one
    (the flooder closes what is left). `opened` counts them. A burst fits the server's listen backlog: a flood
    beyond it has the kernel drop connection attempts, everyone's, the rightful client's too (TCP retries them a
    second later), a limit of the machine, not of the bridge."""

    def __init__(self, address, sources: list[str], burst: int = 64, quiet_s: float = 0.002) -> None:
        super().__init__()
        self.address, self.sources, self.burst, self.quiet_s = address, sources, burst, quiet_s
        self.opened = 0

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        try:
            while not self._stop.is_set():
                for _ in range(self.burst):
                    sock = socket.socket()
                    sock.setblocking(False)
                    try:
                        sock.bind((self.sources[self.opened % len(self.sources)], 0))
                        sock.connect_ex(self.address)
                    except OSError:
                        sock.close()
                        continue
                    self.opened += 1
                    sel.register(sock, selectors.EVENT_READ)
                while _drop_closed(sel, self.quiet_s):
                    pass
                for key in list(sel.get_map().values()):
                    sel.unregister(key.fileobj)
                    key.fileobj.close()
        finally:
            for key in list(sel.get_map().values()):
                key.fileobj.close()
            sel.close()


class Guessers(_Attack):
    """Wrong tokens on `threads` connections at once, each hello from the next of `sources` (thousands of
    addresses: each is seen a few times at most); `answers` holds what `wrong_token` said of each."""

    def __init__(self, address, sources: list[str], threads: int = 8) -> None:
        super().__init__(threads)
        self.address, self.sources = address, sources
        self.answers: list[tuple[float, str]] = []
        self._next = 0
        self._lock = threading.Lock()

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                source, self._next = self.sources[self._next % len(self.sources)], self._next + 1
            answer = wrong_token(self.address, source=source)
            with self._lock:
                self.answers.append(answer)

    def checked(self) -> int:
        """How many guesses the server said it checked (the others were refused unchecked, or evicted)."""
        with self._lock:
            return sum(code == "unauthorized:checked" for _, code in self.answers)


class Staller(_Attack):
    """A client with the token, from `source`: once it has the robot it sends part of a frame and stalls; dropped,
    it reconnects at once (told busy, 20 ms later); `controlled` counts the times it had the robot."""

    def __init__(self, address, token: str, source: str = "127.0.0.3") -> None:
        super().__init__()
        self.address, self.token, self.source = address, token, source
        self.controlled = 0

    def _run(self) -> None:
        partial = encode(Message("observe"))[:10]
        while not self._stop.is_set():
            try:
                with socket.create_connection(self.address, timeout=CLIENT_TIMEOUT_S,
                                              source_address=(self.source, 0)) as sock:
                    challenge = read_frame(socket_reader(sock))
                    if challenge.type != "challenge":
                        time.sleep(0.02)
                        continue
                    sock.sendall(encode(hello_message(challenge, self.token, client="staller")))
                    if read_frame(socket_reader(sock)).type != "welcome":
                        time.sleep(0.02)
                        continue
                    self.controlled += 1
                    sock.sendall(partial)
                    sock.settimeout(0.1)
                    while not self._stop.is_set():  # until the server drops it
                        try:
                            if not sock.recv(65536):
                                break
                        except TimeoutError:
                            continue
            except (OSError, ConnectionClosed, ProtocolError):
                time.sleep(0.02)


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
            first = read_frame(socket_reader(sock))  # the challenge, or the refusal of a full pool
            start = time.monotonic()  # before the hello leaves: the server may check it before sendall returns
            if first.type == "challenge":
                sock.sendall(encode(hello_message(first, "guess", client="brute")))
                reply = read_frame(socket_reader(sock))
            else:
                reply = first
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
