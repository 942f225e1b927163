"""Robot bridge round-trip latency on loopback (heartbeat, action, observe) against the SimRobotServer.

Per request kind, interleaved: `heartbeat` (an empty frame each way), `action` (a 4-float action, the env step
included) and `observe` (a 64x64 image and the state back), each timed from the client's send to its decoded reply.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import numpy as np

from benchmarks import harness
from benchmarks.report import Block, Table, publish
from benchmarks.timing import machine, stats_us
from capsule_rollout.commands.result import ExperimentResult
from capsule_rollout.envs.robot_bridge import RobotClient
from capsule_rollout.robot_side.protocol import Message
from capsule_rollout.tabletop.sim_robot import SimRobotServer


@dataclass(frozen=True)
class BenchBridgeConfig:
    rounds: int = 500
    """Interleaved rounds; each times every request kind once."""
    image_size: int = 64
    """Camera image size served by the sim robot."""
    docs: str = ""
    """Markdown file whose bench_bridge section is replaced by the results; empty: none."""

    def __post_init__(self) -> None:
        if self.rounds < 10:
            raise ValueError("--rounds must be >= 10")


def latency(config: BenchBridgeConfig) -> dict:
    """Heartbeat, action and observe requests in `config.rounds` interleaved rounds, each timed from the client's
    send to its decoded reply: statistics in us per request kind (the first 5 rounds left out)."""
    samples: dict[str, list[float]] = {"heartbeat": [], "action": [], "observe": []}
    with SimRobotServer(image_size=config.image_size) as server, \
            RobotClient(*server.address, heartbeat_s=None) as robot:
        robot.reset_to_initial(seed=0)
        calls = {
            "heartbeat": lambda: robot._request(Message("heartbeat", {"t": 0.0})),
            "action": lambda: robot.send_action(np.zeros(4, np.float32)),
            "observe": robot.observe,
        }
        for r in range(config.rounds):
            if r and r % 60 == 0:
                robot.reset_to_initial(seed=r)  # stay within the episode length
            for name, call in calls.items():
                t0 = time.perf_counter()
                call()
                samples[name].append(time.perf_counter() - t0)
    return {k: stats_us(v[5:]) for k, v in samples.items()}


def report(summary: dict, config: BenchBridgeConfig) -> list[Block]:
    return [f"Device: **cpu** ({summary['machine'].get('cpu', '?')}), loopback TCP, {config.image_size}x"
            f"{config.image_size} front camera, {config.rounds} interleaved rounds.",
            Table(("request", "median (µs)", "p99 (µs)"),
                  [(k, f"{v['median']:.0f}", f"{v['p99']:.0f}") for k, v in summary["latency_us"].items()],
                  title="bench_bridge")]


def run(config: BenchBridgeConfig) -> ExperimentResult:
    summary = {"machine": machine(), "latency_us": latency(config)}
    publish("bench_bridge", report(summary, config), config.docs)
    return ExperimentResult(summary)


def main(argv: list[str] | None = None) -> int:
    return harness.main(BenchBridgeConfig(), run, "benchmarks.bridge", __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
