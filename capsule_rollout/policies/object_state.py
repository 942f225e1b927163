"""The state a policy object keeps across calls, as capsule state: a history, an action queue, a chunk broker.

`ObjectState(obj)` captures it one of two ways:
- **hooks**: the object has `get_state()` and `set_state(state)`; the state (plain values, containers, numpy
  arrays, torch tensors) is written with `capsules.state_codec` and handed back to `set_state` after a restore;
- **graph** (nothing declared): the object's whole Python object graph (`capsules.graph.state.GraphState`), as
  an env's is captured: its attributes, containers, queues, generators; a torch module's weights, buffers and
  submodules and read-only numpy arrays of 64 KiB or more are taken by reference (never copied: a capsule holds
  what changes, not the weights).

The state lives in two buffers of its component: `state` (bytes, a fixed size: `capacity`) and `state_len`. The
capacity is 256 KiB, or four times what the object holds when it is built rounded up to a power of two (a
history or queue fills during an episode), or what the object's `capsule_bytes` says; a snapshot that does not
fit is refused naming the largest arrays and what to do. A restore reads and checks the state before anything is
copied (`check`, in the component's `check_restore`) and applies it after (`restore`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from capsule_rollout.capsules import BufferSpec, host_arrays, state_codec
from capsule_rollout.capsules.graph.read import GraphStateError
from capsule_rollout.capsules.graph.state import GraphState
from capsule_rollout.capsules.graph.walk import fmt
from capsule_rollout.capsules.state_codec import StateDecodeError, StateEncodeError

MIN_BYTES = 1 << 18
READONLY_BYTES = 1 << 16
HOOKS, GRAPH = "hooks", "graph"


def has_hooks(obj: Any) -> bool:
    return callable(getattr(obj, "get_state", None)) and callable(getattr(obj, "set_state", None))


class ObjectState:
    """The state of `obj` kept across calls (see the module docstring); `who` names it in messages."""

    def __init__(self, obj: Any, who: str) -> None:
        self.obj, self.who = obj, who
        self.mode = HOOKS if has_hooks(obj) else GRAPH
        self.graph = GraphState(obj, global_rngs=False, readonly_bytes=READONLY_BYTES) if self.mode == GRAPH else None
        self._prepared: tuple[bytes, Any] | None = None
        declared = getattr(obj, "capsule_bytes", None)
        if declared is not None:
            self.capacity = int(declared)
        else:
            size = MIN_BYTES
            held = len(self._encode())
            while size < 4 * held:
                size *= 2
            self.capacity = size

    def buffer_specs(self) -> list[BufferSpec]:
        return [BufferSpec("state", (self.capacity,), torch.uint8, "cpu", doc=f"{self.who}'s state ({self.mode})"),
                BufferSpec("state_len", (1,), torch.int64, "cpu", doc="bytes used in `state`")]

    def fingerprint(self) -> dict[str, str]:
        return {"state": self.mode, "state_bytes": str(self.capacity)}

    def _encode(self) -> bytes:
        try:
            if self.graph is not None:
                return self.graph.snapshot()
            return state_codec.encode(self.obj.get_state())
        except GraphStateError as exc:
            raise ValueError(f"{self.who}: {exc}") from None
        except StateEncodeError as exc:
            raise ValueError(f"{self.who}.get_state() returned what a capsule cannot hold ({exc}): return plain "
                             "values, containers, numpy arrays or torch tensors") from None

    def snapshot_into(self, buffers: Mapping[str, torch.Tensor]) -> None:
        blob = self._encode()
        if len(blob) > self.capacity:
            raise ValueError(f"{self.who}'s state is {len(blob):,} bytes, more than the {self.capacity:,} its capsule "
                             f"buffer holds{self._largest()}: give the object a larger `capsule_bytes`, make large "
                             "arrays that do not change read-only (array.flags.writeable = False) or keep them in a "
                             "torch module, or keep the state with get_state / set_state")
        raw = buffers["state"].numpy()
        raw[: len(blob)] = np.frombuffer(blob, np.uint8)
        raw[len(blob):] = 0  # a capsule's bytes are a function of the state alone
        buffers["state_len"][0] = len(blob)

    def _largest(self) -> str:
        if self.graph is None:
            return ""
        arrays = sorted(((n.obj.nbytes, n.path) for n in self.graph.nodes().values() if n.kind == "array"),
                        key=lambda x: -x[0])[:3]
        return f" (largest arrays: {', '.join(f'{fmt(p)} {b:,} B' for b, p in arrays)})" if arrays else ""

    def check(self, view: Mapping[str, torch.Tensor]) -> None:
        """Read and check a capsule's state, resolving what it refers to; nothing changes yet (ValueError)."""
        b = host_arrays(view)  # numpy views kept with the capsule: no torch call on a restore's path
        n = int(b["state_len"][0])
        if not 0 <= n <= self.capacity:
            raise ValueError(f"the capsule's {self.who} state claims {n:,} bytes of a {self.capacity:,} buffer")
        blob = b["state"][:n].tobytes()
        self._prepared = (blob, self._prepare(blob))

    def _prepare(self, blob: bytes) -> Any:
        try:
            if self.graph is not None:
                return self.graph.prepare(blob)
            return state_codec.decode(blob, self._names())
        except GraphStateError as exc:
            raise ValueError(f"{self.who}: {exc}") from None
        except StateDecodeError as exc:
            raise ValueError(f"{self.who}: the capsule's state is refused: {exc}") from None

    def _names(self) -> Any:
        """The names the hooks' state may use: those the object's graph holds."""
        if not hasattr(self, "_namespace"):
            self._namespace = GraphState(self.obj, global_rngs=False)._namespace()
        return self._namespace

    def restore_from(self, buffers: Mapping[str, torch.Tensor]) -> None:
        """Apply the state `check` read (read again when the restore came another way)."""
        n = int(buffers["state_len"][0])
        blob = buffers["state"][:n].numpy().tobytes()
        prepared, self._prepared = self._prepared, None
        value = prepared[1] if prepared is not None and prepared[0] == blob else self._prepare(blob)
        if self.graph is not None:
            self.graph.apply(value)
        else:
            self.obj.set_state(value)
