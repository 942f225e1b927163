"""An env's capsule checked the way rollouts use it (`verify_capsule --env`), beside the harness's generic checks.

Each scenario takes a capsule at one point, plays the same actions from it twice and compares every output bit
for bit: the observation arrays (images included), the reward, `terminated` and the whole of MjData's buffer.

- `after_reset`: the capsule taken right after `reset(seed)` (what every rollout's first reset saves), restored
  after the env was played elsewhere;
- `other_seed`: restored after a `reset()` to another seed (an actor's next episode);
- `many_restores`: restored and played `restores` times in a row;
- `another_env`: restored after a second env of the same id was built and played in this process, then dropped
  and garbage-collected (an actor's other slot, an env rebuilt): a suite's renderer that draws in or frees
  another's GL context, or a framework image that redirects the suite's, shows here;
- `fresh_process`: written to a file and restored into an env built from scratch in another process (what a Ray
  actor does with a capsule another actor saved).

A failed scenario names the first output that differs: the step, the observation key or MjData field and the
element, with both values; and, for an env with a Python object graph (a gymnasium env and its wrappers), the
Python paths whose values differ right after the restore from what they were when the capsule was taken
(`envs.object_graph`: attributes, arrays, generators, attributes an object lacks). The report also lists what
the adapter's graph capture found: aliases into MjData, generators, objects it takes from the env as they are.
"""

from __future__ import annotations

import gc
import json
import os
import secrets
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import mujoco
import numpy as np

from capsule_rollout.capsules import Arena, load_capsule, restore, save_capsule, signing_key, snapshot
from capsule_rollout.capsules.signing_key import KEY_ENV
from capsule_rollout.capsules.verify import first_difference, is_image
from capsule_rollout.envs.mujoco_capture import buffer_bytes, mjdata_buffer
from capsule_rollout.envs.object_graph import GraphState, differing_paths, fmt

SCENARIOS = ("after_reset", "other_seed", "many_restores", "another_env", "fresh_process")


@dataclass
class ScenarioReport:
    env: str
    checks: dict[str, bool] = field(default_factory=dict)
    divergences: dict[str, str] = field(default_factory=dict)  # scenario -> the first output that differs
    errors: dict[str, str] = field(default_factory=dict)  # scenario -> what raised
    python_paths: dict[str, list[str]] = field(default_factory=dict)  # scenario -> paths differing after restore
    capture: dict[str, object] = field(default_factory=dict)  # what the graph capture found (graph envs)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(self.checks.values()) and not self.errors

    def failures(self) -> list[str]:
        out = [f"{name}: {self.divergences.get(name, 'differs')}" + (
            f"; Python paths differing after the restore: {', '.join(self.python_paths[name])}"
            if self.python_paths.get(name) else "") for name, ok in self.checks.items() if not ok]
        return out + [f"{name}: {why}" for name, why in self.errors.items()]

    def to_json(self) -> dict:
        return asdict(self) | {"ok": self.ok}


def mjdata_fields(data: mujoco.MjData, start: int, size: int) -> list[tuple[int, int, str, int]]:
    """(byte offset, bytes, field name, element size) of every MjData array inside its buffer, by offset."""
    out = []
    for name in dir(data):
        if name.startswith("_"):
            continue
        try:
            arr = getattr(data, name)
        except Exception:  # noqa: BLE001 - a property that cannot be read here is no array of the buffer
            continue
        if isinstance(arr, np.ndarray) and arr.nbytes and start <= arr.ctypes.data < start + size:
            out.append((arr.ctypes.data - start, arr.nbytes, name, arr.itemsize))
    return sorted(out)


def _buffer(env) -> tuple[int, int] | None:
    """Address and size of the env's MjData buffer (None: the env shows no MjData)."""
    data = getattr(env, "data", None)
    return mjdata_buffer(data) if isinstance(data, mujoco.MjData) else None


PATHS_SHOWN = 8


def python_dump(env) -> dict[str, str] | None:
    """Every Python value reachable from the env's gymnasium env, by path (None: the env is no wrapped
    gymnasium env)."""
    inner = getattr(env, "env", None)
    if inner is None or not hasattr(inner, "unwrapped"):
        return None
    return {f"env{k}": v for k, v in GraphState(inner, exclude=getattr(getattr(env, "capture", None), "exclude",
                                                                        ())).dump().items()}


def capture_summary(env) -> dict[str, object]:
    """What the adapter's graph capture finds in the env: counts by kind, the aliases into MjData (with their
    fields), the generators, the objects taken from the env as they are (opaque), the Python state's bytes."""
    graph = getattr(env, "_graph", None)
    if graph is None:
        return {}
    nodes = [n for n in graph.nodes().values() if n.path is not None]
    dump = graph.dump()
    kinds: dict[str, int] = {}
    for n in nodes:
        kinds[n.kind] = kinds.get(n.kind, 0) + 1
    return {"kinds": kinds,
            "aliases": {f"env{fmt(n.path)}": dump[fmt(n.path)] for n in nodes
                        if n.kind == "array" and dump.get(fmt(n.path), "").startswith("alias")},
            "generators": [f"env{fmt(n.path)} {type(n.obj).__name__}" for n in nodes if n.kind == "generator"],
            "opaque": [f"env{fmt(n.path)} {type(n.obj).__name__}" for n in nodes if n.kind == "opaque"][:20],
            "python_bytes": int(env._np["python_len"][0]), "python_capacity": int(env._python_bytes),
            "after_mj_step1": bool(env._np["physics_flags"][0])}


def _outputs(env, actions: np.ndarray) -> list[dict[str, np.ndarray]]:
    """Play `actions` from the env's state: per step, every observation array, reward, terminated, MjData."""
    where, steps = _buffer(env), []
    for action in actions:
        obs, reward, terminated, _, _ = env.step(action)
        out = {f"obs.{k}": np.asarray(v) for k, v in obs.items()}
        out["reward"], out["terminated"] = np.float64(reward), np.bool_(terminated)
        if where is not None:
            out["mjdata"] = buffer_bytes(*where)
        steps.append(out)
    return steps


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Element-wise bit equality (NaN-safe) of two flat arrays of one dtype."""
    if a.dtype == np.bool_ or a.dtype.itemsize not in (1, 2, 4, 8):  # flags, text (a prompt)
        return a == b
    bits = np.dtype(f"u{a.itemsize}")
    return np.ascontiguousarray(a).view(bits) == np.ascontiguousarray(b).view(bits)


def first_divergence(ref: list[dict], got: list[dict], fields: list[tuple[int, int, str, int]]) -> str | None:
    """The first output of `got` that is not bit-identical to `ref`'s (None: all are): step, key, element."""
    for step, (r, g) in enumerate(zip(ref, got)):
        physics_same = "mjdata" in r and "mjdata" in g and bool(np.all(_same(r["mjdata"], g["mjdata"])))
        # the physics first (a cause, not an effect), then images (a pixel says more than the state flattening it)
        for key in sorted(r, key=lambda k: (k != "mjdata", not is_image(np.asarray(r[k])))):
            if key != "mjdata":  # an image by pixel, as the harness names it (`capsules.verify.first_difference`)
                why = first_difference(f"step {step} {key}", np.asarray(r[key]), np.asarray(g.get(key)))
                if why is not None:
                    return why + (" (MjData identical: state kept outside MjData)" if physics_same else "")
                continue
            a, b = np.asarray(r[key]).reshape(-1), np.asarray(g.get(key)).reshape(-1)
            if a.shape != b.shape or a.dtype != b.dtype:
                return f"step {step} {key}: {a.size} {a.dtype} values vs {b.size} {b.dtype}"
            differ = np.flatnonzero(~_same(a, b))
            if not differ.size:
                continue
            i = int(differ[0])
            for offset, nbytes, name, itemsize in fields:
                if offset <= i < offset + nbytes:
                    dtype = {8: np.float64, 4: np.int32, 1: np.uint8}.get(itemsize, np.uint8)
                    x, y = (np.frombuffer(v[offset:offset + nbytes].tobytes(), dtype) for v in (a, b))
                    k = (i - offset) // x.itemsize
                    return f"step {step} MjData.{name}[{k}]: {x[k].item()!r} vs {y[k].item()!r}"
            return f"step {step} MjData byte {i} (between its arrays)"
    if len(ref) != len(got):
        return f"{len(got)} steps played, {len(ref)} expected"
    return None


def _actions(env, steps: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    low, high = env.action_space.low, env.action_space.high
    return (low + rng.random((steps, *low.shape)) * (high - low)).astype(env.action_space.dtype)


def verify_scenarios(env_id: str, *, cameras: tuple[str, ...] | None = None, image_size: int = 64, seed: int = 0,
                     steps: int = 8, restores: int = 5) -> ScenarioReport:
    """Every scenario on env `env_id` (a registered id or import path); never raises for a failed check."""
    from capsule_rollout.envs.suites import make_env

    report = ScenarioReport(env_id)
    env = make_env(env_id, cameras=cameras, image_size=image_size)
    try:
        arena = Arena([env]).allocate()
        where = _buffer(env)
        fields = mjdata_fields(env.data, *where) if where is not None else []
        actions, other = _actions(env, steps, seed + 1), _actions(env, steps, seed + 2)
        try:
            env.reset(seed=seed)
            capsule = snapshot(arena, label=f"after-reset:{env_id}", step=0)
            dumped = python_dump(env)
            report.capture = capture_summary(env)
            reference = _outputs(env, actions)
        except Exception as exc:  # noqa: BLE001 - a report says what broke
            report.errors["reset_and_play"] = f"{type(exc).__name__}: {exc}"
            return report

        def check(name: str, got: list[dict], after: dict[str, str] | None) -> None:
            why = first_divergence(reference, got, fields)
            report.checks[name] = why is None
            if why is not None:
                report.divergences[name] = why
                if dumped is not None and after is not None:
                    report.python_paths[name] = differing_paths(dumped, after)[:PATHS_SHOWN]

        def scenario(name: str, play) -> None:
            try:
                play()
            except Exception as exc:  # noqa: BLE001 - a report says what broke
                report.errors[name] = f"{type(exc).__name__}: {exc}"

        def after_reset() -> None:
            _outputs(env, other)  # played elsewhere first
            restore(arena, capsule)
            after = python_dump(env)
            check("after_reset", _outputs(env, actions), after)

        def other_seed() -> None:
            env.reset(seed=seed + 1000)
            _outputs(env, other[: steps // 2])
            restore(arena, capsule)
            after = python_dump(env)
            check("other_seed", _outputs(env, actions), after)

        def many_restores() -> None:
            worst = None
            for _ in range(restores):
                restore(arena, capsule)
                after = python_dump(env)
                why = first_divergence(reference, _outputs(env, actions), fields)
                if why is not None and worst is None:
                    worst = why
                    if dumped is not None and after is not None:
                        report.python_paths["many_restores"] = differing_paths(dumped, after)[:PATHS_SHOWN]
            report.checks["many_restores"] = worst is None
            if worst is not None:
                report.divergences["many_restores"] = worst

        def another_env() -> None:
            second = make_env(env_id, cameras=cameras, image_size=image_size)
            second.reset(seed=seed + 2000)
            _outputs(second, other[: steps // 2])
            del second  # dropped, not closed: freed whenever the garbage collector finds it
            gc.collect()
            restore(arena, capsule)
            after = python_dump(env)
            check("another_env", _outputs(env, actions), after)

        def fresh_process() -> None:
            with tempfile.TemporaryDirectory() as tmp:
                path, acts, out = Path(tmp) / "c.capsule", Path(tmp) / "a.npy", Path(tmp) / "out.npz"
                key = secrets.token_hex(32)  # this check's own: the fresh process reads only what it signed
                save_capsule(capsule, path, key=key)
                np.save(acts, actions)
                args = json.dumps({"env": env_id, "cameras": cameras, "image_size": image_size, "capsule": str(path),
                                   "actions": str(acts), "out": str(out)})
                done = subprocess.run([sys.executable, "-m", __name__, args], capture_output=True, text=True,
                                      timeout=600, env={**os.environ, KEY_ENV: key})
                if done.returncode != 0:
                    tail = (done.stderr.strip().splitlines() or ["(nothing printed)"])[-1]
                    raise RuntimeError(f"the fresh process failed (exit {done.returncode}): {tail}")
                with np.load(out) as z:
                    got = [{k.split("/", 1)[1]: z[k] for k in z.files if k.startswith(f"{i}/")} for i in range(steps)]
                dump_file = out.with_suffix(".json")
                after = json.loads(dump_file.read_text()) if dump_file.exists() else None
                check("fresh_process", got, after)

        for name, play in zip(SCENARIOS, (after_reset, other_seed, many_restores, another_env, fresh_process)):
            scenario(name, play)
    finally:
        env.close()
    return report


def _play_in_this_process(args: dict) -> None:
    """The fresh process: build the env from scratch, restore the capsule file, play the actions, save outputs."""
    from capsule_rollout.envs.suites import make_env

    env = make_env(args["env"], cameras=tuple(args["cameras"]) if args["cameras"] is not None else None,
                   image_size=args["image_size"])
    arena = Arena([env]).allocate()
    restore(arena, load_capsule(args["capsule"], key=signing_key()))
    dumped = python_dump(env)
    if dumped is not None:
        Path(args["out"]).with_suffix(".json").write_text(json.dumps(dumped))
    outputs = _outputs(env, np.load(args["actions"]))
    np.savez(args["out"], **{f"{i}/{k}": v for i, step in enumerate(outputs) for k, v in step.items()})
    env.close()


if __name__ == "__main__":
    _play_in_this_process(json.loads(sys.argv[1]))
