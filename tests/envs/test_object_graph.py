"""The graph capture's encoding (`envs.graph_codec`): reading a capsule's Python state never runs code it names."""

from __future__ import annotations

import io
import os
import pickle

import pytest

from capsule_rollout.envs.object_graph import GraphState, GraphStateError
from tests.envs.broken_envs import make_counter


class _Evil:
    def __reduce__(self):
        return os.system, ("echo pwned > /dev/null",)


def _with_body(blob: bytes, body: bytes) -> bytes:
    parts, at = [], 0
    for _ in range(3):
        n = int.from_bytes(blob[at:at + 8], "little")
        parts.append(blob[at + 8:at + 8 + n])
        at += 8 + n
    parts[2] = body
    return b"".join(len(p).to_bytes(8, "little") + p for p in parts)


def test_a_state_naming_a_function_is_refused_before_anything_runs():
    env = make_counter()
    env.reset(seed=0)
    graph = GraphState(env)
    blob = graph.snapshot()
    buf = io.BytesIO()
    pickle.Pickler(buf, protocol=5).dump(([], _Evil()))
    with pytest.raises(GraphStateError, match=r"names posix:system, which is neither"):
        graph.restore(_with_body(blob, buf.getvalue()))


def test_a_state_naming_a_class_the_env_does_not_use_is_refused():
    env = make_counter()
    env.reset(seed=0)
    graph = GraphState(env)
    buf = io.BytesIO()
    pickle.Pickler(buf, protocol=5).dump(([], io.StringIO("x")))
    with pytest.raises(GraphStateError, match=r"_io:StringIO"):
        graph.restore(_with_body(graph.snapshot(), buf.getvalue()))
