"""The Ray driver from the command line: an actor hung mid-episode is killed at the derived deadline and every
episode is recorded once; an episode that hangs every time is lost with its reason in the summary and one line,
exit 1 (and a resumed run finds it at the learned deadline, not the first-call allowance); a run that gives up
says why the same way; a driver SIGKILLed mid-run leaves no process of the local Ray it started.

Each runs the driver in a child process (its own local Ray), so a driver that hangs or leaks fails the test
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
    assert data["hangs"] == 1 and data["lost"] == 0  # found by the actor's watch: the phase said where
    assert data["phase_deadlines"]["host"]["deadline_s"] == FLOOR_S  # derived (the flag was not given)
    assert sorted(ids) == [f"pick_place-s{s:07d}" for s in range(1_000_000, 1_000_004)]  # each exactly once
    assert "deadlines are off" not in run.stderr


def _sim_rollout(tmp_path, name: str, env: str, *extra: str, policy="tests.envs.user_factories:make_noise_policy"):
    """`sim_rollout` on one of `tests.rollout.hang_factories`' envs with the deadlines scaled down (floor 2 s,
    allowance 20 s); returns the run and its JSON summary."""
    summary = tmp_path / f"{name}.json"
    args = [sys.executable, "-m", "capsule_rollout", "sim_rollout", "--actors", "1", "--episodes", "3",
            "--env", f"tests.rollout.hang_factories:{env}", "--policy", policy, "--max_steps", "12",
            "--out", str(tmp_path / "run"), "--no-progress", "--video", "false", "--deadline_floor_s", "2",
            "--first_call_s", "20", "--json", str(summary), *extra]
    run = subprocess.run(args, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=400)
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    return run, json.loads(summary.read_text())


def _last_lines(run) -> list[str]:
    """The lines after the table (a rich table's last line starts with its corner)."""
    lines = run.stdout.splitlines()
    end = max(i for i, line in enumerate(lines) if line.startswith("└"))
    return [line for line in lines[end + 1:] if line.strip()]


@pytest.mark.slow  # two runs, each starting a local Ray
def test_an_episode_that_hangs_every_time_ends_in_a_summary_and_one_line_and_a_resumed_run_finds_it_at_once(
        tmp_path, report):
    """The issue's deterministic hang (an env step that hangs on every attempt): before, a traceback after 212 s
    with no summary; a resumed run with only that episode left took 1,837 s (the first-call allowance, 3 times)."""
    run, data = _sim_rollout(tmp_path, "first", "hangs_in_step")
    victim = "tests.rollout.hang_factories_hangs_in_step-s1000001"  # file-system-safe
    assert run.returncode == 1, run.stderr[-3000:]
    line, written = _last_lines(run)
    assert line.startswith(f"1 of 3 episodes ended in errors (1 lost, 0 recorded with stop reason error); the first "
                           f"({victim}): hung: env step 3 ran ")
    assert line.endswith("it hung at the same place on an earlier try (an episode plays the same every time: it "
                         "would hang again)") and written.startswith("summary written to")
    assert data["episodes"] == 2 and data["lost"] == 1 and data["hangs"] == 2 and data["gave_up"] is None
    assert data["lost_episodes"] == [{"episode_id": victim, "why": line.split(": ", 1)[1]}]
    resumed, again = _sim_rollout(tmp_path, "resumed", "hangs_in_step")  # only the hanging episode is left
    assert resumed.returncode == 1 and again["episodes"] == 0 and again["lost"] == 1 and again["hangs"] == 2
    why = again["lost_episodes"][0]["why"]
    assert "past its 2.0 s deadline" in why  # measured in its own process, not the 20 s allowance
    report.add("episode hanging every time (sim_rollout, floor 2 s)", runs=2, hangs=data["hangs"] + again["hangs"],
               lost_with_reason=data["lost"] + again["lost"], tracebacks=0, exit_1=2)


@pytest.mark.slow  # a local Ray
def test_a_run_that_gives_up_writes_its_summary_and_says_why_in_one_line(tmp_path, report):
    """The second episode's step ends its actor's process every time; one restart allowed: the actor is gone
    after its second crash, and so is the run's last actor."""
    run, data = _sim_rollout(tmp_path, "crash", "exits_in_step", "--max_restarts", "1")
    assert run.returncode == 1, run.stderr[-3000:]
    line, written = _last_lines(run)
    assert line.startswith("gave up: every rollout actor crashed more than 1 times (--max_restarts); the last: ")
    assert line.endswith("; 2 of 3 episodes lost (each with its reason in --json; a resumed run plays them)")
    assert data["gave_up"] and data["episodes"] == 1 and data["lost"] == 2
    report.add("run that gives up (sim_rollout, an actor crashing)", runs=1, summaries_written=1, tracebacks=0,
               lost_with_reason=data["lost"])


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
