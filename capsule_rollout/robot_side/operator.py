"""Operator input that comes from the robot side of the bridge (a LeRobot teleoperator's buttons, the keys of the
robot's computer): `RobotOperator`, and `OperatorMix`, which polls several sources as one (that and the
rollout host's own keyboard or script)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from capsule_rollout.robot_side.operator_input import Kind, OperatorEvent, OperatorSource


class EventsChannel(Protocol):
    """What `RobotOperator` reads: the host's `envs.robot_client.RobotClient` is one."""

    def operator_events(self) -> list[str]:
        """The operator events that came with the robot's observations since the last call, as the server sent
        them (`kind` or `coach:TEXT`)."""


def parse_event(text: str) -> OperatorEvent | None:
    """`kind` or `coach:TEXT` as the robot server sends them; None for a kind this side does not know."""
    kind, _, rest = text.partition(":")
    try:
        return OperatorEvent(Kind(kind), rest)
    except ValueError:
        return None


class RobotOperator:
    """The robot side's operator events, as they came with the robot's observations (the host's `RobotClient`)."""

    def __init__(self, client: EventsChannel) -> None:
        self.client = client
        self.unknown: list[str] = []  # events of kinds this side does not know (a newer robot side), kept for logs

    def poll(self, step: int) -> list[OperatorEvent]:
        events = []
        for text in self.client.operator_events():
            event = parse_event(text)
            if event is None:
                self.unknown.append(text)
            else:
                events.append(event)
        return events

    def drop_pending(self) -> None:
        """Forget events not yet polled (before a new episode: what the operator did after the last one ended).
        Not `reset`: the rollout host resets its operator after the robot's reset, whose observation may already
        carry the new episode's first events."""
        self.client.operator_events()

    def close(self) -> None:
        pass  # the client belongs to whoever opened it


class OperatorMix:
    """Several operator sources polled as one, in order. Resets go to every source that has one; the capsule state
    is that of the sources that keep one, back to back (`OperatorSource`)."""

    def __init__(self, sources: Sequence[OperatorSource]) -> None:
        if not sources:
            raise ValueError("OperatorMix needs at least one source")
        self.sources = tuple(sources)
        self._stateful = [s for s in self.sources if callable(getattr(s, "capsule_state", None))]

    def poll(self, step: int) -> list[OperatorEvent]:
        return [event for source in self.sources for event in source.poll(step)]

    def reset(self) -> None:
        for source in self.sources:
            reset = getattr(source, "reset", None)
            if callable(reset):
                reset()

    def capsule_state(self) -> tuple[int, ...]:
        return tuple(v for source in self._stateful for v in source.capsule_state())

    def load_capsule_state(self, values) -> None:
        values = list(values)
        for source in self._stateful:
            n = len(source.capsule_state())
            if len(values) < n:
                raise ValueError("the capsule's operator state is shorter than these operators keep: it was taken "
                                 "with other operators")
            source.load_capsule_state(values[:n])
            values = values[n:]
        if values:
            raise ValueError("the capsule's operator state is longer than these operators keep: it was taken with "
                             "other operators")

    def close(self) -> None:
        for source in self.sources:
            source.close()
