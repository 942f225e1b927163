"""real_recap against a SimRobotServer on loopback: complete episodes with intervention flags and labels."""

import json

import numpy as np
import pytest

from capsule_rollout.cli.run import main
from capsule_rollout.robot_side.operator_input import ScriptedOperator, parse_script
from capsule_rollout.stores.npz_recorder import read_npz_episode
from capsule_rollout.stores.zarr_reader import ZarrEpisodeReader
from capsule_rollout.tabletop.sim_robot import SimRobotServer
from tests.policies.tiny import save_tiny_checkpoints


def test_real_recap_records_operator_labels_and_interventions(tmp_path):
    policy, critic = save_tiny_checkpoints(tmp_path / "ckpt")
    summary = tmp_path / "s.json"
    with SimRobotServer(image_size=16) as server:
        port = server.address[1]
        assert main(["real_recap", "--robot.port", str(port), "--episodes", "2", "--seed", "7",
                     "--out", str(tmp_path / "run"), "--policy", policy, "--critic", critic, "--n_exec", "2",
                     "--operator", "script", "--script", "2:takeover_on", "5:takeover_off", "8:end_success",
                     "--json", str(summary)]) == 0
    data = json.loads(summary.read_text())
    assert data["episodes"] == 2 and data["successes"] == 2 and data["stop_reasons"] == {"operator_end": 2}
    assert data["interventions_per_episode"] == 3.0
    reader = ZarrEpisodeReader(data["store"])
    assert len(reader) == 2
    ep = reader.episode(0)
    assert ep.meta.success and ep.meta.length == 9 and ep.meta.seed == 7
    assert ep.steps["intervention"].tolist() == [False, False, True, True, True, False, False, False, False]
    assert np.isnan(ep.steps["policy_action"][2:5]).all()
    npz = sorted((tmp_path / "run" / "npz").glob("*.npz"))
    assert len(npz) == 2 and read_npz_episode(npz[1]).meta.seed == 8


def test_real_recap_takes_operator_events_from_the_robot_side(tmp_path):
    """Operator input near the robot (a teleoperator's buttons; a script here) comes with the observations and is
    applied as the host's own operator's is, beside it (`--operator script` also given)."""
    policy, critic = save_tiny_checkpoints(tmp_path / "ckpt")
    summary = tmp_path / "s.json"
    near_robot = ScriptedOperator(parse_script(("2:takeover_on", "5:takeover_off", "8:end_success")))
    with SimRobotServer(image_size=16, operator=near_robot) as server:
        assert main(["real_recap", "--robot.port", str(server.address[1]), "--episodes", "1", "--seed", "7",
                     "--out", str(tmp_path / "run"), "--policy", policy, "--critic", critic, "--n_exec", "2",
                     "--operator", "script", "--script", "1:coach:lift it", "--json", str(summary)]) == 0
    data = json.loads(summary.read_text())
    assert data["successes"] == 1 and data["stop_reasons"] == {"operator_end": 1}
    ep = ZarrEpisodeReader(data["store"]).episode(0)
    assert ep.steps["intervention"].tolist() == [False, False, True, True, True, False, False, False, False]
    assert ep.meta.operator_events.split("\n") == ["1:coach:lift it", "2:takeover_on", "5:takeover_off",
                                                    "8:end_success"]


def test_bad_arguments(capsys):
    assert main(["real_recap", "--operator", "none"]) == 2  # one line, no traceback
    assert "robot.port is required" in capsys.readouterr().err
    # a malformed --script item is named before any connection is tried (nothing listens on port 1)
    assert main(["real_recap", "--robot.port", "1", "--operator", "script", "--script", "3:dance"]) == 2
    err = capsys.readouterr().err
    assert "--script item '3:dance': expected STEP:KIND" in err and "Traceback" not in err
    with pytest.raises(ValueError, match="STEP:KIND"):
        parse_script(("3:dance",))
    assert parse_script(("4:coach:go left", "4:estop"))[4][0].text == "go left"


def test_sim_robot_server_experiment_serves_and_stops(tmp_path):
    out = tmp_path / "s.json"
    assert main(["sim_robot_server", "--port", "0", "--seconds", "0.3", "--image_size", "16", "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["address"][0] == "127.0.0.1"
    assert summary["status"]["alive"] and summary["status"]["auth_timeout_s"] == 2.0


@pytest.mark.slow
def test_keyboard_operator_through_a_terminal_against_a_realtime_sim_robot(tmp_path):
    """What an operator does by hand: real_recap reading keys from a (pseudo-)terminal, the robot at 10 Hz."""
    import os
    import pty
    import select
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"))
    server = subprocess.Popen([sys.executable, "-m", "capsule_rollout", "sim_robot_server", "--port", str(port),
                               "--seconds", "120"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    master, slave = pty.openpty()
    out = tmp_path / "run"
    client = None
    try:
        assert "listening" in server.stdout.readline()
        client = subprocess.Popen([sys.executable, "-m", "capsule_rollout", "real_recap", "--robot.port", str(port),
                                   "--episodes", "2", "--seed", "1000000", "--out", str(out),
                                   "--json", str(tmp_path / "s.json")],
                                  env=env, stdin=slave, stdout=slave, stderr=slave)
        seen = b""

        def read_until(text: bytes, seconds: float) -> None:
            nonlocal seen
            deadline = time.monotonic() + seconds
            while text not in seen and time.monotonic() < deadline:
                if select.select([master], [], [], 0.05)[0]:
                    seen += os.read(master, 4096)
            assert text in seen, seen.decode(errors="replace")

        read_until(b"s: END success", 120)  # the keys are shown: the terminal is in cbreak mode
        time.sleep(1.0)
        os.write(master, b"cpick up the red block\n")
        read_until(b"[operator] coach", 10)
        os.write(master, b"t")
        read_until(b"[operator] takeover_on", 10)
        time.sleep(1.0)  # about 10 steps of teleoperation at 10 Hz
        os.write(master, b"t")
        read_until(b"[operator] takeover_off", 10)
        os.write(master, b"s")
        read_until(b"[operator] end_success", 10)
        read_until(b"episode", 10)
        os.write(master, b"f")
        read_until(b"[operator] end_failure", 10)
        assert client.wait(60) == 0
    finally:
        for proc in (client, server):
            if proc is not None and proc.poll() is None:
                proc.kill()
        os.close(master)
        os.close(slave)
    reader = ZarrEpisodeReader(out / "episodes.zarr")
    first, second = reader.episode(0), reader.episode(1)
    assert (first.meta.success, first.meta.stop_reason) == (True, "operator_end")
    assert (second.meta.success, second.meta.stop_reason) == (False, "operator_end")
    flags = first.steps["intervention"]
    assert 3 <= flags.sum() and np.ptp(np.flatnonzero(flags)) + 1 == flags.sum()  # one contiguous takeover
    events = first.meta.operator_events.split("\n")
    assert [e.split(":", 1)[1] for e in events] == ["coach:pick up the red block", "takeover_on", "takeover_off",
                                                    "end_success"]
    assert not second.steps["intervention"].any() and second.meta.operator_events.endswith(":end_failure")
