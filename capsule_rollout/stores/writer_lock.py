"""`WriterLock`: one writer per store, and a second one told who holds it.

An exclusive `flock` on a file in the store, taken when a writer opens the store and released when it closes
(or when its process dies, however it dies: the kernel drops the lock, so a lock left by a crash is never
stale). The holder writes who it is into the file (pid, host, since when, its command line), so a refused
writer can name it.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

LOCK_FILE = ".writer.lock"


class WriterLockError(RuntimeError):
    """The store's writer lock cannot be taken: its file cannot be opened (a read-only directory, a directory
    where the file goes), or another process holds it (`StoreLockedError`)."""


class StoreLockedError(WriterLockError):
    """Another process is writing the store."""


class WriterLock:
    def __init__(self, directory: str | os.PathLike, what: str = "store") -> None:
        self.path = Path(directory) / LOCK_FILE
        self._guard = threading.Lock()  # the writer thread may release it on a failure while the owner closes
        self._fd: int | None = None
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise WriterLockError(f"cannot open the {what}'s writer lock {self.path}: {exc.strerror or exc}; record "
                                  "to a directory you can write (another --out), or remove what is in the lock "
                                  "file's place") from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._holder()
            os.close(self._fd)
            self._fd = None
            raise StoreLockedError(f"{Path(directory)} is being written by another process ({holder}); one writer "
                                   f"records to a {what} at a time: wait for it, or record to another --out") from None
        me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S"),
              "command": " ".join(sys.argv)[:300]}
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, json.dumps(me).encode(), 0)

    def _holder(self) -> str:
        try:
            info = json.loads(os.pread(self._fd, 4096, 0) or b"{}")
            return f"pid {info['pid']} on {info['host']} since {info['since']}: {info['command']}"
        except (OSError, ValueError, KeyError):
            return "a writer that has not said who it is yet"

    def release(self) -> None:
        with self._guard:
            if self._fd is not None:
                os.close(self._fd)  # drops the lock; the file stays, naming the last writer
                self._fd = None

    def __del__(self) -> None:
        if getattr(self, "_guard", None) is not None and getattr(self, "_fd", None) is not None:
            self.release()
