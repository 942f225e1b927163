"""What a robot integration writes for the bridge (`RobotBackend`). Two are written: any LeRobot `Robot`
(`robot_side.lerobot_backend`) and the example's tabletop sim (`tabletop.sim_robot.SimBackend`).

The server (`robot_side.server`) calls a backend from its one robot thread and enforces the safety layer
whatever the backend does; a backend only moves the hardware.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class RobotBackend:
    """What a hardware integration fills in (the server calls these from one thread at a time)."""

    action_low: np.ndarray = -np.ones(4, np.float32)
    action_high: np.ndarray = np.ones(4, np.float32)
    control_hz: float = 10.0
    name: str = "robot"
    cameras: tuple[str, ...] = ()
    state_dim: int = 8
    """Length of the `state` observation vector."""
    image_shape: tuple[int, int] = (64, 64)
    """(H, W) of every camera image."""

    task: str = "task"
    has_teleop: bool = True
    """`teleop_action` gives the operator's device action (False: takeovers are ignored, and recorded so)."""
    # Largest change of each action component between consecutive actions (one control step);
    # None: half of each component's range. The server enforces it.
    max_rate: np.ndarray | None = None

    def reset(self, seed: int | None) -> str:
        """Home the robot and set up the task; returns the instruction."""
        raise NotImplementedError

    def subtasks(self) -> list[str]:
        """The current task's subtask texts, if the robot side knows them (else [])."""
        return []

    def present_action(self) -> np.ndarray | None:
        """The action that would hold the robot where it is now, called after each reset: the server's rate limit
        starts from it, so an episode's first action cannot swing the robot. None: only the bounds limit the first
        action (a sim that homes exactly)."""
        return None

    def teleop_action(self) -> np.ndarray:
        """The operator's device action now (a leader arm); used while the operator has taken over."""
        raise NotImplementedError("this robot has no teleoperation device")

    def observe(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """(arrays: image_<camera> uint8 (H, W, 3), state float32; fields: instruction, subtask, subtask_id, step,
        success)."""
        raise NotImplementedError

    def apply(self, action: np.ndarray) -> np.ndarray | None:
        """Send one (already clipped, rate-limited, finite) action to the robot; returns the action the hardware
        really took when it clipped further (as LeRobot's `send_action` does), None when it took this one."""
        raise NotImplementedError

    def hold(self) -> None:
        """Stop moving and hold position (safe stop, heartbeat loss, disconnect)."""
        raise NotImplementedError

    def estop(self) -> None:
        """Emergency stop (cut power to the motors, engage brakes)."""
        self.hold()

    def close(self) -> None:
        """Release the hardware (called once, from the server's thread, when it stops)."""
