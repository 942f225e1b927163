"""`TeleopButtons`: a LeRobot teleoperator's buttons (its `get_teleop_events()`: a gamepad, the keyboard
teleoperators) as an operator source on the robot side; the server sends its events with each observation.

LeRobot's events are states, read at each poll; their changes become the operator's events:

    is_intervention  held down      takeover on; released: takeover off (the policy takes the next chunk)
    success          pressed        END, success
    failure, terminate_episode      END, failure (success wins when both come at once)
    rerecord_episode                no counterpart here: ignored (counted in `ignored`)
"""

from __future__ import annotations

from typing import Any

from capsule_rollout.robot_side.operator_input import Kind, OperatorEvent


def _flags(events: Any) -> dict[str, bool]:
    """LeRobot's `{TeleopEvents.X: bool}` (or plain strings) as `{"x": bool}`."""
    return {str(getattr(key, "value", key)): bool(value) for key, value in dict(events or {}).items()}


class TeleopButtons:
    """The operator events of a LeRobot teleoperator with `get_teleop_events()`, polled on the robot thread."""

    def __init__(self, teleop: Any) -> None:
        if not callable(getattr(teleop, "get_teleop_events", None)):
            raise ValueError(f"{teleop} has no buttons (no get_teleop_events): take over from the keyboard instead")
        self.teleop = teleop
        self.takeover = False
        self._ending = False  # an END button is down: one END per press
        self.ignored = 0

    def poll(self, step: int) -> list[OperatorEvent]:
        flags = _flags(self.teleop.get_teleop_events())
        out = []
        held = flags.get("is_intervention", False)
        if held != self.takeover:
            self.takeover = held
            out.append(OperatorEvent(Kind.TAKEOVER_ON if held else Kind.TAKEOVER_OFF))
        success = flags.get("success", False)
        end = success or flags.get("failure", False) or flags.get("terminate_episode", False)
        if end and not self._ending:
            out.append(OperatorEvent(Kind.END_SUCCESS if success else Kind.END_FAILURE))
        self._ending = end
        self.ignored += int(flags.get("rerecord_episode", False))
        return out

    def close(self) -> None:
        pass  # the teleoperator belongs to the backend, which disconnects it
