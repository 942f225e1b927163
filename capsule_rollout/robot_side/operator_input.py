"""Operator input during rollouts: END (success / failure), takeover on/off, coaching, e-stop.

Sources give `OperatorEvent`s; the rollout loop polls them once per control step
(never blocking). `KeyboardOperator` reads a terminal (no display needed):

    s   END, success          f   END, failure
    t   takeover on / off     e   e-stop
    c   coach: type a new subtask, then Enter (it overwrites the hand-off)
    ?   print these keys

With a TTY the terminal is put in cbreak mode (keys act at once, restored on
close); any other stream (a pipe, a file) is read the same way, byte by byte.
`ScriptedOperator` plays a fixed schedule of events by control step, for tests
and for simulated operators.
"""

from __future__ import annotations

import enum
import os
import queue
import select
import sys
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import IO, Protocol

KEYS_HELP = "s: END success  f: END failure  t: takeover on/off  c: coach (type, Enter)  e: e-stop  ?: help"


class Kind(str, enum.Enum):
    END_SUCCESS = "end_success"
    END_FAILURE = "end_failure"
    TAKEOVER_ON = "takeover_on"
    TAKEOVER_OFF = "takeover_off"
    COACH = "coach"
    ESTOP = "estop"


@dataclass(frozen=True)
class OperatorEvent:
    kind: Kind
    text: str = ""  # the subtask of a COACH event


class OperatorSource(Protocol):
    """What the rollout host polls. A source whose decisions depend on what it did earlier in the episode (a
    simulated operator counting its takeovers, a schedule) can put that state in the host's capsules, so a
    branch from a mid-episode capsule meets the operator as the episode did: it implements `reset()` (a new
    episode), `capsule_state() -> tuple[int, ...]` (at most `rollout.host_state.OPERATOR_SLOTS` integers) and
    `load_capsule_state(values)` (the same integers back, after a restore). A source without them (the
    keyboard) keeps its own state across restores. A source may also have `begin_episode()`, called when each
    episode starts (after its reset, before its first poll): the keyboard starts reading keys there, so nothing
    pressed while the policy loads or the robot homes for the first episode acts before it."""

    def poll(self, step: int) -> list[OperatorEvent]:
        """Events since the last poll (`step`: the control step about to run). Never blocks."""

    def close(self) -> None: ...


class KeyParser:
    """Turns key bytes into events (takeover toggles; `c` collects text up to Enter)."""

    def __init__(self) -> None:
        self.takeover = False
        self.help_requested = False  # "?" was pressed (the source shows the keys)
        self._coach: list[str] | None = None

    def feed(self, chars: str) -> list[OperatorEvent]:
        events = []
        for ch in chars:
            if self._coach is not None:  # typing a coaching text
                if ch in "\r\n":
                    text = "".join(self._coach).strip()
                    self._coach = None
                    if text:
                        events.append(OperatorEvent(Kind.COACH, text))
                elif ch in ("\x7f", "\b"):
                    if self._coach:
                        self._coach.pop()
                elif ch == "\x1b":  # Esc: cancel
                    self._coach = None
                elif ch.isprintable():
                    self._coach.append(ch)
                continue
            key = ch.lower()
            if key == "s":
                events.append(OperatorEvent(Kind.END_SUCCESS))
            elif key == "f":
                events.append(OperatorEvent(Kind.END_FAILURE))
            elif key == "t":
                self.takeover = not self.takeover
                events.append(OperatorEvent(Kind.TAKEOVER_ON if self.takeover else Kind.TAKEOVER_OFF))
            elif key == "e":
                events.append(OperatorEvent(Kind.ESTOP))
            elif key == "c":
                self._coach = []
            elif key == "?":
                self.help_requested = True
        return events


class KeyboardOperator:
    """Operator keys from a terminal or any readable stream, read on a background thread."""

    def __init__(self, stream: IO | None = None, *, echo: IO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stdin
        self.echo = echo
        self.parser = KeyParser()
        self._events: queue.Queue[OperatorEvent] = queue.Queue()
        self._stop = threading.Event()
        self._saved_tty = None
        fd = self.stream.fileno()
        if os.isatty(fd):
            import termios
            import tty

            self._saved_tty = termios.tcgetattr(fd)
            tty.setcbreak(fd)
        self._fd = fd
        self._thread: threading.Thread | None = None  # started with the first episode (`begin_episode`)

    def begin_episode(self) -> None:
        """An episode starts: read keys from now on. At the first, keys typed before it (while the policy loaded
        or the robot homed) are dropped and the keys are shown; later episodes go on reading."""
        if self._thread is not None:
            return
        if self._saved_tty is not None:
            import termios

            termios.tcflush(self._fd, termios.TCIFLUSH)  # typed ahead: never acted on before an episode
        if self.echo is not None:
            print(KEYS_HELP, file=self.echo, flush=True)
        self._thread = threading.Thread(target=self._read, args=(self._fd,), name="operator-keys", daemon=True)
        self._thread.start()

    def _read(self, fd: int) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([fd], [], [], 0.1)
            if not ready:
                continue
            data = os.read(fd, 1024)
            if not data:
                return  # end of stream
            events = self.parser.feed(data.decode("utf-8", errors="ignore"))
            if self.parser.help_requested:
                self.parser.help_requested = False
                if self.echo is not None:
                    print(KEYS_HELP, file=self.echo, flush=True)
            for event in events:
                self._events.put(event)
                if self.echo is not None:
                    print(f"[operator] {event.kind.value}{': ' + event.text if event.text else ''}",
                          file=self.echo, flush=True)

    def poll(self, step: int) -> list[OperatorEvent]:
        out = []
        while True:
            try:
                out.append(self._events.get_nowait())
            except queue.Empty:
                return out

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1.0)
        if self._saved_tty is not None:
            import termios

            termios.tcsetattr(self.stream.fileno(), termios.TCSADRAIN, self._saved_tty)
            self._saved_tty = None


def parse_script(items: Iterable[str]) -> dict[int, list[OperatorEvent]]:
    """A `ScriptedOperator` schedule from `STEP:KIND` / `STEP:coach:TEXT` items (`real_recap --script`)."""
    schedule: dict[int, list[OperatorEvent]] = {}
    kinds = {k.value: k for k in Kind}
    for item in items:
        step, _, rest = item.partition(":")
        kind, _, text = rest.partition(":")
        if not step.isdigit() or kind not in kinds or (kind == "coach") != bool(text):
            raise ValueError(f"--script item {item!r}: expected STEP:KIND (KIND in {sorted(kinds)}), "
                             "or STEP:coach:TEXT")
        schedule.setdefault(int(step), []).append(OperatorEvent(kinds[kind], text))
    return schedule


class ScriptedOperator:
    """Plays `schedule` (control step -> events): each event once, when that step is polled or passed.
    Its state (the last step polled) goes into the host's capsules (`OperatorSource`)."""

    def __init__(self, schedule: Mapping[int, OperatorEvent | Iterable[OperatorEvent]]) -> None:
        self.schedule = {int(k): ([v] if isinstance(v, OperatorEvent) else list(v)) for k, v in schedule.items()}
        self._polled = -1  # the last step polled since the reset: every event at or before it was played

    def poll(self, step: int) -> list[OperatorEvent]:
        out = [e for at in sorted(self.schedule) if self._polled < at <= step for e in self.schedule[at]]
        self._polled = max(self._polled, step)
        return out

    def reset(self) -> None:
        """Play the schedule again (next episode)."""
        self._polled = -1

    def capsule_state(self) -> tuple[int, ...]:
        return (self._polled,)

    def load_capsule_state(self, values) -> None:
        if len(values) != 1:
            raise ValueError(f"a ScriptedOperator's capsule state is 1 integer, got {len(values)}: the capsule was "
                             "taken with another operator")
        self._polled = int(values[0])

    def close(self) -> None:
        pass
