"""A LeRobot plugin for tests: `scripted_leader`, a `Teleoperator` with an SO-101 leader's features whose arm
positions and buttons follow a script (`--teleop.discover_packages_path=tests.robot_side.lerobot_teleop`)."""

from tests.robot_side.lerobot_teleop.config_scripted_leader import ScriptedLeaderConfig
from tests.robot_side.lerobot_teleop.scripted_leader import ScriptedLeader

__all__ = ["ScriptedLeader", "ScriptedLeaderConfig"]
