"""The robot bridge over TCP, in one import: protocol (`envs.robot_protocol`), backend
(`envs.robot_backend`: what a hardware integration writes), server (`envs.robot_server`: socket,
protocol, safety layer) and client (`envs.robot_client`: the rollout side).

The safety rules the server enforces are in `envs.robot_server`'s docstring. The tabletop sim as a robot
(`SimBackend`, `SimRobotServer`) is the example's: `tabletop.sim_robot`.
"""

from capsule_rollout.envs.robot_backend import RobotBackend
from capsule_rollout.envs.robot_client import RobotClient, RobotDisconnected, RobotError
from capsule_rollout.envs.robot_server import LOOPBACK, RobotServer

__all__ = ["LOOPBACK", "RobotBackend", "RobotClient", "RobotDisconnected", "RobotError", "RobotServer"]
