"""Ends a local Ray session's processes when the driver that started it dies, even by SIGKILL (Linux).

Ray ties only its GCS server and raylet to the driver that started them (they get the kernel's parent-death
signal); the dashboard and runtime-env agents the raylet starts outlived a SIGKILLed driver by more than
45 s (Ray 2.60). `init_ray` therefore starts this module, when it starts a local Ray, as a child of the driver in a
session of its own (a Ctrl-C to the driver's terminal does not reach it):

    python -m capsule_rollout.rollout.ray_watchdog DRIVER_PID SESSION_DIR RAY_PACKAGE_DIR

It checks twice a second whether its parent is still the driver. When the driver is gone it SIGKILLs every
process of that Ray session, until none is left: a process runs Ray's code (its command line is a `ray::`
title, or names a file of the Ray package) and holds a file open under the session directory (its logs,
sockets). A cluster the driver joined has no watchdog. `shutdown_ray` stops it with SIGTERM (it then
exits without killing anything: `ray.shutdown` has stopped the session).
"""

from __future__ import annotations

import os
import signal
import sys
import time

POLL_S = 0.5
"""How often the watchdog checks that the driver is alive."""
KILL_ROUNDS = 50
"""Scans of /proc (0.1 s apart) while processes of the session are still found (a dying raylet may start one)."""


def _holds_file_under(pid: str, directory: str) -> bool:
    fds = f"/proc/{pid}/fd"
    for fd in os.listdir(fds):
        try:
            if os.readlink(f"{fds}/{fd}").startswith(directory):
                return True
        except OSError:  # closed meanwhile
            continue
    return False


def session_processes(session_dir: str, ray_dir: str) -> list[int]:
    """Pids of the live processes of the Ray session at `session_dir` (this process excepted)."""
    session_dir, ray_dir = session_dir.rstrip("/") + "/", ray_dir.rstrip("/") + "/"
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0")]
            runs_ray = argv[0].startswith("ray::") or any(a.startswith(ray_dir) for a in argv)
            if runs_ray and (any(session_dir in a for a in argv) or _holds_file_under(pid, session_dir)):
                found.append(int(pid))
        except OSError:  # gone, or another user's
            continue
    return found


def kill_session(session_dir: str, ray_dir: str) -> int:
    """SIGKILL every process of the session until a scan finds none; returns how many were killed."""
    killed: set[int] = set()
    for _ in range(KILL_ROUNDS):
        pids = session_processes(session_dir, ray_dir)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    return len(killed)


def main(argv: list[str]) -> int:
    driver, session_dir, ray_dir = int(argv[0]), argv[1], argv[2]
    while os.getppid() == driver:
        time.sleep(POLL_S)
    kill_session(session_dir, ray_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
