"""The robot side installed alone (`pip install packaging/robot`) in a fresh venv: no torch, Ray or MuJoCo
there, and its server, run from that venv with a backend of the user's, answers the rollout side's client."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from capsule_rollout.envs.robot_bridge import RobotClient, RobotError

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BACKEND = textwrap.dedent('''
    import numpy as np
    import capsule_rollout
    from capsule_rollout.robot_side.backend import RobotBackend

    class TwoJoints(RobotBackend):
        name = capsule_rollout.__file__  # where the robot side was imported from, for the test to see
        cameras = ("front",)
        state_dim, image_shape = 2, (4, 6)
        action_low, action_high = -np.ones(2, np.float32), np.ones(2, np.float32)
        max_rate = np.full(2, 0.5, np.float32)

        def __init__(self):
            self.pos, self.steps = np.zeros(2, np.float32), 0

        def reset(self, seed):
            self.pos[:], self.steps = 0, 0
            return "hold still"

        def observe(self):
            return ({"image_front": np.full((4, 6, 3), 7, np.uint8), "state": self.pos.copy()},
                    {"instruction": "hold still", "subtask": "", "subtask_id": 0, "step": self.steps,
                     "success": False})

        def present_action(self):
            return self.pos.copy()

        def apply(self, action):
            self.pos[:], self.steps = action, self.steps + 1

        def hold(self):
            pass

    def make():
        return TwoJoints()
''')


def _clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    return {**env, "PYTHONNOUSERSITE": "1", **extra}


@pytest.fixture(scope="module")
def robot_venv(tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("robot_venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(ROOT / "packaging" / "robot")],
                          capture_output=True, text=True, timeout=600, env=_clean_env())
    if done.returncode != 0:
        if any(s in done.stderr for s in ("No matching distribution", "Could not find a version", "NewConnection")):
            pytest.skip(f"pip cannot install numpy or setuptools here (offline?): {done.stderr[-500:]}")
        raise AssertionError(done.stdout[-2000:] + done.stderr[-3000:])
    return venv


def test_the_robot_side_installs_without_torch_ray_or_mujoco(robot_venv):
    listed = subprocess.run([str(robot_venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
                            capture_output=True, text=True, timeout=120, env=_clean_env(), check=True).stdout
    names = {line.split("==")[0].lower() for line in listed.split()}
    assert "capsule-rollout-robot" in names and "numpy" in names
    assert not names & {"torch", "ray", "mujoco", "gymnasium", "zarr", "tyro", "capsule-rollout"}, names
    assert (robot_venv / "bin" / "capsule-rollout-robot").exists()


def test_its_server_serves_the_rollout_side_with_the_safety_layer(robot_venv, tmp_path):
    (tmp_path / "two_joints.py").write_text(BACKEND)
    server = subprocess.Popen([str(robot_venv / "bin" / "python"), "-m", "capsule_rollout.robot_side.serve",
                               "--backend", "two_joints:make", "--port", "0", "--seconds", "120"],
                              cwd=tmp_path, env=_clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        assert "listening on 127.0.0.1:" in line, line + server.stderr.read()
        port = int(line.rsplit(":", 1)[1])
        with RobotClient("127.0.0.1", port) as robot:
            assert Path(robot.robot).is_relative_to(robot_venv)  # the venv's copy, not this checkout's
            assert not robot.has_operator
            assert robot.reset_to_initial(seed=0) == "hold still"
            obs, info = robot.observe()
            assert obs["image_front"].shape == (4, 6, 3) and obs["state"].tolist() == [0.0, 0.0]
            assert robot.send_action(np.array([0.25, 9.0])).tolist() == [0.25, 0.5]  # out of range, then too fast
            assert robot.observe()[0]["state"].tolist() == [0.25, 0.5]
            with pytest.raises(RobotError, match="unsafe_action"):
                robot.send_action(np.array([np.nan, 0.0]))
        server.send_signal(signal.SIGTERM)  # as Ctrl-C; a background job (CI) inherits SIGINT ignored
        out, err = server.communicate(timeout=30)
        assert server.returncode == 0, err[-2000:]
        assert "non-finite action: safe stop" in out
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
