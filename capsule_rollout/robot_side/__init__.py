"""The robot side of the bridge: what runs on the robot's computer, with numpy alone (and LeRobot for a LeRobot
robot), no torch, Ray or MuJoCo (`pip install packaging/robot`; tests/test_layers.py keeps its imports so).

`RobotServer` (socket, protocol, safety layer, watchdog) over a `RobotBackend`: `LeRobotBackend` for any LeRobot
`Robot`, with a LeRobot `Teleoperator` for takeovers and its buttons as operator input (`TeleopButtons`), or your
own. The command: `python -m capsule_rollout.robot_side.serve` (`capsule-rollout-robot` where installed).
Importing this package imports no LeRobot.
"""

from capsule_rollout.robot_side.backend import RobotBackend
from capsule_rollout.robot_side.lerobot_backend import LeRobotBackend, LeRobotLimits, calibrated_ranges
from capsule_rollout.robot_side.server import RobotServer
from capsule_rollout.robot_side.teleop_buttons import TeleopButtons

__all__ = ["LeRobotBackend", "LeRobotLimits", "RobotBackend", "RobotServer", "TeleopButtons", "calibrated_ranges"]
