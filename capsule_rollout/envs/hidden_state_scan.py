"""The hidden-state scan: where does a gymnasium MuJoCo env keep state outside MjData?

`scan_env(make)` builds the env, resets and steps it, and compares every attribute
of every wrapper layer and nested env, and every `MjModel` array, across those
calls. What changes is state a capsule must hold: the report lists it as
candidate declarations for a `CaptureSpec` (attributes with their shapes, model
fields, wrapper counters), marks attributes that are live views into MjData (not
to be declared: MjData is captured whole), lists the numpy generators the adapter
finds by itself, and says whether `reset(seed)` honours its seed. It also walks the env's whole object
graph as the adapter's graph capture does (`envs.object_graph`) and lists every Python path whose value
changed: what a capsule holds with nothing declared. Whether the seed is honoured is judged on everything
reset leaves: the observation, MjData's whole buffer and those Python values (generators aside), so a seed
that only moves an object the observation does not show still counts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import mujoco
import numpy as np

from capsule_rollout.envs.mujoco_capture import (
    KNOWN_WRAPPERS,
    WRAPPER_PLUMBING,
    Attr,
    CaptureSpec,
    buffer_bytes,
    find_generators,
    find_physics,
    flatten,
    layers_of,
    mjdata_buffer,
)
from capsule_rollout.envs.object_graph import GraphState, differing_paths

_PRIMITIVE = (bool, int, float, str, np.bool_, np.integer, np.floating)


@dataclass
class ScanReport:
    """What `scan_env` found (`lines()` renders it for a terminal)."""

    task: str
    candidates: list[str] = field(default_factory=list)
    """Attributes that changed, as `Attr(...)` declarations (paths from the unwrapped env)."""
    declared: list[str] = field(default_factory=list)
    """Candidates the suite already declares."""
    live_views: list[str] = field(default_factory=list)
    model_fields: list[str] = field(default_factory=list)
    wrappers: list[str] = field(default_factory=list)
    generators: list[str] = field(default_factory=list)
    seed_honoured: bool = True
    reset_deterministic: bool = True
    unsupported: list[str] = field(default_factory=list)
    """Changing attributes of a type the adapter cannot declare (declare a state function or remove them)."""
    graph_paths: list[str] = field(default_factory=list)
    """Python paths (whole object graph) whose values changed across reset / step: what graph capture holds."""
    model_rebuilt: bool = False
    """The env built a new MjModel / MjData at a reset (robosuite does at every one)."""
    seed_shows_in: str = ""
    """Where two seeds' resets differ: observation, MjData, Python state (empty: nowhere)."""

    def lines(self) -> list[str]:
        out = [f"hidden-state scan of {self.task}"]
        out.append("  wrappers: " + (", ".join(self.wrappers) or "none"))
        out.append(f"  numpy generators found (captured automatically): {len(self.generators)}")
        out += [f"    {g}" for g in self.generators]
        out.append("  reset(seed) " + (f"honours its seed (it shows in the {self.seed_shows_in})" if self.seed_honoured
                                       else "IGNORES its seed (observation, MjData and Python state alike): "
                                       "declare CaptureSpec.seed to seed the suite its own way"))
        if not self.reset_deterministic:
            out.append("  reset(seed) is NOT deterministic: it draws from a source the seed does not set "
                       "(e.g. the global np.random)")
        out.append("  candidate attribute declarations (changed across reset / step):")
        out += [f"    {c}{'   # declared' if c in self.declared else ''}" for c in self.candidates] or ["    none"]
        if self.live_views:
            out.append("  live views into MjData (do not declare: MjData is captured whole):")
            out += [f"    {v}" for v in self.live_views]
        if self.model_rebuilt:
            out.append("  the env builds a new MjModel / MjData at reset (graph capture follows it; the declared "
                       "capture cannot)")
        out.append("  MjModel fields changed at run time (declare in CaptureSpec.model_fields):")
        out += [f"    {m}" for m in self.model_fields] or ["    none"]
        if self.unsupported:
            out.append("  changing attributes of other types (not declarable as they are):")
            out += [f"    {u}" for u in self.unsupported]
        out.append(f"  Python state the graph capture holds with nothing declared (changed across reset / step): "
                   f"{len(self.graph_paths)} paths")
        out += [f"    {p}" for p in self.graph_paths[:40]]
        if len(self.graph_paths) > 40:
            out.append(f"    ... and {len(self.graph_paths) - 40} more")
        return out


def _objects(env: gym.Env) -> list[tuple[str, object]]:
    """(path prefix, object) of every wrapper layer, the unwrapped env and nested envs."""
    out: list[tuple[str, object]] = []
    for layer in layers_of(env):
        if isinstance(layer, gym.Wrapper):
            out.append((f"{type(layer).__name__}.", layer))
    stack = [("", env.unwrapped, 0)]
    while stack:
        prefix, obj, depth = stack.pop()
        out.append((prefix, obj))
        for name, value in vars(obj).items():
            if isinstance(value, gym.Env) and not isinstance(value, gym.Wrapper) and depth < 3:
                stack.append((f"{prefix}{name}.", value, depth + 1))
    return out


def _value(value: Any) -> Any:
    """A comparable copy of an attribute value, or None when the scan does not follow that type."""
    if isinstance(value, np.ndarray):
        return ("array", value.shape, value.dtype.str, value.tobytes())
    if value is None or isinstance(value, _PRIMITIVE):
        return ("scalar", repr(value))
    if isinstance(value, (list, tuple, set, frozenset)) and all(isinstance(v, _PRIMITIVE) for v in value):
        return (type(value).__name__, repr(sorted(value, key=repr) if isinstance(value, (set, frozenset))
                                           else list(value)))
    if isinstance(value, dict) and all(isinstance(v, _PRIMITIVE + (np.ndarray,)) for v in value.values()):
        return ("dict", repr({k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in value.items()}))
    return None


def _attributes(env: gym.Env) -> dict[str, tuple[Any, Any]]:
    out = {}
    for prefix, obj in _objects(env):
        wrapper = isinstance(obj, gym.Wrapper)
        for name, value in vars(obj).items():
            if wrapper and name in WRAPPER_PLUMBING:
                continue
            if isinstance(value, (mujoco.MjModel, mujoco.MjData, np.random.Generator, gym.spaces.Space, gym.Env)):
                continue
            out[prefix + name] = (value, _value(value))
    return out


def _model_arrays(model: mujoco.MjModel) -> dict[str, bytes]:
    out = {}
    for name in dir(model):
        if name.startswith("_"):
            continue
        try:
            value = getattr(model, name)
        except Exception:  # noqa: BLE001 - some attributes are not readable on every model
            continue
        if isinstance(value, np.ndarray):
            out[name] = value.tobytes()
    return out


def _field_of(arr: np.ndarray, data: mujoco.MjData) -> str:
    base = arr.__array_interface__["data"][0]
    for name in dir(data):
        value = getattr(data, name, None) if not name.startswith("_") else None
        if isinstance(value, np.ndarray) and value.nbytes:
            start = value.__array_interface__["data"][0]
            if start <= base < start + value.nbytes:
                return f"MjData.{name}"
    return "MjData"


def scan_env(make: Callable[[], gym.Env], *, task: str = "", steps: int = 20, seeds: tuple[int, int] = (0, 1),
             capture: CaptureSpec | None = None) -> ScanReport:
    """Reset (two seeds, one twice) and step `make()`'s env, and report the state it keeps outside MjData.
    With `capture`, its seed function seeds each reset and its declarations are marked in the report."""
    env = make()
    u = env.unwrapped
    model, data, where = find_physics(env)
    start, size = mjdata_buffer(data)
    physics = {"model": model, "data": data, "where": where, "start": start, "size": size, "rebuilt": False}
    graph = GraphState(env)
    report = ScanReport(task=task or type(u).__name__)
    for layer in layers_of(env):
        if isinstance(layer, gym.Wrapper):
            kind = type(layer).__name__
            extra = sorted(set(vars(layer)) - WRAPPER_PLUMBING)
            known = kind in KNOWN_WRAPPERS or (capture is not None and kind in capture.wrapper_state)
            verdict = "known" if known else "stateless" if not extra else "UNKNOWN, state: " + ", ".join(extra)
            report.wrappers.append(f"{kind} ({verdict})")
    before_model = _model_arrays(model)
    snaps = [_attributes(env)]
    dumps = [graph.dump()]

    def reset(seed: int):
        if capture is not None and capture.seed is not None:
            capture.seed(env, seed)
        out = env.reset(seed=seed)
        m, d, physics["where"] = find_physics(env, physics["where"])  # a suite may build a new simulation
        if d is not physics["data"]:
            physics.update(model=m, data=d, rebuilt=True)
            physics["start"], physics["size"] = mjdata_buffer(d)
        return out

    obs_a, _ = reset(seeds[0])
    snaps.append(_attributes(env))
    dumps.append(graph.dump())
    state_a = (buffer_bytes(physics["start"], physics["size"]), _seedless(dumps[-1]))
    rng = np.random.default_rng(0)
    for _ in range(steps):
        env.action_space.seed(int(rng.integers(1 << 31)))
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        if term or trunc:
            break
    snaps.append(_attributes(env))
    dumps.append(graph.dump())
    obs_b, _ = reset(seeds[1])
    snaps.append(_attributes(env))
    dumps.append(graph.dump())
    state_b = (buffer_bytes(physics["start"], physics["size"]), _seedless(dumps[-1]))
    obs_c, _ = reset(seeds[0])
    snaps.append(_attributes(env))
    dumps.append(graph.dump())
    # against the model the env holds now: a suite that compiles a new one per reset shows what differs
    model_changes = [n for n, b in _model_arrays(physics["model"]).items() if before_model.get(n) != b]
    report.model_rebuilt = physics["rebuilt"]
    shows = [where for where, differ in (
        ("observation", not np.array_equal(flatten(obs_a), flatten(obs_b))),
        ("MjData", not np.array_equal(state_a[0], state_b[0])),
        ("Python state", state_a[1] != state_b[1])) if differ]
    report.seed_honoured, report.seed_shows_in = bool(shows), ", ".join(shows)
    report.reset_deterministic = np.array_equal(flatten(obs_a), flatten(obs_c))
    report.graph_paths = sorted({p for d in dumps[1:] for p in differing_paths(dumps[0], d)}
                                | {p for a, b in zip(dumps[1:], dumps[2:]) for p in differing_paths(a, b)})
    report.model_fields = sorted(model_changes)
    report.generators = [p for p, _, _ in find_generators(layers_of(env))]
    declared = {a.path for a in capture.attributes} if capture is not None else set()
    for path in sorted(set().union(*snaps)):
        values = [s.get(path, (None, ("missing",)))[1] for s in snaps]
        if all(v == values[0] for v in values):
            continue
        raw = next(s[path][0] for s in reversed(snaps) if path in s)
        start, size = physics["start"], physics["size"]
        if isinstance(raw, np.ndarray) and raw.nbytes and start <= raw.__array_interface__["data"][0] < start + size:
            report.live_views.append(f"{path} ({_field_of(raw, physics['data'])})")
            continue
        decl = _declaration(path, raw, [s[path][0] for s in snaps if path in s])
        if decl is None:
            report.unsupported.append(f"{path}: {type(raw).__name__}")
            continue
        report.candidates.append(decl)
        if path in declared or path.split(".", 1)[0] in KNOWN_WRAPPERS or path.endswith("_np_random_seed"):
            report.declared.append(decl)
    env.close()
    return report


def _seedless(dump: dict[str, str]) -> dict[str, str]:
    """A graph dump without the generators and recorded seeds (they differ between seeds by definition)."""
    return {k: v for k, v in dump.items() if not v.startswith("generator") and "np_random" not in k}


def _declaration(path: str, raw: Any, seen: list[Any]) -> str | None:
    """The `Attr(...)` line a suite module would declare (checked by building it)."""
    if isinstance(raw, np.ndarray):
        Attr(path, "array", tuple(raw.shape), raw.dtype.name)
        return f"Attr({path!r}, 'array', {tuple(raw.shape)!r}, {raw.dtype.name!r})"
    for kind, types in (("bool", (bool, np.bool_)), ("int", (int, np.integer)), ("float", (float, np.floating))):
        if isinstance(raw, types):
            return f"Attr({path!r}, {kind!r})"
    if raw is None:
        other = next((v for v in seen if v is not None), None)
        return _declaration(path, other, []) if other is not None else None
    if isinstance(raw, (list, set, frozenset)):
        universe = tuple(
            dict.fromkeys(item for value in seen if isinstance(value, (list, set, frozenset)) for item in value)
        )
        kind = "list" if isinstance(raw, list) else "set"
        return f"Attr({path!r}, {kind!r}, universe={universe!r})  # complete the universe"
    return None
