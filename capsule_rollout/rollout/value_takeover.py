"""`ValueTakeover`: a simulated operator who takes over when the critic's value drops.

Used by the sim RECAP loop in place of a human watching the robot: when the value
of the current chunk is below `threshold`, the operator takes over for `steps`
control steps (the teleop source, e.g. the scripted expert, acts and the steps are
flagged as interventions), then hands back to the policy. At most `max_per_episode`
takeovers per episode. Its counters go into the host's capsules (`capsule_state`), so a
branch from a chunk start after a takeover meets the operator as the episode did.
"""

from __future__ import annotations

import math

from capsule_rollout.robot_side.operator_input import Kind, OperatorEvent


class ValueTakeover:
    def __init__(self, threshold: float, steps: int = 10, max_per_episode: int = 2) -> None:
        if steps < 1 or max_per_episode < 0:
            raise ValueError("steps must be >= 1 and max_per_episode >= 0")
        self.threshold, self.steps, self.max_per_episode = threshold, steps, max_per_episode
        self.host = None
        self._until: int | None = None
        self._count = 0
        self._last_step = -1

    def reset(self) -> None:
        """A new episode: no takeover under way, none made."""
        self._until, self._count, self._last_step = None, 0, -1

    def capsule_state(self) -> tuple[int, int, int]:
        """(end step of the takeover under way, -1: none; takeovers made; the last step polled)."""
        return (-1 if self._until is None else self._until, self._count, self._last_step)

    def load_capsule_state(self, values) -> None:
        if len(values) != 3:
            raise ValueError(f"a ValueTakeover's capsule state is 3 integers, got {len(values)}: the capsule was "
                             "taken with another operator")
        until, self._count, self._last_step = (int(v) for v in values)
        self._until = None if until < 0 else until

    def bind(self, host) -> ValueTakeover:
        self.host = host
        return self

    def poll(self, step: int) -> list[OperatorEvent]:
        if self.host is None:
            raise RuntimeError("ValueTakeover.bind(host) first")
        if step < self._last_step:  # a new episode began
            self._until, self._count = None, 0
        self._last_step = step
        if self._until is not None:
            if step >= self._until:
                self._until = None
                return [OperatorEvent(Kind.TAKEOVER_OFF)]
            return []
        value = float(self.host.state.buffers["value"])
        if self._count < self.max_per_episode and not math.isnan(value) and value < self.threshold and step > 0:
            self._until, self._count = step + self.steps, self._count + 1
            return [OperatorEvent(Kind.TAKEOVER_ON)]
        return []

    def close(self) -> None:
        pass
