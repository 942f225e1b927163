"""The watchdog of a local Ray: when its driver dies it kills the processes of that session, and only those."""

import os
import signal
import subprocess
import sys

import pytest

from capsule_rollout.rollout.ray_watchdog import session_processes

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
HOLD = "import sys, time; f = open(sys.argv[1], 'a'); print('up', flush=True); time.sleep(600)"


def _holder(script_dir, held) -> subprocess.Popen:
    """A process that holds `held` open; run as a script under `script_dir` (the fake Ray package), or as
    `python -c` (no Ray code) when `script_dir` is None."""
    if script_dir is None:
        argv = [sys.executable, "-c", HOLD, str(held)]
    else:
        script_dir.mkdir(parents=True, exist_ok=True)
        (script_dir / "worker.py").write_text(HOLD)
        argv = [sys.executable, str(script_dir / "worker.py"), str(held)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "up\n"
    return proc


def test_the_driver_dying_kills_its_session_and_nothing_else(tmp_path):
    ray_dir, session, other = tmp_path / "ray", tmp_path / "session_1", tmp_path / "session_2"
    for d in (session, other):
        (d / "logs").mkdir(parents=True)
    ours = _holder(ray_dir / "core", session / "logs" / "worker.out")
    theirs = _holder(ray_dir / "core", other / "logs" / "worker.out")  # another session's
    reader = _holder(None, session / "logs" / "worker.out")  # reads our logs, runs no Ray code
    procs = [ours, theirs, reader]
    try:
        assert session_processes(str(session), str(ray_dir)) == [ours.pid]
        driver = subprocess.Popen([sys.executable, "-c", (
            "import os, subprocess, sys, time; subprocess.Popen([sys.executable, '-m', "
            f"'capsule_rollout.rollout.ray_watchdog', str(os.getpid()), {str(session)!r}, {str(ray_dir)!r}], "
            "start_new_session=True); print('up', flush=True); time.sleep(600)")], stdout=subprocess.PIPE, text=True)
        procs.append(driver)
        assert driver.stdout.readline() == "up\n"
        assert ours.poll() is None  # the driver lives: nothing is killed
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        assert ours.wait(timeout=60) == -signal.SIGKILL
        assert theirs.poll() is None and reader.poll() is None
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
