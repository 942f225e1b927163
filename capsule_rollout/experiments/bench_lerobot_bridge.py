"""bench_lerobot_bridge: a control step over the bridge to a LeRobot robot, against the robot's own calls and its
control period (in LeRobot's venv: `.venv-lerobot/bin/python -m capsule_rollout bench_lerobot_bridge`).

Per camera size: `robot` is the robot's own `send_action` + `get_observation` in this process; `bridge` the same
step from the rollout side's client (`send_action` + `observe`) to the robot side's command in its own process,
actions taken as they come; `paced` the interval between steps when the robot side paces actions to the control
rate, as it does by default. The measurements are `benchmarks/lerobot_bridge.py`'s.
"""

from __future__ import annotations

from capsule_rollout.benchmarks.lerobot_bridge import measure
from capsule_rollout.benchmarks.support import machine, update_markdown_section
from capsule_rollout.commands.configs import BenchLeRobotBridgeConfig
from capsule_rollout.commands.result import ExperimentResult
from capsule_rollout.experiments.console import make_console


def run(config: BenchLeRobotBridgeConfig) -> ExperimentResult:
    console = make_console()
    rows = measure(config)
    ms = lambda stats, key: f"{stats[key] / 1e3:.2f}"  # noqa: E731
    lines = [f"Device: **cpu** ({machine().get('cpu', '?')}), loopback TCP, robot `{config.robot_type}`, "
             f"{config.steps} steps each, control period {rows[0]['period_ms']:.1f} ms ({config.fps} Hz).", "",
             "| camera | robot's own step, median / p99 (ms) | over the bridge, median / p99 (ms) | bridge's share, "
             "median (ms) | paced: interval between steps, median / p99 (ms) |",
             "|---|---|---|---|---|"]
    for r in rows:
        own, step, paced = r["robot_us"], r["bridge_us"], r["paced_interval_us"]
        lines.append(f"| {r['camera']} | {ms(own, 'median')} / {ms(own, 'p99')} | {ms(step, 'median')} / "
                     f"{ms(step, 'p99')} | {(step['median'] - own['median']) / 1e3:.2f} | {ms(paced, 'median')} / "
                     f"{ms(paced, 'p99')} |")
    body = "\n".join(lines)
    console.print(body)
    if config.docs:
        update_markdown_section(config.docs, "bench_lerobot_bridge", body)
    return ExperimentResult({"machine": machine(), "rows": rows})
