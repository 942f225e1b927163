"""sim_robot_server: the tabletop sim as a robot behind the real bridge protocol (for real_recap without a robot)."""

from __future__ import annotations

import time

from capsule_rollout.cli.console import make_console
from capsule_rollout.commands.configs import SimRobotServerConfig
from capsule_rollout.commands.result import ExperimentResult
from capsule_rollout.tabletop.sim_robot import SimRobotServer


def run(config: SimRobotServerConfig) -> ExperimentResult:
    console = make_console()
    server = SimRobotServer(config.family, image_size=config.image_size, host=config.host, port=config.port,
                            token=config.token, realtime=config.realtime)
    with server:
        host, port = server.address
        console.print(f"sim robot ({config.family}) listening on {host}:{port}; "
                      f"try: python -m capsule_rollout real_recap --robot.port {port}")
        deadline = time.monotonic() + config.seconds if config.seconds > 0 else None
        try:
            while deadline is None or time.monotonic() < deadline:
                time.sleep(0.2)
        except KeyboardInterrupt:
            pass
        status = server.status()  # admission limits and counts (waiting, timed out, evicted, failed tokens)
    return ExperimentResult({"address": [host, port], "events": server.events, "status": status})
