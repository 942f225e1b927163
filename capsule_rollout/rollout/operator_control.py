"""`OperatorControl`: what an operator does to a running episode, applied at each control step.

Polls an `OperatorSource` (keyboard, script, a simulated operator) and applies its
events: END (success or failure), coaching (a new subtask through the hand-off),
takeover on/off (the teleop source acts while on; without one the takeover is ignored
and that is recorded), e-stop (the env's `estop`, the episode ends with `safety`). Every
event is kept as a `step:kind[:text]` line for the episode's `operator_events`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from capsule_rollout.robot_side.operator_input import OperatorSource
from capsule_rollout.rollout.handoff import SubtaskChannel


class OperatorControl:
    def __init__(self, operator: OperatorSource | None, teleop: Callable[[], np.ndarray] | None,
                 channel: SubtaskChannel, request_end: Callable[[bool], None]) -> None:
        self.operator, self.teleop = operator, teleop
        self.channel, self.request_end = channel, request_end
        self.takeover = False
        self.events: list[str] = []

    def start_episode(self) -> None:
        self.takeover, self.events = False, []
        begin = getattr(self.operator, "begin_episode", None)
        if callable(begin):  # e.g. the keyboard starts reading keys only now
            begin()

    def apply(self, step: int, env) -> bool:
        """Apply what the operator did since the last step; True when the robot must stop (e-stop)."""
        if self.operator is None:
            return False
        for event in self.operator.poll(step):
            kind = event.kind.value
            self.events.append(f"{step}:{kind}:{event.text}" if event.text else f"{step}:{kind}")
            if kind in ("end_success", "end_failure"):
                self.request_end(kind == "end_success")
            elif kind == "coach":
                self.channel.coach(event.text)
            elif kind in ("takeover_on", "takeover_off"):
                if self.teleop is None:
                    self.events.append(f"{step}:takeover ignored (no teleop source)")
                else:
                    self.takeover = kind == "takeover_on"
            elif kind == "estop":
                estop = getattr(env, "estop", None)
                if callable(estop):
                    estop()
                return True
        return False
