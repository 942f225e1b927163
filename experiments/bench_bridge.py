"""bench_bridge: round-trip latency of the robot bridge on loopback (SimRobotServer, real protocol).

Per request kind, interleaved: `heartbeat` (an empty frame each way), `action`
(a 4-float action, the env step included) and `observe` (a 64x64 image and the
state back), each timed from the client's send to its decoded reply.
"""

from __future__ import annotations

import time

import numpy as np

from envs.robot_bridge import RobotClient, SimRobotServer
from envs.robot_protocol import Message
from benchmarks.support import machine, stats_us, update_markdown_section
from commands.configs import BenchBridgeConfig
from experiments.console import make_console
from commands.result import ExperimentResult


def run(config: BenchBridgeConfig) -> ExperimentResult:
    console = make_console()
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
    stats = {k: stats_us(v[5:]) for k, v in samples.items()}
    lines = [f"Device: **cpu** ({machine().get('cpu', '?')}), loopback TCP, {config.image_size}x{config.image_size} "
             f"front camera, {config.rounds} interleaved rounds.", "",
             "| request | median (µs) | p99 (µs) |", "|---|---|---|"]
    lines += [f"| {k} | {v['median']:.0f} | {v['p99']:.0f} |" for k, v in stats.items()]
    body = "\n".join(lines)
    console.print(body)
    if config.docs:
        update_markdown_section(config.docs, "bench_bridge", body)
    return ExperimentResult({"machine": machine(), "latency_us": stats})
