"""The robot bridge over TCP, in one import: protocol (`robot_side.protocol`), backend
(`robot_side.backend`: what a hardware integration writes), server (`robot_side.server`: socket,
protocol, safety layer) and client (`envs.robot_client`: the rollout side).

The safety rules the server enforces are in `robot_side.server`'s docstring. The tabletop sim as a robot
(`SimBackend`, `SimRobotServer`) is the example's: `tabletop.sim_robot`.
"""

from capsule_rollout.envs.robot_client import RobotClient, RobotDisconnected, RobotError
from capsule_rollout.robot_side.backend import RobotBackend
from capsule_rollout.robot_side.server import LOOPBACK, RobotServer

__all__ = ["LOOPBACK", "RobotBackend", "RobotClient", "RobotDisconnected", "RobotError", "RobotServer"]
