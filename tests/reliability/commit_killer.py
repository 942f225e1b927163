"""Child process for the kill-during-commit tests: appends one batch of episodes to copies of a store,
each copy in a forked process killed just before the k-th filesystem operation of the append.

argv: BASE_STORE WORKDIR FIRST_INDEX COUNT K [K ...]
  K = -1 counts the append's operations without killing (prints {"ops": n, "kinds": [...]}); otherwise each
  K gets WORKDIR/k<K>, a copy of BASE_STORE appended to by a process killed before operation K (0-based),
  and one JSON line {"status": {K: exit status}} is printed (9: killed, 0: finished first).

Operations are what changes the store's directory tree or a file in it: opening a file for writing,
replace/rename/link/symlink, unlink/rmdir/mkdir; only those made while `ZarrRecorder._append` runs count.
The episodes are made and the recorder module imported before forking; zarr starts its IO thread on
first use, which happens in the child.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import shutil
import sys
import threading

from capsule_rollout.stores.zarr_recorder import ZarrRecorder
from tests.rollout.fakes import fake_episode

WRITE_MODES = set("wax+")
MUTATING = ("replace", "rename", "link", "symlink", "unlink", "remove", "rmdir", "mkdir")


class _Tripwire:
    """Counts operations while armed; `os._exit(9)` just before operation number `kill_at`."""

    def __init__(self, kill_at: int) -> None:
        self.kill_at, self.count, self.armed = kill_at, 0, False
        self.kinds: list[str] = []
        self.lock = threading.Lock()

    def hit(self, kind: str) -> None:
        if not self.armed:
            return
        with self.lock:
            if self.count == self.kill_at:
                os._exit(9)
            self.count += 1
            self.kinds.append(kind)

    def install(self) -> None:
        for name in MUTATING:
            original = getattr(os, name)

            def wrapped(*args, _original=original, _name=name, **kwargs):
                self.hit(_name)
                return _original(*args, **kwargs)

            setattr(os, name, wrapped)
        original_open = builtins.open

        def opened(file, mode="r", *args, **kwargs):
            if WRITE_MODES & set(mode):
                self.hit(f"write {os.path.basename(str(file))}")
            return original_open(file, mode, *args, **kwargs)

        builtins.open = io.open = opened
        append = ZarrRecorder._append

        def armed_append(recorder, episodes):
            self.armed = True
            try:
                return append(recorder, episodes)
            finally:
                self.armed = False

        ZarrRecorder._append = armed_append


def _append(base: str, dest: str, episodes, kill_at: int) -> _Tripwire:
    shutil.copytree(base, dest, symlinks=True)
    wire = _Tripwire(kill_at)
    wire.install()
    with ZarrRecorder(dest, batch_window=5.0) as recorder:  # one batch: the flush sends it
        for episode in episodes:
            recorder.write(episode)
        recorder.flush()
    return wire


def main(argv: list[str]) -> None:
    base, workdir, first, count = argv[0], argv[1], int(argv[2]), int(argv[3])
    kills = [int(k) for k in argv[4:]]
    episodes = [fake_episode(i, length=5 + i % 4, image_size=16) for i in range(first, first + count)]
    if kills == [-1]:
        wire = _append(base, os.path.join(workdir, "count"), episodes, kill_at=-1)
        print(json.dumps({"ops": wire.count, "kinds": wire.kinds}), flush=True)
        return
    status = {}
    for k in kills:
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            try:
                _append(base, os.path.join(workdir, f"k{k}"), episodes, kill_at=k)
                os._exit(0)
            except BaseException:  # noqa: BLE001 - reported as the exit status
                import traceback

                traceback.print_exc()
                os._exit(3)
        _, raw = os.waitpid(pid, 0)
        status[k] = os.waitstatus_to_exitcode(raw)
    print(json.dumps({"status": status}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
