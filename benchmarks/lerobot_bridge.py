"""In LeRobot's venv: a control step over the bridge to a LeRobot robot (the robot side's command in a process of its
own) against the robot's own calls and its control period.

Run it there: `.venv-lerobot/bin/python -m benchmarks.lerobot_bridge` (`make lerobot-venv`). Per camera size: `robot`
is the robot's own `send_action` + `get_observation` in this process; `bridge` the same step from the rollout side's
client (`send_action` + `observe`) to the robot side's command in its own process, actions taken as they come;
`paced` the interval between steps when the robot side paces actions to the control rate, as it does by default.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from benchmarks import harness
from benchmarks.report import Block, Table, publish
from benchmarks.timing import machine, stats_us
from capsule_rollout.commands.result import ExperimentResult
from capsule_rollout.envs.robot_bridge import RobotClient
from capsule_rollout.robot_side.lerobot_backend import LeRobotBackend, LeRobotLimits
from capsule_rollout.robot_side.serve import lerobot_configs


@dataclass(frozen=True)
class BenchLeRobotBridgeConfig:
    robot_type: str = "so101_sim"
    """LeRobot robot type (`--robot.type`; default: the SO-101 follower in MuJoCo, examples/lerobot_so101_sim)."""
    plugin: str = "examples.lerobot_so101_sim"
    """Package that registers that type with LeRobot (`--robot.discover_packages_path`; empty: none)."""
    robot_id: str = "bench"
    """The robot's id, which names its calibration (`--robot.id`)."""
    calibration_dir: str = "runs/bench/calibration"
    """Where LeRobot keeps that calibration (empty: LeRobot's own place)."""
    camera_sizes: tuple[int, ...] = (0, 64)
    """Square sizes of one `front` camera of type `mujoco` (the sim's), one measurement each (0: no camera)."""
    fps: int = 30
    """The cameras' fps, and so the control rate."""
    steps: int = 300
    """Control steps timed per measurement (the first 10 left out)."""
    docs: str = ""
    """Markdown file whose bench_lerobot_bridge section is replaced by the results; empty: none."""

    def __post_init__(self) -> None:
        if self.steps < 20 or self.fps < 1:
            raise ValueError("--steps must be >= 20 and --fps >= 1")


WARMUP = 10


def robot_args(config: BenchLeRobotBridgeConfig, size: int) -> list[str]:
    cameras = f"{{front: {{type: mujoco, width: {size}, height: {size}, fps: {config.fps}}}}}" if size else "{}"
    args = [f"--robot.type={config.robot_type}", f"--robot.id={config.robot_id}", f"--robot.cameras={cameras}"]
    if config.plugin:
        args.append(f"--robot.discover_packages_path={config.plugin}")
    if config.calibration_dir:
        args.append(f"--robot.calibration_dir={config.calibration_dir}")
    if config.robot_type == "so101_sim":
        args.append(f"--robot.fps={config.fps}")  # the sim's clock
    return args


def _wiggle(backend_low: np.ndarray, backend_high: np.ndarray, start: np.ndarray) -> Callable[[int], np.ndarray]:
    """Actions that move every joint a little around where it started (well inside the bounds and the rate)."""
    amp = 0.02 * (backend_high - backend_low)
    return lambda k: np.clip(start + amp * np.sin(0.2 * k), backend_low, backend_high).astype(np.float32)


def _own_robot(args: list[str]) -> LeRobotBackend:
    """The robot itself in this process, connected (calibrated first if LeRobot has no calibration for it: the sim's
    is made from its scene; a real robot's asks, as LeRobot's commands do)."""
    from lerobot.robots import make_robot_from_config

    robot_config, _ = lerobot_configs(args)
    robot = make_robot_from_config(robot_config)
    robot.connect(calibrate=True)
    return LeRobotBackend(robot, limits=LeRobotLimits(realtime=False))


def _serve(args: list[str], realtime: bool) -> tuple[subprocess.Popen, RobotClient]:
    command = [sys.executable, "-m", "capsule_rollout.robot_side.serve", "--port", "0", "--seconds", "600", *args]
    if not realtime:
        command.append("--no-realtime")
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")})
    line = server.stdout.readline()
    if "listening on" not in line:
        server.kill()
        raise RuntimeError(f"the robot side did not start: {line}{server.stderr.read()[-2000:]}")
    return server, RobotClient("127.0.0.1", int(line.rsplit(":", 1)[1]))


def _stop(server: subprocess.Popen, client: RobotClient) -> None:
    client.close()
    server.terminate()
    server.wait(30)


def one_camera_size(args: list[str], steps: int) -> dict:
    """Steps of the robot itself and over the bridge, interleaved (the same load on both), then paced steps."""
    own = _own_robot(args)
    server, robot = _serve(args, realtime=False)
    try:
        robot.reset_to_initial()
        move = _wiggle(robot.action_low, robot.action_high, robot.observe()[0]["state"])
        own_move = _wiggle(own.action_low, own.action_high, own.present_action())
        mine, bridged = [], []
        for k in range(steps + WARMUP):
            t0 = time.perf_counter()
            own.apply(own_move(k))
            own.observe()
            t1 = time.perf_counter()
            robot.send_action(move(k))
            robot.observe()
            mine.append(t1 - t0)
            bridged.append(time.perf_counter() - t1)
        period = 1.0 / float(robot.control_hz)
    finally:
        _stop(server, robot)
        own.close()
    server, robot = _serve(args, realtime=True)
    try:
        robot.reset_to_initial()
        ends = []
        for k in range(steps + WARMUP):
            robot.send_action(move(k))
            robot.observe()
            ends.append(time.perf_counter())
    finally:
        _stop(server, robot)
    return {"period_ms": period * 1e3, "robot_us": stats_us(mine[WARMUP:]), "bridge_us": stats_us(bridged[WARMUP:]),
            "paced_interval_us": stats_us(list(np.diff(ends[WARMUP:])))}


def measure(config: BenchLeRobotBridgeConfig) -> list[dict]:
    return [{"camera": f"{size}x{size}" if size else "none", **one_camera_size(robot_args(config, size), config.steps)}
            for size in config.camera_sizes]


def report(summary: dict, config: BenchLeRobotBridgeConfig) -> list[Block]:
    rows = summary["rows"]
    ms = lambda stats, key: f"{stats[key] / 1e3:.2f}"  # noqa: E731
    cells = []
    for r in rows:
        own, step, paced = r["robot_us"], r["bridge_us"], r["paced_interval_us"]
        cells.append((r["camera"], f"{ms(own, 'median')} / {ms(own, 'p99')}", f"{ms(step, 'median')} / {ms(step, 'p99')}",
                      f"{(step['median'] - own['median']) / 1e3:.2f}", f"{ms(paced, 'median')} / {ms(paced, 'p99')}"))
    return [f"Device: **cpu** ({summary['machine'].get('cpu', '?')}), loopback TCP, robot `{config.robot_type}`, "
            f"{config.steps} steps each, control period {rows[0]['period_ms']:.1f} ms ({config.fps} Hz).",
            Table(("camera", "robot's own step, median / p99 (ms)", "over the bridge, median / p99 (ms)",
                   "bridge's share, median (ms)", "paced: interval between steps, median / p99 (ms)"), cells,
                  title="bench_lerobot_bridge")]


def run(config: BenchLeRobotBridgeConfig) -> ExperimentResult:
    summary = {"machine": machine(), "rows": measure(config)}
    publish("bench_lerobot_bridge", report(summary, config), config.docs)
    return ExperimentResult(summary)


def main(argv: list[str] | None = None) -> int:
    return harness.main(BenchLeRobotBridgeConfig(), run, "benchmarks.lerobot_bridge", __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
