"""Two writers on one single (non-sharded) zarr store: at once, the second is refused naming the first and
nothing of the first's is lost; one after the other, both keep every episode; a writer killed with the lock
held leaves no stale lock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from capsule_rollout.cli.run import main
from capsule_rollout.stores.writer_lock import LOCK_FILE, StoreLockedError
from capsule_rollout.stores.zarr_reader import ZarrEpisodeReader
from capsule_rollout.stores.zarr_recorder import ZarrRecorder
from tests.rollout.fakes import fake_episode

ROOT = Path(__file__).resolve().parents[2]


def _collect(out: Path, seed: int, episodes: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "capsule_rollout", "collect_demos", "--episodes", str(episodes),
                             "--seed", str(seed), "--out", str(out), "--no-progress"], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})


def _holder_pid(store: Path, timeout: float = 120.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return int(json.loads((store / LOCK_FILE).read_text())["pid"])
        except (OSError, ValueError, KeyError):
            time.sleep(0.05)
    raise AssertionError(f"no writer took {store}'s lock in {timeout} s")


def test_a_second_writer_at_once_is_refused_naming_the_first_and_nothing_is_lost(tmp_path):
    store = tmp_path / "demos.zarr"
    first = _collect(store, 0, 12)
    pid = _holder_pid(store)
    assert pid == first.pid
    # The first writer is stopped while it holds the lock, so it is still writing when the second tries, on
    # any machine (a fast one finished its episodes before a second process had started).
    os.kill(first.pid, signal.SIGSTOP)
    try:
        second = _collect(store, 100, 6)
        out, err = second.communicate(timeout=300)
        assert first.poll() is None
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert second.returncode == 2, out + err
    assert f"is being written by another process (pid {first.pid} on" in err and "collect_demos" in err
    assert "Traceback" not in err
    out, err = first.communicate(timeout=600)
    assert first.returncode == 0, out + err
    assert ZarrEpisodeReader(store).episode_ids == [f"pick_place-s{s:07d}" for s in range(12)]


def test_writers_one_after_the_other_keep_every_episode(tmp_path, capsys):
    store = tmp_path / "demos.zarr"
    for seed in (0, 3):
        assert main(["collect_demos", "--episodes", "3", "--seed", str(seed), "--out", str(store),
                     "--no-progress"]) == 0
    assert len(ZarrEpisodeReader(store)) == 6


def test_in_one_process_too_and_the_refused_writer_touches_nothing(tmp_path, capsys):
    store = tmp_path / "e.zarr"
    with ZarrRecorder(store) as recorder:
        recorder.write(fake_episode(0))
        recorder.flush()
        with pytest.raises(StoreLockedError, match=f"pid {os.getpid()} on"):
            ZarrRecorder(store)
        assert main(["collect_demos", "--episodes", "1", "--out", str(store), "--no-progress"]) == 2
        assert "one writer records to a zarr store at a time" in capsys.readouterr().err
        recorder.write(fake_episode(1))
    assert ZarrEpisodeReader(store).episode_ids == ["ep-00000", "ep-00001"]


def test_a_writer_killed_holding_the_lock_leaves_none_behind(tmp_path):
    store = tmp_path / "e.zarr"
    script = ("import os, signal, sys\nfrom capsule_rollout.stores.zarr_recorder import ZarrRecorder\n"
              "from tests.rollout.fakes import fake_episode\n"
              "r = ZarrRecorder(sys.argv[1]); r.write(fake_episode(0)); r.flush()\n"
              "os.kill(os.getpid(), signal.SIGKILL)\n")
    done = subprocess.run([sys.executable, "-c", script, str(store)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert done.returncode == -signal.SIGKILL
    assert json.loads((store / LOCK_FILE).read_text())["pid"] != os.getpid()  # the dead writer's name stays
    with ZarrRecorder(store) as recorder:  # ... but not its lock
        assert recorder.committed == 1
        recorder.write(fake_episode(1))
    assert len(ZarrEpisodeReader(store)) == 2
