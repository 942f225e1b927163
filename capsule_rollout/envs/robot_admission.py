"""Admission to the robot bridge: `Admission` holds every new connection, on the server's accept thread,
until it says a valid `hello`; `PeerBackoff` slows down a peer address whose tokens fail, `TokenBudget` all
addresses together.

A connection that has not said a valid hello costs a socket and no thread, waits in a pool of its own
(`max_pending`), never counts against the server's `max_connections`, and is closed `auth_timeout_s` after it
connected. A hello is read in one step, as soon as its bytes are there (a connection is read as it is accepted),
and checked at once unless its address backs off or the global budget of wrong tokens is spent. A full pool makes
room by closing, in this order, a connection being closed anyway, one whose wrong token awaits its answer, one whose
hello waits to be checked, or the oldest that has not said a whole hello (read once more first); never one whose
hello had the right token. Only a hello with the right token is handed to the server (`admit`), which serves it
on a thread, refuses it, or has it wait for the robot (`WAIT`), first come first served.
"""

from __future__ import annotations

import hmac
import selectors
import socket
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Literal

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
WAIT: Final = "wait"  # `admit`'s answer when the hello should wait for the robot and ask again
_TICK_S = 0.05  # how often the accept thread looks at the clock, the stop flag and the hellos waiting for the robot
_DRAIN_S = 0.5  # how long a closing connection is read so that its last error frame is not lost to a reset

Admit = Callable[[socket.socket, Message, str, float], Message | None | Literal["wait"]]


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


class TokenBudget:
    """Wrong tokens on the whole server, whatever their addresses: each spends a unit of a budget that refills at
    `per_s` a second up to `burst`. A hello from an address that has never presented the right token is checked
    only while a unit is left (`ready_at`); one from an address that has (`trust`: at most `max_trusted`, the least
    recent dropped) is checked whatever the budget, its own backoff still applying. Only the right token makes an
    address trusted, so guessing from many addresses can neither use that way nor push the rightful client's
    address out of it."""

    def __init__(self, per_s: float, *, burst: float | None = None, max_trusted: int = 256) -> None:
        self.per_s, self.max_trusted = per_s, max_trusted
        self.burst = max(1.0, per_s) if burst is None else burst
        self.spent_total = 0
        self._units, self._at = self.burst, 0.0
        self._trusted: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()  # the accept thread writes, `summary` reads from any thread

    def ready_at(self, peer: str, now: float) -> float:
        """When a hello from `peer` may be checked as far as the whole server goes (`now` or earlier: at once)."""
        with self._lock:
            if peer in self._trusted:
                return now
            units = self._refill(now)
            return now if units >= 1 else now + (1 - units) / self.per_s

    def spent(self, now: float) -> None:
        """Count a wrong token checked at `now` (from any address, trusted or not)."""
        with self._lock:
            self._units = self._refill(now) - 1
            self.spent_total += 1

    def trust(self, peer: str) -> None:
        with self._lock:
            self._trusted.pop(peer, None)
            self._trusted[peer] = None
            while len(self._trusted) > self.max_trusted:
                self._trusted.popitem(last=False)

    def summary(self, now: float) -> dict:
        with self._lock:
            return {"auth_checks_per_s": self.per_s, "auth_checks_burst": self.burst,
                    "auth_checks_left": round(max(self._refill(now), 0.0), 2), "trusted_peers": len(self._trusted)}

    def _refill(self, now: float) -> float:
        """The units left at `now` (or at the last spend, whichever is later); moves the clock on."""
        if now > self._at:
            self._units, self._at = min(self.burst, self._units + (now - self._at) * self.per_s), now
        return self._units


@dataclass(eq=False)
class _Pending:
    """A connection that has not been admitted: reading its hello, parked (its hello waits to be checked: its
    address backs off, or the global budget is spent), refusing (a wrong token's answer is due at `at`), waiting
    (the right token: for the robot, in the queue) or closing (its last frame sent, read until the peer closes)."""

    conn: socket.socket
    peer: str
    deadline: float  # the hello must have arrived, and been checked, by then
    buf: bytearray = field(default_factory=bytearray)
    need: int = PREFIX_BYTES
    state: str = "reading"
    hello: Message | None = None
    heard: float = 0.0  # when the hello was whole
    at: float = 0.0
    answer: Message | None = None


class Admission:
    """The accept thread: new connections, their hellos and tokens (see the module docstring).

    `admit(conn, hello, peer, heard)` is called with every hello whose token is right (`heard`: when it was
    whole); it takes the connection over (None), returns the error to answer with (the connection is then closed
    here), or `WAIT`: the hello waits, and is offered again every tick, ahead of any hello that came after it.
    """

    def __init__(self, sock: socket.socket, stop: threading.Event, admit: Admit, *, token: str,
                 auth_timeout_s: float, max_pending: int, backoff: PeerBackoff, budget: TokenBudget) -> None:
        self.sock, self.stop, self.admit, self.token = sock, stop, admit, token
        self.auth_timeout_s, self.max_pending, self.backoff, self.budget = auth_timeout_s, max_pending, backoff, budget
        self.counts = {"auth_timeouts": 0, "evicted": 0, "not_checked": 0, "refused_full": 0, "waited_for_robot": 0}
        self._pending: dict[socket.socket, _Pending] = {}  # in the order they connected
        self._queue: deque[_Pending] = deque()  # right hellos waiting for the robot, first come first
        self._sel = selectors.DefaultSelector()

    def status(self) -> dict:
        """The admission limits, how many connections wait, and the failed tokens by peer and in all (any thread)."""
        now = time.monotonic()
        return {"pending": len(self._pending), "max_pending": self.max_pending, "auth_timeout_s": self.auth_timeout_s,
                "waiting_for_robot": len(self._queue), **self.counts, **self.backoff.summary(now),
                **self.budget.summary(now)}

    def run(self) -> None:
        self.sock.setblocking(False)
        self._sel.register(self.sock, selectors.EVENT_READ)
        try:
            while not self.stop.is_set():
                for key, _ in self._sel.select(_TICK_S):
                    if key.fileobj is self.sock:
                        self._accept()
                    else:
                        p = self._pending.get(key.fileobj)  # None: closed by an accept in this same batch
                        if p is not None and p.state in ("reading", "closing"):
                            self._readable(p)
                self._serve_queue()
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
            if len(self._pending) >= self.max_pending and not self._make_room():
                self.counts["refused_full"] += 1  # every one waiting has said the right token
                _send_now(conn, error_message("busy", f"{self.max_pending} clients are waiting for the robot",
                                              fatal=True))
                conn.close()
                continue
            p = _Pending(conn, str(addr[0]), time.monotonic() + self.auth_timeout_s)
            self._pending[conn] = p
            self._sel.register(conn, selectors.EVENT_READ)
            self._readable(p)  # a hello sent as the client connected is often there already: heard before more accepts

    def _make_room(self) -> bool:
        """Close one connection so that a new one fits; False when none may be closed."""
        for _ in range(len(self._pending) + 1):
            victim = self._victim()
            if victim is None:
                return False
            if victim.state == "reading":
                self._readable(victim)  # what it has sent by now is heard first: a whole hello is no longer a victim
                if len(self._pending) < self.max_pending:
                    return True
                if victim.state != "reading":
                    continue
            self._evict(victim)
            return True
        return False

    def _victim(self) -> _Pending | None:
        """Which connection a full pool closes (see the module docstring), oldest first within each kind."""
        for state in ("closing", "refusing", "parked", "reading"):
            for p in self._pending.values():
                if p.state == state:
                    return p
        return None

    def _evict(self, victim: _Pending) -> None:
        if victim.state != "closing":
            self.counts["evicted"] += 1
            why = {"refusing": "its wrong token was counted", "parked": "its hello was not checked",
                   "reading": "the oldest that has not said hello"}[victim.state]
            _send_now(victim.conn, error_message(
                "busy", f"{self.max_pending} connections are waiting to say hello: this one ({why}) is closed to make "
                "room", fatal=True, seq=victim.hello.seq if victim.hello else 0))
        self._close(victim)

    def _readable(self, p: _Pending) -> None:
        """Read what is there: to the end of a closing connection, or as much of the hello as has arrived (one
        step: prefix and body alike)."""
        if p.state == "closing":
            try:
                chunk = p.conn.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                chunk = b""
            if not chunk:
                self._close(p)
            return
        while p.state == "reading":
            try:
                chunk = p.conn.recv(p.need - len(p.buf))
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                chunk = b""
            if not chunk:
                if p.buf:
                    self._finish(p, error_message("truncated", f"connection ended {p.need - len(p.buf)} bytes "
                                                  "before the frame's end", fatal=True))
                else:
                    self._close(p)
                return
            p.buf += chunk
            try:
                if p.need == PREFIX_BYTES and len(p.buf) == PREFIX_BYTES:
                    h_len, p_len = parse_prefix(bytes(p.buf), max_payload=HELLO_MAX_PAYLOAD)
                    p.need = PREFIX_BYTES + h_len + p_len
                if len(p.buf) < p.need:
                    continue
                h_len = int.from_bytes(p.buf[8:12], "little")
                msg = decode_body(bytes(p.buf[PREFIX_BYTES:PREFIX_BYTES + h_len]),
                                  bytes(p.buf[PREFIX_BYTES + h_len:]))
            except ProtocolError as exc:
                reply = error_message(exc.code, exc.message, fatal=exc.fatal)
                if exc.fatal:
                    self._finish(p, reply)
                else:  # a frame that decodes to nothing usable: answered, the stream is still in step
                    _send_now(p.conn, reply)
                    p.buf, p.need = bytearray(), PREFIX_BYTES
                return
            self._said(p, msg)
            return

    def _said(self, p: _Pending, msg: Message) -> None:
        if msg.type == "bye":
            self._finish(p, None)
        elif msg.type != "hello":
            self._finish(p, error_message("unauthorized", "send hello first", fatal=True, seq=msg.seq))
        else:
            self._sel.unregister(p.conn)  # nothing more is read before the hello is answered
            p.state, p.hello, p.heard = "parked", msg, time.monotonic()
            self._try_check(p, p.heard)

    # -- tokens and the robot ---------------------------------------------------------------
    def _try_check(self, p: _Pending, now: float) -> None:
        """Check a parked hello if its address and the whole server allow it now, else leave it parked till then."""
        p.at = max(self.backoff.ready_at(p.peer, now), self.budget.ready_at(p.peer, now))
        if p.at <= now:
            self._check(p, now)

    def _check(self, p: _Pending, now: float) -> None:
        token = p.hello.fields.get("token", "")
        if self.token and not (isinstance(token, str) and hmac.compare_digest(
                token.encode("utf-8", "surrogatepass"), self.token.encode())):
            self.budget.spent(now)
            p.state, p.at = "refusing", now + self.backoff.failed(p.peer, now)
            p.answer = error_message("unauthorized", "wrong or missing token", fatal=True, seq=p.hello.seq)
            return
        self.backoff.succeeded(p.peer)
        self.budget.trust(p.peer)
        if self._queue or not self._offer(p):  # the robot goes to the hellos that waited first
            p.state = "waiting"
            self._queue.append(p)
            self.counts["waited_for_robot"] += 1

    def _offer(self, p: _Pending) -> bool:
        """Hand a right hello to the server: True when that settled it (taken over, or refused and closing)."""
        try:
            answer = self.admit(p.conn, p.hello, p.peer, p.heard)
        except Exception as exc:  # noqa: BLE001 - e.g. no thread to be had: refused, the accept thread lives on
            answer = error_message("robot_fault", f"server error ({type(exc).__name__}); connection closed",
                                   fatal=True, seq=p.hello.seq)
        if answer is None:
            del self._pending[p.conn]  # the server's now
            return True
        if answer == WAIT:
            return False
        self._finish(p, answer)
        return True

    def _serve_queue(self) -> None:
        """Offer the robot to the hellos waiting for it, oldest first; those behind one that still waits wait too."""
        while self._queue:
            p = self._queue[0]
            if p.state == "waiting" and not self._offer(p):
                return
            self._queue.popleft()

    # -- what is due ----------------------------------------------------------------------
    def _timers(self, p: _Pending, now: float) -> None:
        if p.state == "reading" and now > p.deadline:
            self.counts["auth_timeouts"] += 1
            self._finish(p, error_message("idle_timeout", f"no hello within {self.auth_timeout_s:g} s of "
                                          "connecting: connection closed", fatal=True))
        elif p.state == "parked" and (now >= p.at or now > p.deadline):
            self._try_check(p, now)  # another hello may have gone first
            if p.state == "parked" and now > p.deadline:  # still not allowed: refused unchecked, which tells nothing
                self.counts["not_checked"] += 1
                by_peer = self.backoff.ready_at(p.peer, now) > now
                why = f"too many wrong tokens from {p.peer}" if by_peer else "too many wrong tokens on this server"
                self._finish(p, error_message(
                    "unauthorized", f"{why}: this hello was not checked; try again in {p.at - now:.1f} s",
                    fatal=True, seq=p.hello.seq))
        elif p.state == "refusing" and now >= p.at:
            self._finish(p, p.answer)
        elif p.state == "closing" and now >= p.at:
            self._close(p)

    def _finish(self, p: _Pending, reply: Message | None) -> None:
        """Send the last frame, then read until the peer closes (at most `_DRAIN_S`) so that it arrives."""
        if reply is not None:
            _send_now(p.conn, reply)
        try:
            p.conn.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(p)
            return
        if p.state not in ("reading", "closing"):
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
