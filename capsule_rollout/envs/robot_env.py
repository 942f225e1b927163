"""`RobotEnv`: the rollout protocol's env side over a `RobotClient` (a real or sim robot).

A robot cannot be captured in a capsule, so it declares no buffers and
`restorable = False`: every episode starts with a physical reset (home), while
the policy's, critic's and host's state are still captured and restored. Robot
errors carry the stop reason the episode ends with (`aborted` after a lost
heartbeat, `safety` after an unsafe action).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import gymnasium as gym
import numpy as np

from capsule_rollout.envs.robot_bridge import RobotClient
from capsule_rollout.envs.rollout_env import ObservationSpec


class RobotEnv:
    restorable = False

    def __init__(self, client: RobotClient, *, max_steps: int = 80, task: str = "") -> None:
        if not client.state_dim or len(client.image_shape) != 2:
            raise ValueError("the robot server did not announce state_dim and image_shape in its welcome; "
                             "update the robot side (RobotBackend.state_dim, .image_shape)")
        self.client = client
        self.name = "env"
        self.cameras = client.cameras
        self.max_steps = max_steps
        self.action_space = gym.spaces.Box(np.asarray(client.action_low, np.float32),
                                           np.asarray(client.action_high, np.float32), dtype=np.float32)
        self.observation_spec = ObservationSpec.of(state_dim=int(client.state_dim), cameras=client.cameras,
                                                   image_size=tuple(client.image_shape))
        self.task = task or "robot"
        self.subtask_texts: tuple[str, ...] = ()
        self.subtask_index = 0
        self.steps = 0
        self.instruction = ""
        self._obs: dict[str, Any] | None = None
        self._info: dict[str, Any] = {}
        self.buffers: Mapping = {}
        self._fingerprint = MappingProxyType({"kind": "robot", "robot": client.robot})

    # -- capsule component: nothing of a robot can be captured ---------------------------
    def buffer_specs(self) -> list:
        return []

    def bind(self, buffers) -> None:
        self.buffers = buffers

    def fingerprint(self) -> Mapping[str, str]:
        return self._fingerprint

    def before_snapshot(self) -> None:
        pass

    def after_restore(self) -> None:
        pass

    # -- env interface --------------------------------------------------------------------
    def reset(self, *, seed: int | None = None):
        fields = self.client.reset(seed)
        self.instruction = fields.get("instruction", "")
        if fields.get("task") and self.task == "robot":
            self.task = str(fields["task"])
        self.subtask_texts = tuple(str(t) for t in fields.get("subtasks") or [])
        self._observe()
        return self._obs, self._info

    def _observe(self) -> None:
        obs, info = self.client.observe()
        self._obs, self._info = obs, info
        self.steps = int(info.get("step", self.steps))
        self.subtask_index = int(info.get("subtask_id", 0))
        texts = self.subtask_texts or (self.instruction,)
        info["subtask"] = texts[min(self.subtask_index, len(texts) - 1)]
        info["success"] = bool(info.get("success", False))

    def observe(self) -> dict[str, Any]:
        if self._obs is None:
            raise RuntimeError("reset the robot first")
        return self._obs

    def step(self, action: np.ndarray):
        sent = self.client.send_action(np.asarray(action, np.float32))
        self._observe()
        self._info["action_sent"] = sent  # what the robot really took (its safety layer clipped or rate-limited)
        success = self._info["success"]
        truncated = not success and self.steps >= self.max_steps
        return self._obs, (0.0 if success else -1.0), success, truncated, self._info

    def success(self, info: Mapping[str, Any]) -> bool:
        return bool(info.get("success", False))

    def estop(self) -> None:
        self.client.estop()

    def close(self) -> None:
        pass  # the client belongs to whoever opened it
