"""What the capsule adapter (`envs.mujoco_capsule`) captures and where it finds it: the per-suite
declarations (`CaptureSpec`, `Attr`, `Camera`), the wrappers it knows, the search for every numpy
generator reachable from an env, and MjData's model-sized buffer. `envs.hidden_state_scan` uses the
same search to report what a suite would need to declare."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import mujoco
import numpy as np

OBSERVATION_KEY = "observation"
"""The suite's own observation, flattened to float64, next to `state` (float32) in `observe()`."""

# Attributes every gymnasium wrapper has; any other attribute of an unknown wrapper is state.
WRAPPER_PLUMBING = frozenset({
    "env", "_action_space", "_observation_space", "_metadata", "_reward_range", "_cached_spec",
    "_saved_kwargs", "_max_episode_steps", "_disable_render_order_enforcing",
})
KNOWN_WRAPPERS: dict[str, tuple[str, ...]] = {
    "TimeLimit": ("_elapsed_steps",),
    "OrderEnforcing": ("_has_reset",),
}
"""Wrapper class name -> its counters (captured); a wrapper with no state of its own needs no entry."""
WRAPPER_COUNTER_TYPES = {"_elapsed_steps": "int", "_has_reset": "bool"}


class MujocoCapsuleError(ValueError):
    """The env cannot be captured as declared; the message says what to declare or remove."""


@dataclass(frozen=True)
class Camera:
    """One camera of the framework's renderer: a model camera by name, or a fixed free camera."""

    name: str
    model_camera: str | None = None
    """A camera of the MJCF model (fixed or tracking: its pose is part of the captured MjData)."""
    lookat: tuple[float, float, float] = (0.0, 0.0, 0.0)
    distance: float = 2.0
    azimuth: float = 90.0
    elevation: float = -30.0


@dataclass(frozen=True)
class Attr:
    """A Python attribute captured by value: `path` from the unwrapped env (dots reach nested objects).

    `kind`: "array" (a numpy array of `shape`, `dtype`), "int", "float", "bool" (scalars), or "list" /
    "set" of items from `universe` (kept as indices; a list in its order, a set in the universe's order, as
    its iteration order depends on the process's string hashes). None is allowed for every kind.
    """

    path: str
    kind: str = "array"
    shape: tuple[int, ...] = ()
    dtype: str = "float64"
    universe: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ("array", "int", "float", "bool", "list", "set"):
            raise ValueError(f"attribute {self.path!r}: kind must be array, int, float, bool, list or set, "
                             f"got {self.kind!r}")
        if self.kind in ("list", "set") and not self.universe:
            raise ValueError(f"attribute {self.path!r}: a {self.kind} needs its `universe` of possible items")

    @property
    def slots(self) -> int:
        """float64 slots in the `attrs` buffer (arrays as float64 bytes, 8 bytes a slot)."""
        if self.kind == "array":
            return -(-int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize // 8)
        if self.kind in ("list", "set"):
            return len(self.universe)
        return 1


@dataclass(frozen=True)
class CaptureSpec:
    """Everything a suite declares so the adapter can capture and drive one of its envs."""

    task: str
    """The task id (the registered name, e.g. `gymnasium:Pusher-v5`)."""
    attributes: tuple[Attr, ...] = ()
    model_fields: tuple[str, ...] = ()
    """`MjModel` arrays the suite changes at run time (e.g. `site_pos` for a goal moved per task)."""
    cameras: Mapping[str, Camera] = field(default_factory=dict)
    """Cameras the framework may render, by name."""
    max_steps: int = 1000
    instruction: str = ""
    state: Callable[[Any], np.ndarray] | None = None
    """The suite's observation -> state vector (None: the observation flattened)."""
    success: Callable[[Mapping[str, Any]], bool] | None = None
    """Whether a step's info says the task is done (None: the suite has no success)."""
    terminate_on_success: bool = False
    """End the episode (terminated) on success, for suites that never terminate by themselves."""
    seed: Callable[[gym.Env, int], None] | None = None
    """Called before `reset(seed=...)` for suites whose reset ignores its seed: seeds the suite its own way."""
    wrapper_state: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Counters of wrappers beyond `KNOWN_WRAPPERS` (class name -> attribute names, captured as ints)."""
    observation_keys: tuple[str, ...] | None = None
    """Keys of a dict observation kept in the flattened `observation` (None: all). A suite whose observation
    carries a large image the framework renders itself anyway (gym-aloha's 480x640 `pixels`) keeps it out."""
    graph: bool = True
    """Capture the env's whole Python object graph and every model array that is not an asset, with nothing
    declared (`envs.object_graph`). False: only what is declared above (the fast path of the built-in
    suites, whose declarations `verify_capsule` checks)."""
    exclude: tuple[str, ...] = ()
    """Attribute names the graph capture leaves alone (a cache that is not state, an object that cannot be
    saved)."""
    python_bytes: int | None = None
    """Size of the capsule buffer that holds the graph's Python state (None: 1 MiB, or twice what the env
    holds at construction when that is more, rounded up to a power of two)."""


def flatten(obs: Any) -> np.ndarray:
    """A (possibly nested dict) observation as one float64 vector, in the dict's own key order."""
    if isinstance(obs, Mapping):
        parts = [flatten(v) for v in obs.values()]
        return np.concatenate(parts) if parts else np.zeros(0)
    return np.asarray(obs, dtype=np.float64).reshape(-1)


def layers_of(env: gym.Env) -> list[gym.Env]:
    """Every wrapper from the outside in, then the unwrapped env."""
    out, e = [], env
    while isinstance(e, gym.Wrapper):
        out.append(e)
        e = e.env
    out.append(e)
    return out


def resolve_attr(root: object, path: str) -> tuple[object, str]:
    *parents, name = path.split(".")
    owner = root
    for p in parents:
        owner = getattr(owner, p)
    if not hasattr(owner, name):
        raise MujocoCapsuleError(f"declared attribute {path!r} does not exist on {type(root).__name__}")
    return owner, name


def find_generators(layers: list[gym.Env]) -> list[tuple[str, object, str]]:
    """(path, owner, attribute) of every numpy generator slot reachable from the env: each layer's and
    nested env's `_np_random` (set or not), their spaces', and any attribute holding a Generator."""
    found: list[tuple[str, object, str]] = []
    seen: set[tuple[int, str]] = set()

    def add(path: str, owner: object, name: str) -> None:
        if (id(owner), name) not in seen:
            seen.add((id(owner), name))
            found.append((path, owner, name))

    def space(path: str, sp: gym.spaces.Space) -> None:
        add(f"{path}._np_random", sp, "_np_random")
        subs = sp.spaces.items() if isinstance(sp, gym.spaces.Dict) else enumerate(getattr(sp, "spaces", ()) or ())
        for key, sub in subs:
            if isinstance(sub, gym.spaces.Space):
                space(f"{path}.{key}", sub)

    def visit(path: str, obj: object, depth: int) -> None:
        if isinstance(obj, gym.Env) and "_np_random" in vars(obj) or isinstance(obj, gym.Env) and not isinstance(
                obj, gym.Wrapper):
            add(f"{path}._np_random", obj, "_np_random")
        for name, value in sorted(vars(obj).items()):
            if isinstance(value, np.random.Generator):
                add(f"{path}.{name}", obj, name)
            elif isinstance(value, gym.spaces.Space):
                space(f"{path}.{name}", value)
            elif isinstance(value, gym.Env) and not isinstance(value, gym.Wrapper) and depth < 4:
                visit(f"{path}.{name}", value, depth + 1)

    for i, layer in enumerate(layers):
        name = type(layer).__name__
        if isinstance(layer, gym.Wrapper):
            for attr in ("_action_space", "_observation_space"):
                if isinstance(vars(layer).get(attr), gym.spaces.Space):
                    space(f"{i}:{name}.{attr}", vars(layer)[attr])
            if "_np_random" in vars(layer):
                add(f"{i}:{name}._np_random", layer, "_np_random")
        else:
            visit(f"{i}:{name}", layer, 0)
    return found


def buffer_bytes(start: int, size: int) -> np.ndarray:
    """A copy of `size` bytes at address `start` (MjData's buffer, from `mjdata_buffer`): what it held, to compare."""
    out = np.empty(size, np.uint8)
    ctypes.memmove(out.ctypes.data, start, size)
    return out


def mjdata_buffer(data: mujoco.MjData) -> tuple[int, int]:
    """Address and size of MjData's model-sized buffer (it starts with qpos)."""
    start, size = data.qpos.ctypes.data, int(data.nbuffer)
    for name in ("qvel", "qacc_warmstart", "ctrl", "xpos", "geom_xpos", "cam_xpos"):
        arr = getattr(data, name)
        if arr.nbytes and not start <= arr.ctypes.data < start + size:
            raise MujocoCapsuleError(f"MjData.{name} lies outside the buffer that starts at qpos; this MuJoCo "
                                     f"({mujoco.__version__}) lays MjData out differently")
    return start, size


def find_physics(env: gym.Env, path: tuple | None = None) -> tuple[mujoco.MjModel, mujoco.MjData, tuple | None]:
    """The env's MjModel and MjData, and the object-graph path of the MjData (None: `unwrapped.data`):
    `unwrapped.model` / `.data`, else the MjData at `path` (where it was found before: cheap), else the one
    MjData the env's object graph reaches (a dm_control `Physics`, robosuite's simulator) and its model."""
    from capsule_rollout.envs.object_graph import fmt, resolve, walk

    unwrapped = env.unwrapped
    model, data = getattr(unwrapped, "model", None), getattr(unwrapped, "data", None)
    if isinstance(model, mujoco.MjModel) and isinstance(data, mujoco.MjData):
        return model, data, None
    if path is not None:
        try:
            data = resolve(env, path)
        except (KeyError, IndexError, AttributeError, TypeError):
            data = None
        if isinstance(data, mujoco.MjData):
            return data.model, data, path
    found = [n for n in walk(env).values() if isinstance(n.obj, mujoco.MjData) and n.path is not None]
    if len(found) == 1:
        return found[0].obj.model, found[0].obj, found[0].path
    if not found:
        raise MujocoCapsuleError(f"{type(unwrapped).__name__} reaches no MjData (neither `model` / `data` nor "
                                 "anything inside it): the adapter captures MuJoCo envs only")
    raise MujocoCapsuleError(f"{type(unwrapped).__name__} reaches {len(found)} MjData objects "
                             f"({', '.join(fmt(n.path) for n in found[:4])}): the adapter captures one simulation")
