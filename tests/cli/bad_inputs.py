"""Child process for the bad-input tests: runs each command line given (one JSON list per argument) through the
CLI's `main` in this process and prints one JSON line per command line: its exit status, its stderr lines, and
this process's peak memory so far (what a command that starts to build what it was asked for would raise).

`READ_ONLY_DIR=path` (for a test run as root, whom no directory refuses): `os.access` answers for that
directory as it does for another user on a directory of mode 555 (no write).

argv: JSON_ARGS...
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import sys

from capsule_rollout.cli.run import main

READ_ONLY = os.environ.get("READ_ONLY_DIR")
if READ_ONLY:
    _access = os.access

    def _access_as_another_user(path, mode, *args, **kwargs):
        if os.path.realpath(path) == os.path.realpath(READ_ONLY) and mode & os.W_OK:
            return False
        return _access(path, mode, *args, **kwargs)

    os.access = _access_as_another_user



def peak_mb() -> float:
    """This process's peak resident memory in MB: Linux's `VmHWM`, which belongs to the process's own memory map
    (`ru_maxrss` carries over from the parent through fork and exec: a child of a large test process would
    report the parent's size), else `ru_maxrss`."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


for raw in sys.argv[1:]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(json.loads(raw))
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    print(json.dumps({"args": json.loads(raw), "code": code, "stderr": lines,
                      "peak_mb": peak_mb()}), flush=True)
