"""The tabletop sim as a robot behind the bridge: `SimBackend` (the backend hooks over a `TabletopEnv`) and
`SimRobotServer` (a `RobotServer` over it), for tests, demos, benchmarks and `real_recap` without a robot."""

from __future__ import annotations

import time

import numpy as np

from capsule_rollout.robot_side.backend import RobotBackend
from capsule_rollout.robot_side.server import RobotServer
from capsule_rollout.tabletop.scripted_expert import ScriptedExpert
from capsule_rollout.tabletop.tabletop_env import ACTION_DIM, TabletopEnv


class SimBackend(RobotBackend):
    """The tabletop sim as a robot (`apply` steps the env once).

    `realtime`: pace `apply` to `control_hz` like a robot's controller (one action per
    tick), so an operator at a keyboard has time to act; off, the sim runs as fast
    as the client sends.
    """

    def __init__(self, family: str = "pick_place", cameras: tuple[str, ...] = ("front",), image_size: int = 64,
                 realtime: bool = False):
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


class SimRobotServer(RobotServer):
    """A `RobotServer` over the tabletop sim (for tests, demos and `real_recap` without a robot)."""

    def __init__(self, family: str = "pick_place", *, cameras=("front",), image_size: int = 64,
                 realtime: bool = False, **kw) -> None:
        super().__init__(SimBackend(family, cameras=cameras, image_size=image_size, realtime=realtime), **kw)
