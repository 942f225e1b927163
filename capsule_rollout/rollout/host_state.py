"""`HostState`: the rollout host's own committed state, as capsule buffers with names.

The action queue of the current chunk, where in it the host is, the critic's value of
the chunk, the low-value streak, the chunk count, what the planner last published, and
a copy of the hand-off block at the boundary, the step the operator was last polled at and
the operator's own state (`robot_side.operator_input.OperatorSource`). Every field is a buffer of its own (a
named counter, not an index into one array); numpy views of them are what the control
loop reads and writes each step (the same memory, cheap to index).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

import numpy as np
import torch

from capsule_rollout.capsules import BufferComponent, BufferSpec
from capsule_rollout.rollout.handoff import NBYTES, SubtaskChannel

LAYOUT = "3"
"""Version of this layout in the host's fingerprint: a capsule of another layout is refused by name."""
OPERATOR_SLOTS = 8
"""Integers of operator state a capsule holds."""


class HostState(BufferComponent):
    def __init__(self, chunk_length: int, action_dim: int, before_snapshot: Callable[[], None],
                 after_restore: Callable[[], None]) -> None:
        super().__init__()
        self.name = "host"
        self.chunk_length, self.action_dim = chunk_length, action_dim
        self._before, self._after = before_snapshot, after_restore
        self._fingerprint = MappingProxyType({
            "kind": "rollout_host", "layout": LAYOUT, "horizon": str(chunk_length), "action_dim": str(action_dim),
            "subtask_bytes": str(NBYTES)})

    def buffer_specs(self) -> list[BufferSpec]:
        counter = lambda name, doc: BufferSpec(name, (), torch.int64, doc=doc)  # noqa: E731
        return [
            BufferSpec("queue", (self.chunk_length, self.action_dim), torch.float32,
                       doc="actions of the current chunk"),
            counter("queue_pos", "index of the next queued action to execute"),
            counter("queue_len", "actions of the chunk to execute (n_exec; 0: ask for a new chunk)"),
            counter("low_value_chunks", "consecutive chunks valued below the threshold"),
            counter("chunks", "chunks asked for in the episode"),
            counter("planner_subtask", "subtask index the planner last published (-1: none)"),
            BufferSpec("value", (), torch.float32, doc="critic value of the current chunk (NaN: none)"),
            BufferSpec("subtask", (NBYTES,), torch.uint8, doc="the hand-off channel's block at the boundary"),
            counter("operator_polled", "control step the operator was last polled at in the episode (-1: none)"),
            counter("operator_len", "integers of operator state held (0: none)"),
            BufferSpec("operator", (OPERATOR_SLOTS,), torch.int64, doc="the operator's `capsule_state()`"),
        ]

    def bind(self, buffers: Mapping[str, torch.Tensor]) -> None:
        super().bind(buffers)
        b = self.buffers
        self.queue: np.ndarray = b["queue"].numpy()
        self.pos, self.length = b["queue_pos"].numpy(), b["queue_len"].numpy()
        self.low, self.chunks = b["low_value_chunks"].numpy(), b["chunks"].numpy()
        self.published, self.value = b["planner_subtask"].numpy(), b["value"].numpy()
        self.polled, self.operator_len = b["operator_polled"].numpy(), b["operator_len"].numpy()
        self.operator: np.ndarray = b["operator"].numpy()

    def clear(self) -> None:
        """The state of a new episode: empty queue, counters at zero, no value, no operator poll."""
        self.queue[:] = 0.0
        for counter in (self.pos, self.length, self.low, self.chunks, self.published, self.operator_len):
            counter[...] = 0
        self.operator[:] = 0
        self.polled[...] = -1
        self.value[...] = np.nan

    def save_subtask(self, channel: SubtaskChannel, planner) -> None:
        """Keep the hand-off's subtask block and what the planner last published."""
        block = self.buffers["subtask"]
        block.copy_(channel.tensor)
        # the version counter is this process's publish count, not state: keep "published or not"
        seq = block[:8].view(torch.int64)
        seq.fill_(2 if int(seq) > 0 else 0)
        published = getattr(planner, "published", None)
        self.published[...] = -1 if published is None else published

    def load_subtask(self, channel: SubtaskChannel, planner) -> tuple[int, int]:
        """Republish the kept subtask on `channel` and give `planner` back what it had published; returns (the
        channel's version now, the subtask index)."""
        block = SubtaskChannel()
        block.tensor.copy_(self.buffers["subtask"])
        sub = block.read()
        if sub.version:
            channel.publish(sub.text, sub.index, source=2 if sub.source == "coach" else 1)
        if hasattr(planner, "published"):  # what the planner last published, as at the boundary
            published = int(self.published)
            planner.published = None if published < 0 else published
        return channel.version(), max(sub.index, 0) if sub.version else 0

    def save_operator(self, operator) -> None:
        """Keep `operator`'s `capsule_state()` (nothing for a source without one)."""
        get = getattr(operator, "capsule_state", None)
        values = tuple(get()) if callable(get) else ()
        if len(values) > OPERATOR_SLOTS:
            raise ValueError(f"{type(operator).__name__}.capsule_state() gave {len(values)} integers; a capsule holds "
                             f"{OPERATOR_SLOTS}")
        self.operator[:] = 0
        self.operator[: len(values)] = values
        self.operator_len[...] = len(values)

    def load_operator(self, operator) -> None:
        """Give `operator` the state kept (`load_capsule_state`); one that can take it but the capsule kept none
        (taken with no such operator) starts afresh (`reset`)."""
        load = getattr(operator, "load_capsule_state", None)
        if not callable(load):
            return
        n = int(self.operator_len)
        if n:
            load(tuple(int(v) for v in self.operator[:n]))
        elif callable(reset := getattr(operator, "reset", None)):
            reset()

    def before_snapshot(self) -> None:
        self._before()

    def after_restore(self) -> None:
        self._after()

    def fingerprint(self) -> Mapping[str, str]:
        return self._fingerprint  # cached: the arena re-merges fingerprints only when a mapping object changes
