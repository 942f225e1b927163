"""Admission to the robot bridge: `Admission` holds every new connection, on the server's accept thread,
until it says a valid `hello`; `PeerBackoff` delays the answers to wrong tokens by peer address, `TokenBudget`
bounds the wrong tokens checked for addresses that have never presented the right one.

Every connection is opened with a `challenge`, a fresh nonce, and its hello must prove the token over it
(`robot_side.protocol`): the token never travels, and a hello recorded on one connection is a wrong token on any
other. A connection that has not said a valid hello costs a socket and no thread, waits in a pool of its own
(`max_pending`), never counts against the server's `max_connections`, and is closed `auth_timeout_s` after it
connected. A hello is read in one step, as soon as its bytes are there, and checked at once, whatever wrong tokens
came from its address before: a guesser on the rightful client's address (a shared host, a NAT) cannot have the
rightful client's hellos refused unchecked. What is slowed is the answer to a wrong token (and its connection's
close): one address's wrong tokens are answered one after another, each `PeerBackoff.delay(n)` after the one
before, however many connections it opens. The right token is answered at once. Only the global budget holds a
hello back before its check, and only one from an address that has never presented the right token: since the
right token is answered at once, a guess that brings no welcome is known wrong, and slowing answers alone would
bound nothing; the budget bounds the guesses tested from any number of addresses (see `TokenBudget`).

A full pool makes room by closing, in this order, a connection being closed anyway, one whose wrong token awaits
its answer, one whose hello waits for the budget, or the oldest that has not said a whole hello (read once more
first), one from an address that has never presented the right token before one from an address that has; never
one whose hello had the right token. (A client says hello a round trip after it connected, once the challenge
came: a burst of new connections meanwhile would otherwise push out the rightful client as the oldest; only the
right token makes an address trusted, so a flood cannot use that way.) Only a hello with the right token is handed
to the server (`admit`), which serves it on a thread, refuses it, or has it wait for the robot (`WAIT`), first come
first served.
"""

from __future__ import annotations

import secrets
import selectors
import socket
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Literal

from capsule_rollout.robot_side.protocol import (
    NONCE_BYTES,
    PREFIX_BYTES,
    VERSION,
    Message,
    ProtocolError,
    challenge_message,
    decode_body,
    encode,
    error_message,
    parse_prefix,
    proof_matches,
)

HELLO_MAX_PAYLOAD = 64 * 1024  # before hello a frame carries at most this much payload (a hello needs none)
WAIT: Final = "wait"  # `admit`'s answer when the hello should wait for the robot and ask again
_TICK_S = 0.05  # how often the accept thread looks at the clock, the stop flag and the hellos waiting for the robot
_DRAIN_S = 0.5  # how long a closing connection is read so that its last error frame is not lost to a reset

Admit = Callable[[socket.socket, Message, str, float], Message | None | Literal["wait"]]


class PeerBackoff:
    """Failed tokens by peer address, and when each is answered. The n-th failure in a row from a peer is answered
    `delay(n)` (`base_s * 2**(n-1)`, at most `max_s`) after the later of its check and the peer's previous answer:
    one address's answers come one after another, ever slower, however many connections it opens. Only answers
    wait: every hello is checked as it arrives (a right token is never held back by the guessing of another client
    on its address). A success clears the peer; a peer with no failure nor answer due for `forget_s` starts again
    from nothing; at most `max_peers` are remembered (the least recent dropped)."""

    def __init__(self, base_s: float, max_s: float, *, forget_s: float = 60.0, max_peers: int = 4096) -> None:
        self.base_s, self.max_s, self.forget_s, self.max_peers = base_s, max_s, forget_s, max_peers
        self.failed_total = 0
        self._peers: OrderedDict[str, tuple[int, float, float]] = OrderedDict()  # failures, last failure, last answer
        self._lock = threading.Lock()  # the accept thread writes, `summary` reads from any thread

    def delay(self, failures: int) -> float:
        """Seconds between the answer to the `failures - 1`-th wrong token in a row (or the check of the first)
        and the answer to the `failures`-th."""
        return min(self.max_s, self.base_s * 2.0 ** min(failures - 1, 60))

    def failed(self, peer: str, now: float) -> float:
        """Count a wrong token from `peer` checked at `now`; returns when its answer is due."""
        with self._lock:
            entry = self._live(peer, now)
            failures = (entry[0] if entry else 0) + 1
            due = max(now, entry[2] if entry else now) + self.delay(failures)
            self._peers.pop(peer, None)
            self._peers[peer] = (failures, now, due)
            while len(self._peers) > self.max_peers:
                self._peers.popitem(last=False)
            self.failed_total += 1
            return due

    def succeeded(self, peer: str) -> None:
        with self._lock:
            self._peers.pop(peer, None)

    def summary(self, now: float) -> dict:
        with self._lock:
            live = [e for e in self._peers.values() if not self._stale(e, now)]
            waits = [e[2] - now for e in live if e[2] > now]
            return {"failed_tokens": self.failed_total, "peers_with_failures": len(live),
                    "peers_backing_off": len(waits), "longest_backoff_s": round(max(waits, default=0.0), 3),
                    "most_failures_in_a_row": max((e[0] for e in live), default=0),
                    "auth_backoff_s": self.base_s, "auth_backoff_max_s": self.max_s}

    def _stale(self, entry: tuple[int, float, float], now: float) -> bool:
        return now - max(entry[1], entry[2]) > self.forget_s

    def _live(self, peer: str, now: float) -> tuple[int, float, float] | None:
        entry = self._peers.get(peer)
        if entry is not None and self._stale(entry, now):
            del self._peers[peer]
            return None
        return entry


class TokenBudget:
    """Wrong tokens on the whole server, whatever their addresses: each spends a unit of a budget that refills at
    `per_s` a second up to `burst`. A hello from an address that has never presented the right token is checked
    only while a unit is left (`ready_at`): this, not the delay of wrong answers, bounds the guesses tested, since
    a guess that brings no welcome at once is known wrong. One from an address that has (`trust`: at most
    `max_trusted`, the least recent dropped) is checked at once whatever the budget. Only the right token makes an
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

    def trusted(self, peer: str) -> bool:
        """Whether `peer` has presented the right token (among the `max_trusted` most recent)."""
        with self._lock:
            return peer in self._trusted

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
    """A connection that has not been admitted: reading its hello, parked (its hello waits to be checked: the
    global budget is spent and its address has never presented the right token), refusing (a wrong token's answer
    is due at `at`), waiting (the right token: for the robot, in the queue) or closing (its last frame sent, read
    until the peer closes)."""

    conn: socket.socket
    peer: str
    deadline: float  # the hello must have arrived, and been checked, by then
    nonce: bytes  # the challenge this connection's hello must prove the token over
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
        self.counts = {"auth_timeouts": 0, "evicted": 0, "not_checked": 0, "plaintext_tokens": 0, "refused_full": 0,
                       "waited_for_robot": 0}
        self._pending: dict[socket.socket, _Pending] = {}  # in the order they connected
        self._queue: deque[_Pending] = deque()  # right hellos waiting for the robot, first come first
        self._sel = selectors.DefaultSelector()

    def status(self) -> dict:
        """The admission limits, how many connections wait, and the failed tokens by peer and in all (any thread)."""
        now = time.monotonic()
        pending = list(self._pending.values())
        return {"pending": len(pending), "max_pending": self.max_pending, "auth_timeout_s": self.auth_timeout_s,
                "waiting_for_robot": len(self._queue), "wrong_answers_due": sum(p.state == "refusing" for p in pending),
                **self.counts, **self.backoff.summary(now), **self.budget.summary(now)}

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
            p = _Pending(conn, str(addr[0]), time.monotonic() + self.auth_timeout_s, secrets.token_bytes(NONCE_BYTES))
            self._pending[conn] = p
            self._sel.register(conn, selectors.EVENT_READ)
            _send_now(conn, challenge_message(p.nonce))
            self._readable(p)  # what came with the connection (a protocol 1 hello) is answered before more accepts

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
        for state in ("closing", "refusing", "parked"):
            for p in self._pending.values():
                if p.state == state:
                    return p
        reading = [p for p in self._pending.values() if p.state == "reading"]
        untrusted = (p for p in reading if not self.budget.trusted(p.peer))
        return next(untrusted, reading[0] if reading else None)

    def _evict(self, victim: _Pending) -> None:
        if victim.state != "closing":
            self.counts["evicted"] += 1
            why = {"refusing": "its hello awaits its answer", "parked": "its hello was not checked",
                   "reading": "the oldest that has not said hello"}[victim.state]
            _send_now(victim.conn, error_message(
                "busy", f"{self.max_pending} connections are waiting to say hello: this one ({why}) is closed to make "
                "room", fatal=True, seq=victim.hello.seq if victim.hello else 0, unheard=victim.state == "reading"))
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
                    h_len, p_len = parse_prefix(bytes(p.buf), max_payload=HELLO_MAX_PAYLOAD, peer="client")
                    p.need = PREFIX_BYTES + h_len + p_len
                if len(p.buf) < p.need:
                    continue
                h_len = int.from_bytes(p.buf[8:12], "little")
                msg = decode_body(bytes(p.buf[PREFIX_BYTES:PREFIX_BYTES + h_len]),
                                  bytes(p.buf[PREFIX_BYTES + h_len:]))
            except ProtocolError as exc:  # before hello every broken frame closes: one error answered per connection
                self._finish(p, error_message(exc.code, exc.message, fatal=True))
                return
            self._said(p, msg)
            return

    def _said(self, p: _Pending, msg: Message) -> None:
        if msg.type == "bye":
            self._finish(p, None)
        elif msg.type != "hello":
            self._finish(p, error_message("unauthorized", "send hello first", fatal=True, seq=msg.seq))
        elif msg.fields.get("token") not in (None, ""):  # protocol 1's hello: never checked, the fix at once
            self.counts["plaintext_tokens"] += 1
            self._finish(p, error_message(
                "unauthorized", f"this hello carries the token itself; this server speaks protocol {VERSION}, where "
                "the hello proves the token over the server's challenge and the token never travels: upgrade the "
                "client (and consider the token seen by the network: change it)", fatal=True, seq=msg.seq))
        else:
            self._sel.unregister(p.conn)  # nothing more is read before the hello is answered
            p.state, p.hello, p.heard = "parked", msg, time.monotonic()
            self._try_check(p, p.heard)

    # -- tokens and the robot ---------------------------------------------------------------
    def _try_check(self, p: _Pending, now: float) -> None:
        """Check a parked hello if the global budget allows it now (its own address's failures never hold it
        back), else leave it parked till then."""
        p.at = self.budget.ready_at(p.peer, now)
        if p.at <= now:
            self._check(p, now)

    def _check(self, p: _Pending, now: float) -> None:
        """The proof against this connection's nonce: right, the server has it at once; wrong, its answer (and its
        connection's close) waits for its address's backoff."""
        if self.token and not proof_matches(p.hello.fields.get("proof"), self.token, p.nonce):
            self.budget.spent(now)
            p.state, p.at = "refusing", self.backoff.failed(p.peer, now)
            p.answer = error_message("unauthorized", "wrong or missing token: the hello's proof does not match this "
                                     "connection's challenge", fatal=True, seq=p.hello.seq)
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
                self._finish(p, error_message(
                    "unauthorized", f"too many wrong tokens on this server, and {p.peer} has not presented the right "
                    f"one before: this hello was not checked; try again in {max(p.at - now, 0.0):.1f} s",
                    fatal=True, seq=p.hello.seq))
        elif p.state == "refusing" and now >= p.at:
            self._finish(p, p.answer)
        elif p.state == "closing" and now >= p.at:
            self._close(p)

    def _finish(self, p: _Pending, reply: Message | None) -> None:
        """Send the last frame, then read until the peer closes (at most `_DRAIN_S`) so that it arrives. The state
        changes first: `status()` never counts an answer the peer may already have as still due."""
        if p.state not in ("reading", "closing"):
            self._sel.register(p.conn, selectors.EVENT_READ)
        p.state, p.at = "closing", time.monotonic() + _DRAIN_S
        if reply is not None:
            _send_now(p.conn, reply)
        try:
            p.conn.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(p)

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
