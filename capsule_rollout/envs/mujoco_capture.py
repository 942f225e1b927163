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

from capsule_rollout.capsules import rng_state
from capsule_rollout.capsules.graph.walk import fmt, resolve
from capsule_rollout.envs.object_graph import env_walk as walk
from capsule_rollout.envs.object_graph import handle_fields

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


PHYSICS_FIELDS = ("qpos", "qvel", "act", "ctrl", "qacc_warmstart", "mocap_pos", "mocap_quat", "qfrc_applied",
                  "xfrc_applied")
"""MjData arrays whose float64 values a restore checks are finite (a capsule with NaN / inf there is refused)."""


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


# -- what the adapter copies, and how -------------------------------------------------------------

def pcg64_addresses(bg) -> tuple[int, int]:
    """`capsules.rng_state.pcg64_addresses`, its error as the adapter's."""
    try:
        return rng_state.pcg64_addresses(bg)
    except rng_state.PCG64LayoutError as exc:
        raise MujocoCapsuleError(f"{exc}; generators cannot be captured here") from None


ASSET_PREFIXES = ("mesh_", "tex_", "hfield_", "skin_", "flex", "names", "paths", "text_", "plugin", "oct_",
                  "numeric_", "tuple_", "key_")
"""MjModel arrays that are not captured by value with graph capture: assets fixed by the model's files
(meshes, textures, heightfields, skins, flexes, names, keyframes, custom data; the meshes' BVH nodes); the
fingerprint holds them."""


def model_value_runs(model: mujoco.MjModel, gap: int = 256) -> list[tuple[int, int]]:
    """(address, bytes) runs of the model's memory covering every array that is not an asset; arrays less
    than `gap` bytes apart share a run (the bytes between them are padding or small index arrays)."""
    runs: list[list[int]] = []
    # the bodies' BVH nodes come first in bvh_*: a body's bounding box changes with its geoms' sizes (robosuite
    # draws a cube's size at each build); the meshes' nodes after them are assets
    body_nodes = int(np.sum(model.body_bvhnum))
    if body_nodes and int(np.max(model.body_bvhadr + model.body_bvhnum)) != body_nodes:
        body_nodes = int(model.nbvh)  # laid out otherwise: all of it by value
    for start, end, name in handle_fields(model):
        if name.startswith("bvh_"):
            end = start + body_nodes * getattr(model, name).strides[0]
            if end == start:
                continue
        elif name.startswith(ASSET_PREFIXES):
            continue
        if runs and start - runs[-1][1] <= gap:
            runs[-1][1] = max(runs[-1][1], end)
        else:
            runs.append([start, end])
    return [(start, end - start) for start, end in runs]


def integer_bytes(h: Any, within: list[tuple[int, int]]) -> list[tuple[int, int, int, str]]:
    """Where `h`'s (an MjModel's or MjData's) arrays that are not floating point (indices, addresses, ids, types,
    flags: what MuJoCo reads as positions in its own arrays, or to pick a routine) lie inside `within`, a list of
    (address, bytes) runs read one after another: (offset into those runs' bytes, address, bytes, field)."""
    out = []
    for start, end, name in handle_fields(h):
        try:
            kind = getattr(h, name).dtype.kind
        except AttributeError:
            continue
        if kind == "f":
            continue
        at = 0
        for run_start, n in within:
            lo, hi = max(start, run_start), min(end, run_start + n)
            if lo < hi:
                out.append((at + lo - run_start, lo, hi - lo, name))
            at += n
    return out


def model_identity(model: mujoco.MjModel, runs: list[tuple[int, int]]) -> np.ndarray:
    """What a model is, as graph capture sees it: its sizes, its options and every array byte outside the
    captured runs (the assets), not the values captured (nor the statistics MuJoCo derives from them: robosuite
    draws a cube's size at each build, and two builds of one task must restore each other's capsules)."""
    parts = [np.array([getattr(model, n) for n in sorted(dir(model)) if n.startswith("n") and isinstance(
        getattr(model, n, None), int)], np.int64).tobytes()]
    opt = model.opt
    parts += [np.asarray(getattr(opt, n)).tobytes() for n in sorted(dir(opt)) if not n.startswith("_")
              and isinstance(getattr(opt, n), (int, float, np.ndarray))]
    covered = sorted(runs)
    for start, end, _ in handle_fields(model):
        at = start
        for run_start, n in covered:  # the bytes of this array outside every run
            if run_start + n <= at or run_start >= end:
                continue
            if run_start > at:
                parts.append(memory_view(at, run_start - at).tobytes())
            at = max(at, run_start + n)
        if at < end:
            parts.append(memory_view(at, end - at).tobytes())
    return np.frombuffer(b"".join(parts), np.uint8)


def memory_view(address: int, n: int) -> np.ndarray:
    return np.frombuffer((ctypes.c_char * n).from_address(address), np.uint8)


def space_bytes(space: Any) -> int:
    """Bytes one observation of `space` takes (Boxes and Dicts of them; 0 for anything else)."""
    if isinstance(space, gym.spaces.Dict):
        return sum(space_bytes(v) for v in space.spaces.values())
    if isinstance(space, gym.spaces.Box):
        return int(np.prod(space.shape, dtype=np.int64)) * space.dtype.itemsize
    return 0


def native_leaves(space: Any, task: str) -> list[tuple[str, tuple, tuple[int, ...], np.dtype]]:
    """(key, path into the observation, shape, dtype) of each leaf of an observation space: `observation` for a
    Box, `observation.<key>[.<key>...]` for a Dict's leaves (nested dicts by their keys, in order)."""
    out = []

    def visit(s: Any, path: tuple) -> None:
        if isinstance(s, gym.spaces.Dict):
            for k, v in s.spaces.items():
                visit(v, (*path, k))
        elif isinstance(s, gym.spaces.Box):
            dtype = np.dtype(s.dtype)
            if dtype.kind not in "biuf":
                raise MujocoCapsuleError(f"{task}: observation {'.'.join(map(str, path)) or 'space'} has dtype {dtype}; a "
                                 "capsule holds bool, integer and float observations")
            out.append((".".join((OBSERVATION_KEY, *map(str, path))), path, tuple(s.shape), dtype))
        else:
            raise MujocoCapsuleError(f"{task}: observation space {s} is not made of Boxes and Dicts")

    visit(space, ())
    return out


def zeros_like_space(space: gym.spaces.Space) -> Any:
    if isinstance(space, gym.spaces.Dict):
        return {k: zeros_like_space(v) for k, v in space.spaces.items()}
    if isinstance(space, gym.spaces.Box):
        return np.zeros(space.shape)
    raise TypeError(space)


def _store(attr: Attr, value: Any, view: np.ndarray, task: str, mjdata: tuple[int, int]) -> None:
    """Write a declared attribute's value into its capsule view (`mjdata`: MjData's buffer, address and size)."""
    if attr.kind == "array":
        arr = np.asarray(value)
        if arr.shape != view.shape:
            raise MujocoCapsuleError(f"{task}: attribute {attr.path!r} has shape {arr.shape}, declared "
                                     f"{view.shape}")
        if _inside(arr, *mjdata):
            raise MujocoCapsuleError(f"{task}: attribute {attr.path!r} is a live view into MjData; "
                                     "drop it from the declaration (MjData is captured whole)")
        view[...] = arr
    elif attr.kind in ("list", "set"):
        index = {item: i for i, item in enumerate(attr.universe)}
        try:
            order = [index[item] for item in value]
            if attr.kind == "set":  # a set's iteration order is not state: keep it canonical (universe order)
                order.sort()
        except KeyError as exc:
            raise MujocoCapsuleError(f"{task}: {attr.path!r} holds {exc.args[0]!r}, not in its "
                                     f"declared universe {attr.universe}") from None
        view[:] = -1
        view[: len(order)] = order
    else:
        view[0] = value


def _load(attr: Attr, view: np.ndarray) -> Any:
    if attr.kind == "array":
        return view.copy()
    if attr.kind == "int":
        return int(view[0])
    if attr.kind == "float":
        return float(view[0])
    if attr.kind == "bool":
        return bool(view[0])
    items = [attr.universe[int(i)] for i in view if i >= 0]
    return items if attr.kind == "list" else set(items)


_LOADERS = {"array": np.copy, "int": lambda v: int(v[0]), "float": lambda v: float(v[0]), "bool": lambda v: bool(v[0])}


def _inside(arr: np.ndarray, start: int, size: int) -> bool:
    if not arr.nbytes:
        return False
    base = arr.__array_interface__["data"][0]
    return start <= base < start + size


def check_wrappers(layers: list[gym.Env], capture: CaptureSpec) -> list[tuple[object, str, Attr]]:
    """The declared capture's wrapper counters: (wrapper, attribute, Attr); a wrapper with state of its own
    that no declaration names is refused."""
    counters = {**KNOWN_WRAPPERS, **capture.wrapper_state}
    found = []
    for layer in layers:
        if not isinstance(layer, gym.Wrapper):
            continue
        kind = type(layer).__name__
        names = counters.get(kind)
        if names is None:
            extra = sorted(set(vars(layer)) - WRAPPER_PLUMBING)
            if extra:
                raise MujocoCapsuleError(
                    f"wrapper {kind} keeps state the adapter does not know ({', '.join(extra)}): remove it "
                    f"(gymnasium.make(..., disable_env_checker=True) leaves out PassiveEnvChecker; record "
                    f"statistics with the rollout host instead of RecordEpisodeStatistics), or declare its "
                    f"counters in the suite's CaptureSpec.wrapper_state")
            continue
        for name in names:
            found.append((layer, name, Attr(f"{kind}.{name}", WRAPPER_COUNTER_TYPES.get(name, "int"))))
    return found


def mjv_camera(model: mujoco.MjModel, cam: Camera, task: str) -> mujoco.MjvCamera | str:
    """The renderer's camera for `cam`: a model camera's name, or a free camera with its fixed parameters."""
    if cam.model_camera is not None:
        if mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, cam.model_camera) < 0:
            raise MujocoCapsuleError(f"{task}: camera {cam.name!r} names model camera "
                                     f"{cam.model_camera!r}, which the model lacks")
        return cam.model_camera
    free = mujoco.MjvCamera()
    free.type = mujoco.mjtCamera.mjCAMERA_FREE
    free.lookat[:] = cam.lookat
    free.distance, free.azimuth, free.elevation = cam.distance, cam.azimuth, cam.elevation
    return free


SLAB_MIN = 1 << 16


def slab_size(held: int, observation: int) -> int:
    """The graph capture's Python buffer, sized from the env: twice what it holds when built (`held`: its Python
    state's bytes) and an observation it may keep by value, rounded up to a power of two, at least 64 KiB. Room
    to grow to twice its size; past it a snapshot is refused naming the largest arrays and the fix
    (`slab_overflow`)."""
    size = SLAB_MIN
    while size < 2 * (held + observation):
        size *= 2
    return size


def slab_overflow(task: str, env: gym.Env, used: int, capacity: int) -> MujocoCapsuleError:
    """The error for a Python state larger than its buffer, naming the env's largest arrays."""
    arrays = sorted(((n.obj.nbytes, n.path) for n in walk(env).values() if n.kind == "array"), key=lambda x: -x[0])
    big = ", ".join(f"{fmt(p)} {nbytes:,} B" for nbytes, p in arrays[:3])
    return MujocoCapsuleError(f"{task}: the env's Python state is {used:,} bytes, more than the {capacity:,} its "
                              f"capsule buffer holds (largest arrays: {big}); give the suite's CaptureSpec a larger "
                              "python_bytes, or exclude what is not state (CaptureSpec.exclude)")
