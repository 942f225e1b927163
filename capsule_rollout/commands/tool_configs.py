"""Configs of the project's own tools: `sim_robot_server` (the tabletop sim as a robot over the bridge) and `scan_env`
(the hidden-state scan of an env)."""

from __future__ import annotations

from dataclasses import dataclass

from capsule_rollout.commands.registry import command
from capsule_rollout.learning.options import FAMILIES


@command("sim_robot_server", "Serve the tabletop sim as a robot over the bridge protocol (for real_recap without hardware).")
@dataclass(frozen=True)
class SimRobotServerConfig:
    port: int = 5555
    """Port to listen on."""
    host: str = "127.0.0.1"
    """Address to bind (anything but loopback needs --token)."""
    token: str = ""
    """Shared token clients must present."""
    family: FAMILIES = "pick_place"
    """Task family the sim robot runs."""
    image_size: int = 64
    """Camera image size."""
    seconds: float = 0.0
    """Serve this long, then stop (0: until Ctrl-C)."""
    realtime: bool = True
    """Step at the robot's control rate (10 Hz) like real hardware, so operator keys have time to act."""


@command("scan_env", "hidden-state scan of a gymnasium MuJoCo env: candidate capture declarations")
@dataclass(frozen=True)
class ScanEnvConfig:
    env: str = "gymnasium:Pusher-v5"
    """The env scanned: `suite:task` (its declarations are marked in the report) or `package.module:factory`
    returning a gymnasium MuJoCo env."""
    steps: int = 30
    """Random-action steps between the resets."""

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"--steps must be >= 1, got {self.steps}")
