"""The Ray driver with default flags: an actor hung mid-episode is killed at the derived deadline and every
episode is recorded once; a driver SIGKILLed mid-run leaves no process of the local Ray it started.

Both run the driver in a child process (its own local Ray), so a driver that hangs or leaks fails the test
instead of stalling the suite.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from capsule_rollout.stores.zarr_reader import ZarrEpisodeReader
from tests.policies.tiny import save_tiny_checkpoints
from tests.rollout import faults

pytestmark = [pytest.mark.ray]
ROOT = Path(__file__).resolve().parents[2]
KILLED_DRIVER = ROOT / "tests/reliability/ray_driver_kill.py"
LEFT_WITHIN_S = 15.0  # how long the processes of a killed driver's Ray may outlive it


def _env() -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)  # a local Ray of the child's own
    return env


@pytest.mark.slow  # the deadline's 30 s floor, after a local Ray starts
def test_a_hung_actor_is_killed_at_the_derived_deadline_and_every_episode_recorded_once(tmp_path, report):
    """No --episode_timeout_s: one actor, whose third episode hangs (its first call is under the first-call
    allowance; by the third, the deadline is derived from the steps it measured)."""
    policy, critic = save_tiny_checkpoints(tmp_path / "ckpt")
    out, summary, marker = tmp_path / "run", tmp_path / "s.json", tmp_path / "hung"
    victim = "pick_place-s1000002"
    args = [sys.executable, "-m", "capsule_rollout", "sim_rollout", "--actors", "1", "--episodes", "4",
            "--out", str(out), "--policy", policy, "--critic", critic, "--n_exec", "2", "--no-progress",
            "--video", "false", "--json", str(summary), *faults.cli_option(victim, 3, marker, "hang")]
    run = subprocess.run(args, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stderr[-3000:]
    from capsule_rollout.rollout.deadlines import FLOOR_S
    data = json.loads(summary.read_text())
    ids = ZarrEpisodeReader(data["store"]).episode_ids
    report.add("hung actor, default deadline (sim_rollout)", runs=1, hangs=int(marker.exists()),
               killed_at_deadline=data["timeouts"], episodes_recorded=len(set(ids)), duplicates=len(ids) - len(set(ids)))
    assert marker.read_text() == "hang\n"  # the actor really hung mid-episode
    assert data["timeouts"] == 1 and data["actor_failures"] == 1 and data["resubmitted"] == 1
    assert data["episode_deadline_s"] >= FLOOR_S  # derived (the flag was not given)
    assert sorted(ids) == [f"pick_place-s{s:07d}" for s in range(1_000_000, 1_000_004)]  # each exactly once
    assert "deadlines are off" not in run.stderr


def _processes() -> dict[int, tuple[int, str, str]]:
    """pid -> (parent pid, state, start time) of every process, from /proc/<pid>/stat."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after the command name, which may hold spaces
        out[int(name)] = (int(fields[1]), fields[0], fields[19])
    return out


def _descendants(root: int) -> dict[int, str]:
    """pid -> start time of every live descendant of `root`."""
    procs = _processes()
    found, todo = {}, [root]
    while todo:
        parent = todo.pop()
        for pid, (ppid, state, start) in procs.items():
            if ppid == parent and state != "Z" and pid not in found:
                found[pid] = start
                todo.append(pid)
    return found


def _alive(recorded: dict[int, str]) -> list[int]:
    """The recorded processes still running (a zombie left to a parent that does not reap it is dead)."""
    procs = _processes()
    return [pid for pid, start in recorded.items() if pid in procs and procs[pid][2] == start and procs[pid][1] != "Z"]


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:80]
    except OSError:
        return "?"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_sigkilled_driver_leaves_no_process_of_the_local_ray_it_started(tmp_path, report):
    stdout = tmp_path / "stdout"
    with stdout.open("w") as out, (tmp_path / "stderr").open("w") as err:
        driver = subprocess.Popen([sys.executable, str(KILLED_DRIVER), str(tmp_path)], cwd=ROOT, env=_env(),
                                  stdout=out, stderr=err)
    recorded: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 300
        while not any(line.startswith('{"driver"') for line in stdout.read_text().splitlines()):
            assert driver.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
            assert time.monotonic() < deadline, "the driver played no episode in 300 s"
            time.sleep(0.5)
        info = json.loads(next(line for line in stdout.read_text().splitlines() if line.startswith('{"driver"')))
        assert info == {"driver": driver.pid, "where": "local"}
        recorded = _descendants(driver.pid)  # Ray's GCS, raylet, agents, workers... (and the watchdog)
        commands = [_command(pid) for pid in recorded]
        assert any("raylet" in c for c in commands) and any(c.startswith("ray::RolloutActor") for c in commands)
        assert any(c.startswith("ray::DashboardAgent") for c in commands), commands
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        end = time.monotonic() + LEFT_WITHIN_S
        while _alive(recorded) and time.monotonic() < end:
            time.sleep(0.25)
        left = _alive(recorded)
        report.add("driver SIGKILLed mid-run (local Ray)", kills=1, ray_processes=len(recorded),
                   left_15s_after=len(left))
        assert not left, [_command(pid) for pid in left]
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        for pid in _alive(recorded):  # what a failing run left: this test's own processes
            os.kill(pid, signal.SIGKILL)
