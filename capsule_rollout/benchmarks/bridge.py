"""bench_bridge's measurement (what it measures: `experiments/bench_bridge.py`): round-trip latency of the robot
bridge on loopback against the SimRobotServer."""

from __future__ import annotations

import time

import numpy as np

from capsule_rollout.benchmarks.support import stats_us
from capsule_rollout.commands.configs import BenchBridgeConfig
from capsule_rollout.envs.robot_bridge import RobotClient
from capsule_rollout.envs.robot_protocol import Message
from capsule_rollout.tabletop.sim_robot import SimRobotServer


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
