"""What a robot integration writes for the bridge (`RobotBackend`), and the tabletop sim as one (`SimBackend`).

The server (`envs.robot_server`) calls a backend from its one robot thread and enforces the safety layer
whatever the backend does; a backend only moves the hardware.
"""

from __future__ import annotations

import time
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
    # Largest change of each action component between consecutive actions (one control step);
    # None: half of each component's range. The server enforces it.
    max_rate: np.ndarray | None = None

    def reset(self, seed: int | None) -> str:
        """Home the robot and set up the task; returns the instruction."""
        raise NotImplementedError

    def subtasks(self) -> list[str]:
        """The current task's subtask texts, if the robot side knows them (else [])."""
        return []

    def teleop_action(self) -> np.ndarray:
        """The operator's device action now (a leader arm); used while the operator has taken over."""
        raise NotImplementedError("this robot has no teleoperation device")

    def observe(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """(arrays: image_<camera> uint8 (H, W, 3), state float32; fields: instruction, subtask, subtask_id, step,
        success)."""
        raise NotImplementedError

    def apply(self, action: np.ndarray) -> None:
        """Send one (already clipped, rate-limited, finite) action to the robot."""
        raise NotImplementedError

    def hold(self) -> None:
        """Stop moving and hold position (safe stop, heartbeat loss, disconnect)."""
        raise NotImplementedError

    def estop(self) -> None:
        """Emergency stop (cut power to the motors, engage brakes)."""
        self.hold()

    def close(self) -> None:
        """Release the hardware (called once, from the server's thread, when it stops)."""


class SimBackend(RobotBackend):
    """The tabletop sim as a robot (`apply` steps the env once).

    `realtime`: pace `apply` to `control_hz` like a robot's controller (one action per
    tick), so an operator at a keyboard has time to act; off, the sim runs as fast
    as the client sends.
    """

    def __init__(self, family: str = "pick_place", cameras: tuple[str, ...] = ("front",), image_size: int = 64,
                 realtime: bool = False):
        from capsule_rollout.envs.tabletop_env import ACTION_DIM, TabletopEnv

        self.env = TabletopEnv(family, cameras=cameras, image_size=image_size)
        self.cameras = tuple(cameras)
        self.state_dim = self.env.observation_spec.state_dim
        self.image_shape = (image_size, image_size)
        self.name = f"sim-{family}"
        self.task = family
        self._expert = None
        self.action_low = -np.ones(ACTION_DIM, np.float32)
        self.action_high = np.ones(ACTION_DIM, np.float32)
        # the sim env itself limits no rate, so neither does its robot (a full swing per step): a policy
        # then plays the same episode here as in sim. A real backend sets its own; `RobotServer(max_rate=)`
        # overrides either.
        self.max_rate = self.action_high - self.action_low
        self.control_hz = 10.0
        self.realtime = realtime
        self._next_tick = 0.0
        self.held = False
        self._obs: dict | None = None
        self._info: dict = {}

    def reset(self, seed: int | None) -> str:
        from capsule_rollout.envs.scripted_expert import ScriptedExpert

        self._obs, self._info = self.env.reset(seed=seed)
        self.held, self._next_tick = False, 0.0
        self._expert = ScriptedExpert(self.env)  # the sim's teleoperator
        return self.env.instruction

    def subtasks(self) -> list[str]:
        return [s.text for s in self.env.subtasks]

    def teleop_action(self) -> np.ndarray:
        if self._expert is None:
            raise RuntimeError("reset first")
        return self._expert.act()

    def observe(self):
        if self._obs is None:
            raise RuntimeError("reset first")
        arrays = {k: v for k, v in self._obs.items() if k.startswith("image_")}
        arrays["state"] = self._obs["state"]
        fields = {"instruction": self.env.instruction, "subtask": self._info.get("subtask", ""),
                  "subtask_id": int(self._info.get("subtask_id", 0)), "step": int(self.env.steps),
                  "success": bool(self._info.get("success", False))}
        return arrays, fields

    def apply(self, action: np.ndarray) -> None:
        if self.realtime:
            now = time.monotonic()
            if now < self._next_tick:
                time.sleep(self._next_tick - now)
            self._next_tick = max(now, self._next_tick) + 1.0 / self.control_hz
        self.held = False
        self._obs, _, _, _, self._info = self.env.step(action)

    def hold(self) -> None:
        self.held = True

    def close(self) -> None:
        self.env.close()
