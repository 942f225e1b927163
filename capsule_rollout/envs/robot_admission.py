"""Admission to the robot bridge: `Admission` holds every new connection, on the server's accept thread,
until it says a valid `hello`; `PeerBackoff` slows down a peer address whose tokens fail.

A connection that has not said a valid hello costs a socket and no thread, waits in a pool of its own
(`max_pending`; the oldest is closed to make room for a new one, so a client that says hello at once is
always heard), never counts against the server's `max_connections`, and is closed `auth_timeout_s` after it
connected. Only a hello with the right token is handed to the server (`admit`), which serves it on a thread.
"""

from __future__ import annotations

import hmac
import selectors
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from capsule_rollout.envs.robot_protocol import (
    PREFIX_BYTES,
    Message,
    ProtocolError,
    decode_body,
    encode,
    error_message,
    parse_prefix,
)

HELLO_MAX_PAYLOAD = 64 * 1024  # before hello a frame carries at most this much payload (a hello needs none)
_TICK_S = 0.05  # how often the accept thread looks at the clock and the stop flag
_DRAIN_S = 0.5  # how long a closing connection is read so that its last error frame is not lost to a reset


class PeerBackoff:
    """Failed tokens by peer address. The n-th failure in a row is answered `delay(n)` after its check
    (`base_s * 2**(n-1)`, at most `max_s`), and the peer's next hello is not checked before that answer is
    due, however many connections it opens. A success clears the peer; a peer with no failure for
    `forget_s` starts again from nothing; at most `max_peers` are remembered (the least recent dropped)."""

    def __init__(self, base_s: float, max_s: float, *, forget_s: float = 60.0, max_peers: int = 4096) -> None:
        self.base_s, self.max_s, self.forget_s, self.max_peers = base_s, max_s, forget_s, max_peers
        self.failed_total = 0
        self._peers: OrderedDict[str, tuple[int, float, float]] = OrderedDict()  # failures, last failure, next check
        self._lock = threading.Lock()  # the accept thread writes, `summary` reads from any thread

    def delay(self, failures: int) -> float:
        """Seconds between the check of the `failures`-th wrong token in a row and its answer."""
        return min(self.max_s, self.base_s * 2.0 ** min(failures - 1, 60))

    def ready_at(self, peer: str, now: float) -> float:
        """When a hello from `peer` may be checked (`now` or earlier: at once)."""
        with self._lock:
            entry = self._live(peer, now)
            return entry[2] if entry else now

    def failed(self, peer: str, now: float) -> float:
        """Count a wrong token from `peer` checked at `now`; returns the delay before its answer."""
        with self._lock:
            entry = self._live(peer, now)
            failures = (entry[0] if entry else 0) + 1
            wait = self.delay(failures)
            self._peers.pop(peer, None)
            self._peers[peer] = (failures, now, now + wait)
            while len(self._peers) > self.max_peers:
                self._peers.popitem(last=False)
            self.failed_total += 1
            return wait

    def succeeded(self, peer: str) -> None:
        with self._lock:
            self._peers.pop(peer, None)

    def summary(self, now: float) -> dict:
        with self._lock:
            live = [e for e in self._peers.values() if now - e[1] <= self.forget_s]
            waits = [e[2] - now for e in live if e[2] > now]
            return {"failed_tokens": self.failed_total, "peers_with_failures": len(live),
                    "peers_backing_off": len(waits), "longest_backoff_s": round(max(waits, default=0.0), 3),
                    "most_failures_in_a_row": max((e[0] for e in live), default=0),
                    "auth_backoff_s": self.base_s, "auth_backoff_max_s": self.max_s}

    def _live(self, peer: str, now: float) -> tuple[int, float, float] | None:
        entry = self._peers.get(peer)
        if entry is not None and now - entry[1] > self.forget_s:
            del self._peers[peer]
            return None
        return entry


@dataclass(eq=False)
class _Pending:
    """A connection that has not been admitted: reading its hello, parked (its peer is backing off), refusing
    (a wrong token's answer is due at `at`) or closing (its last frame sent, read until the peer closes)."""

    conn: socket.socket
    peer: str
    deadline: float  # the hello must have arrived by then
    buf: bytearray = field(default_factory=bytearray)
    need: int = PREFIX_BYTES
    state: str = "reading"
    hello: Message | None = None
    at: float = 0.0
    answer: Message | None = None


class Admission:
    """The accept thread: new connections, their hellos and tokens (see the module docstring).

    `admit(conn, hello, peer)` is called with every hello whose token is right; it takes the connection over
    (None) or returns the error to answer with (the connection is then closed here).
    """

    def __init__(self, sock: socket.socket, stop: threading.Event, admit: Callable[[socket.socket, Message, str],
                 Message | None], *, token: str, auth_timeout_s: float, max_pending: int, backoff: PeerBackoff) -> None:
        self.sock, self.stop, self.admit, self.token = sock, stop, admit, token
        self.auth_timeout_s, self.max_pending, self.backoff = auth_timeout_s, max_pending, backoff
        self.counts = {"auth_timeouts": 0, "evicted": 0, "not_checked": 0}
        self._pending: dict[socket.socket, _Pending] = {}  # in the order they connected
        self._sel = selectors.DefaultSelector()

    def status(self) -> dict:
        """The admission limits, how many connections wait, and the failed tokens by peer (any thread)."""
        return {"pending": len(self._pending), "max_pending": self.max_pending, "auth_timeout_s": self.auth_timeout_s,
                **self.counts, **self.backoff.summary(time.monotonic())}

    def run(self) -> None:
        self.sock.setblocking(False)
        self._sel.register(self.sock, selectors.EVENT_READ)
        try:
            while not self.stop.is_set():
                for key, _ in self._sel.select(_TICK_S):
                    if key.fileobj is self.sock:
                        self._accept()
                    elif key.fileobj in self._pending:  # not evicted by an accept in this same batch
                        self._readable(self._pending[key.fileobj])
                now = time.monotonic()
                for p in list(self._pending.values()):
                    self._timers(p, now)
        finally:
            for p in list(self._pending.values()):
                self._close(p)
            self._sel.close()

    # -- connections arriving and reading their hello -----------------------------------
    def _accept(self) -> None:
        while True:
            try:
                conn, addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors, or the listening socket closed: try again next tick
                return
            conn.setblocking(False)
            if len(self._pending) >= self.max_pending:
                self._evict()
            p = _Pending(conn, str(addr[0]), time.monotonic() + self.auth_timeout_s)
            self._pending[conn] = p
            self._sel.register(conn, selectors.EVENT_READ)

    def _evict(self) -> None:
        """Make room: close a closing connection if there is one, else the one waiting longest."""
        victim = next((p for p in self._pending.values() if p.state == "closing"), None)
        if victim is None:
            victim = next(iter(self._pending.values()))
            self.counts["evicted"] += 1
            _send_now(victim.conn, error_message(
                "busy", f"{self.max_pending} connections are waiting to say hello: this one, the oldest, is closed",
                fatal=True))
        self._close(victim)

    def _readable(self, p: _Pending) -> None:
        try:
            chunk = p.conn.recv(max(1, p.need - len(p.buf)) if p.state == "reading" else 65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if p.state != "reading":  # closing: read to the end
            if not chunk:
                self._close(p)
            return
        if not chunk:
            if p.buf:
                self._finish(p, error_message("truncated", f"connection ended {p.need - len(p.buf)} bytes before "
                                              "the frame's end", fatal=True))
            else:
                self._close(p)
            return
        p.buf += chunk
        try:
            if p.need == PREFIX_BYTES and len(p.buf) == PREFIX_BYTES:
                h_len, p_len = parse_prefix(bytes(p.buf), max_payload=HELLO_MAX_PAYLOAD)
                p.need = PREFIX_BYTES + h_len + p_len
            if len(p.buf) < p.need:
                return
            h_len = int.from_bytes(p.buf[8:12], "little")
            msg = decode_body(bytes(p.buf[PREFIX_BYTES:PREFIX_BYTES + h_len]), bytes(p.buf[PREFIX_BYTES + h_len:]))
        except ProtocolError as exc:
            reply = error_message(exc.code, exc.message, fatal=exc.fatal)
            if exc.fatal:
                self._finish(p, reply)
            else:  # a frame that decodes to nothing usable: answered, the stream is still in step
                _send_now(p.conn, reply)
                p.buf, p.need = bytearray(), PREFIX_BYTES
            return
        if msg.type == "bye":
            self._finish(p, None)
        elif msg.type != "hello":
            self._finish(p, error_message("unauthorized", "send hello first", fatal=True, seq=msg.seq))
        else:
            self._sel.unregister(p.conn)  # nothing more is read before the hello is answered
            p.state, p.hello, p.at = "parked", msg, self.backoff.ready_at(p.peer, time.monotonic())
            self._timers(p, time.monotonic())

    # -- what is due ----------------------------------------------------------------------
    def _timers(self, p: _Pending, now: float) -> None:
        if p.state == "reading" and now > p.deadline:
            self.counts["auth_timeouts"] += 1
            self._finish(p, error_message("idle_timeout", f"no hello within {self.auth_timeout_s:g} s of "
                                          "connecting: connection closed", fatal=True))
        elif p.state == "parked" and (now >= p.at or now > p.deadline):
            p.at = self.backoff.ready_at(p.peer, now)  # another hello from the peer may have gone first
            if p.at <= now:
                self._check(p, now)
            elif now > p.deadline:  # its peer is still backing off: refused unchecked, which tells nothing
                self.counts["not_checked"] += 1
                self._finish(p, error_message(
                    "unauthorized", f"too many wrong tokens from {p.peer}: this hello was not checked; try again "
                    f"in {p.at - now:.1f} s", fatal=True, seq=p.hello.seq))
        elif p.state == "refusing" and now >= p.at:
            self._finish(p, p.answer)
        elif p.state == "closing" and now >= p.at:
            self._close(p)

    def _check(self, p: _Pending, now: float) -> None:
        token = p.hello.fields.get("token", "")
        if self.token and not (isinstance(token, str) and hmac.compare_digest(
                token.encode("utf-8", "surrogatepass"), self.token.encode())):
            p.state, p.at = "refusing", now + self.backoff.failed(p.peer, now)
            p.answer = error_message("unauthorized", "wrong or missing token", fatal=True, seq=p.hello.seq)
            return
        self.backoff.succeeded(p.peer)
        del self._pending[p.conn]
        try:
            refusal = self.admit(p.conn, p.hello, p.peer)
        except Exception as exc:  # noqa: BLE001 - e.g. no thread to be had: refused, the accept thread lives on
            refusal = error_message("robot_fault", f"server error ({type(exc).__name__}); connection closed",
                                    fatal=True, seq=p.hello.seq)
        if refusal is not None:
            self._pending[p.conn] = p
            self._finish(p, refusal)

    def _finish(self, p: _Pending, reply: Message | None) -> None:
        """Send the last frame, then read until the peer closes (at most `_DRAIN_S`) so that it arrives."""
        if reply is not None:
            _send_now(p.conn, reply)
        try:
            p.conn.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(p)
            return
        if p.state in ("parked", "refusing"):
            self._sel.register(p.conn, selectors.EVENT_READ)
        p.state, p.at = "closing", time.monotonic() + _DRAIN_S

    def _close(self, p: _Pending) -> None:
        self._pending.pop(p.conn, None)
        if p.state in ("reading", "closing"):
            try:
                self._sel.unregister(p.conn)
            except (KeyError, ValueError):
                pass
        p.conn.close()


def _send_now(conn: socket.socket, msg: Message) -> None:
    """Send a small frame without waiting (a fresh socket's buffer takes it whole; else it is dropped)."""
    try:
        conn.send(encode(msg))
    except OSError:
        pass
