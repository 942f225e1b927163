"""`serve_policy` in a process of its own (what a test kills), with this checkout on its path (the examples); started as
the remote policy benchmark starts it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from benchmarks.remote_policy import start_server as start

ROOT = Path(__file__).resolve().parents[2]


def start_server(*args: str) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return start(list(args), env=env)
