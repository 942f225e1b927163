"""An env's Python state found without declarations (`capsules.graph_state.GraphState` over the env, with
MuJoCo's handles): `MjModel` / `MjData` are never copied (the adapter captures them through MuJoCo), an
array lying in their memory is an alias re-linked to the target's handle (`graph_handles.Aliases`), and a
renderer's visualization structs (camera, options, scene settings) are values set in place
(`graph_structs.VisualStructs`)."""

from __future__ import annotations

from typing import Any

from capsule_rollout.capsules.graph_read import GraphStateError, split  # noqa: F401 - part of this module's API
from capsule_rollout.capsules.graph_state import GraphState as _GraphState
from capsule_rollout.capsules.graph_state import differing_paths  # noqa: F401 - part of this module's API
from capsule_rollout.capsules.graph_walk import fmt, walk  # noqa: F401 - part of this module's API
from capsule_rollout.envs.graph_handles import HANDLE_TYPES, Aliases
from capsule_rollout.envs.graph_structs import VisualStructs


class GraphState(_GraphState):
    """`capsules.graph_state.GraphState` of an env: its MuJoCo handles and the arrays that alias them, its
    visualization structs."""

    def __init__(self, root: Any, *, exclude: tuple[str, ...] = (), global_rngs: bool = True) -> None:
        super().__init__(root, exclude=exclude, global_rngs=global_rngs, handles=HANDLE_TYPES, aliases=Aliases(),
                         structs=VisualStructs())


def env_walk(root: Any) -> dict:
    """`graph_walk.walk` of an env (its MuJoCo handles as handles)."""
    return walk(root, handles=HANDLE_TYPES, structs=VisualStructs.types)
