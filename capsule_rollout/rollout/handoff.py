"""Subtask hand-off: a planner publishes the current subtask, the actor reads it every tick.

One fixed block of memory holds the subtask (index, text, who wrote it) under a
sequence counter (a seqlock): a writer makes the counter odd, writes the payload,
then makes it even again; a reader copies the payload between two reads of the
counter and retries when they differ or are odd. Readers therefore never see a
torn subtask, never block the writer, and nothing is sent or allocated per
hand-off: writer and reader look at the same bytes.

- `SubtaskChannel()` keeps the block in one torch tensor (in-process: planner and
  actor threads, `coach()` from an operator thread).
- `SubtaskChannel.create_shared()` puts the block in a named shared-memory segment;
  `SubtaskChannel.attach(name)` (or unpickling the channel, e.g. as an argument to
  a Ray actor on the same node) maps the same segment in another process.

Writers within one process are serialised by a lock; across processes, keep one
writing process per channel (e.g. the planner; route operator coaching through it).
The ordering argument assumes stores and loads are not reordered across the
counter accesses, which holds on x86-64 (TSO); on weaker memory models the GIL's
atomic operations between the numpy accesses act as barriers in practice.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np
import torch

TEXT_BYTES = 256
"""Longest subtask text in UTF-8 bytes."""

SOURCE_NONE, SOURCE_PLANNER, SOURCE_COACH = 0, 1, 2
SOURCES = {SOURCE_NONE: "none", SOURCE_PLANNER: "planner", SOURCE_COACH: "coach"}

# int64 header words, then the text bytes
_SEQ, _INDEX, _LENGTH, _SOURCE, _HEADER_WORDS = 0, 1, 2, 3, 4
NBYTES = _HEADER_WORDS * 8 + TEXT_BYTES


class HandoffError(RuntimeError):
    """The channel could not be read or written (a stuck writer, a bad subtask)."""


@dataclass(frozen=True)
class Subtask:
    version: int  # 0: nothing published yet; +1 per publish
    index: int  # the task's subtask index (-1: none / free text)
    text: str
    source: str  # "none", "planner" or "coach"


class SubtaskChannel:
    """A versioned subtask block (see the module docstring)."""

    def __init__(self, *, _shm: shared_memory.SharedMemory | None = None, _owner: bool = False) -> None:
        self._shm = _shm
        self._owner = _owner
        if _shm is None:
            self.tensor = torch.zeros(NBYTES, dtype=torch.uint8)
            raw = self.tensor.numpy()
        else:
            raw = np.ndarray((NBYTES,), np.uint8, buffer=_shm.buf)
            self.tensor = torch.from_numpy(raw)
        self._raw = raw
        self._words = raw[: _HEADER_WORDS * 8].view(np.int64)
        self._text = raw[_HEADER_WORDS * 8:]
        self._lock = threading.Lock()

    # -- construction ---------------------------------------------------------------
    @classmethod
    def create_shared(cls, name: str | None = None) -> SubtaskChannel:
        """A channel in a new shared-memory segment; `close(unlink=True)` when done."""
        shm = shared_memory.SharedMemory(name=name, create=True, size=NBYTES)
        np.ndarray((NBYTES,), np.uint8, buffer=shm.buf)[:] = 0
        return cls(_shm=shm, _owner=True)

    @classmethod
    def attach(cls, name: str) -> SubtaskChannel:
        """Map the shared segment `name` made by `create_shared` (same node)."""
        try:
            shm = shared_memory.SharedMemory(name=name, create=False)
        except FileNotFoundError:
            raise HandoffError(f"no subtask channel named {name!r} on this node (was it closed?)") from None
        if shm.size < NBYTES:
            shm.close()
            raise HandoffError(f"shared segment {name!r} has {shm.size} bytes, a subtask channel needs {NBYTES}")
        return cls(_shm=shm, _owner=False)

    @property
    def name(self) -> str | None:
        """The shared segment's name (None for an in-process channel)."""
        return None if self._shm is None else self._shm.name

    @property
    def address(self) -> int:
        """Address of the block in this process (the memory writer and reader share)."""
        return self.tensor.data_ptr()

    def __reduce__(self):
        if self._shm is None:
            raise TypeError("an in-process SubtaskChannel cannot be sent to another process; "
                            "use SubtaskChannel.create_shared()")
        return (SubtaskChannel.attach, (self._shm.name,))

    def close(self, unlink: bool | None = None) -> None:
        """Unmap the segment; the creator also removes it unless `unlink=False`."""
        if self._shm is None:
            return
        self._words = self._text = self._raw = None  # drop views before closing the mapping
        self.tensor = None
        shm, self._shm = self._shm, None
        shm.close()
        if self._owner if unlink is None else unlink:
            try:
                shm.unlink()
            except FileNotFoundError:
                pass

    def __enter__(self) -> SubtaskChannel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- writing --------------------------------------------------------------------
    def publish(self, text: str, index: int = -1, *, source: int = SOURCE_PLANNER) -> int:
        """Make `text` (subtask `index`) the current subtask; returns its version."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"a subtask needs non-empty text, got {text!r}")
        data = text.encode("utf-8")
        if len(data) > TEXT_BYTES:
            raise ValueError(f"subtask text is {len(data)} bytes in UTF-8; the channel holds at most {TEXT_BYTES}")
        if source not in (SOURCE_PLANNER, SOURCE_COACH):
            raise ValueError(f"source must be SOURCE_PLANNER or SOURCE_COACH, got {source!r}")
        words = self._words
        with self._lock:
            seq = int(words[_SEQ])
            seq += seq & 1  # odd: a writer died mid-write; its torn payload is overwritten now
            words[_SEQ] = seq + 1  # odd: a write is under way
            words[_INDEX] = index
            words[_LENGTH] = len(data)
            words[_SOURCE] = source
            self._text[: len(data)] = np.frombuffer(data, np.uint8)
            self._text[len(data):] = 0  # no bytes of an older, longer text linger in the block
            words[_SEQ] = seq + 2  # even: consistent again
        return (seq + 2) // 2

    def coach(self, text: str) -> int:
        """An operator's correction: overwrites the current subtask at once."""
        return self.publish(text, -1, source=SOURCE_COACH)

    # -- reading --------------------------------------------------------------------
    def version(self) -> int:
        """The version last published completely (cheap: one load; for polling every tick)."""
        return int(self._words[_SEQ]) // 2

    def read(self, timeout_s: float = 1.0) -> Subtask:
        """The current subtask, never torn; retries while a write is in progress."""
        words, text = self._words, self._text
        deadline = None
        while True:
            s1 = int(words[_SEQ])
            if not s1 & 1:
                index, length, source = int(words[_INDEX]), int(words[_LENGTH]), int(words[_SOURCE])
                payload = text[: min(max(length, 0), TEXT_BYTES)].tobytes()
                if int(words[_SEQ]) == s1:
                    return Subtask(version=s1 // 2, index=index, text=payload.decode("utf-8"),
                                   source=SOURCES.get(source, "none"))
            if deadline is None:
                deadline = time.monotonic() + timeout_s
            elif time.monotonic() > deadline:
                raise HandoffError(f"subtask channel stayed mid-write for {timeout_s} s (a writer died while writing?)")

    def poll(self, last_version: int) -> Subtask | None:
        """The current subtask if its version differs from `last_version`, else None."""
        if self.version() == last_version:
            return None
        return self.read()
