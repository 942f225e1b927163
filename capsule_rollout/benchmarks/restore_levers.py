"""Restore against reset, and what each lever of the graph capture's compiled restore gives (issue 52).

    python -m capsule_rollout.benchmarks.restore_levers ROUNDS [--levers] ENV... > out.json

For each env (a registered id or a factory's import path, made by `envs.suites.make_env` with no camera): two envs
of it, one that only resets (`reset(seed=0)`) and one that only restores the capsule taken right after its own
`reset(seed=0)` (as a host does: a restore is its reset), each after 2 random steps, in paired rounds; the median
and p99 of each in microseconds, and the capsule file's bytes. `--levers`: for a graph-captured env, the restore
again with each lever turned off, each in fresh envs: `no_bound` (every restore resolves its targets again),
`no_quick_generators` (generator states thawed with the rest, an MT19937 key as an array), `no_array_templates`
(arrays rebuilt by the pickle). Run with another tree first on `PYTHONPATH` to measure it the same way.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import numpy as np

import capsule_rollout
from capsule_rollout.capsules import Arena, restore, save_capsule, snapshot
from capsule_rollout.envs.suites import make_env

LEVERS = ("no_bound", "no_quick_generators", "no_array_templates")


@contextmanager
def _turned_off(lever: str, env) -> Iterator[None]:
    """`lever` off for `env` while inside (each put back after)."""
    from capsule_rollout.capsules import graph_read, graph_state

    quick, persistent_id = graph_state.quick_state, graph_read._Freezer.persistent_id
    if lever == "no_bound":
        class Never(dict):
            def __setitem__(self, key, value) -> None:
                pass

        env._graph._bound = Never()
    elif lever == "no_quick_generators":
        graph_state.quick_state = lambda state: state
    elif lever == "no_array_templates":
        def plain(self, obj):
            t = type(obj)
            if t is graph_read.Ref:
                return ("r", obj.pid)
            if t is graph_read.BoundRef:
                return ("m", obj.owner.pid, obj.name)
            return None

        graph_read._Freezer.persistent_id = plain
    try:
        yield
    finally:
        graph_state.quick_state, graph_read._Freezer.persistent_id = quick, persistent_id


def measure(env_id: str, rounds: int, lever: str = "") -> dict:
    env = make_env(env_id, cameras=())
    with _turned_off(lever, env) if lever else nullcontext():
        return _measure(env, make_env(env_id, cameras=()), rounds)


def _measure(env, other, rounds: int) -> dict:
    arena = Arena([env]).allocate()
    env.reset(seed=0)
    other.reset(seed=0)
    capsule = snapshot(arena)
    space = env.action_space
    space.seed(0)

    def dirty(e) -> None:
        for _ in range(2):
            e.step(space.sample())

    for _ in range(5):
        dirty(env), restore(arena, capsule), dirty(other), other.reset(seed=0)
    restores, resets = [], []
    for _ in range(rounds):
        dirty(env)
        t = time.perf_counter()
        restore(arena, capsule)
        restores.append(time.perf_counter() - t)
        dirty(other)
        t = time.perf_counter()
        other.reset(seed=0)
        resets.append(time.perf_counter() - t)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "c.safetensors")
        save_capsule(capsule, path)
        size = os.path.getsize(path)
    graph = getattr(env, "_graph", None) is not None
    env.close()
    other.close()

    def us(v: list[float], q: float) -> float:
        return round(float(np.percentile(np.array(v) * 1e6, q)), 1)

    return {"reset_med": us(resets, 50), "reset_p99": us(resets, 99), "restore_med": us(restores, 50),
            "restore_p99": us(restores, 99), "graph": graph, "file_bytes": size}


def main(argv: list[str]) -> dict:
    rounds, levers = int(argv[0]), "--levers" in argv
    out: dict = {"code": capsule_rollout.__file__}
    for env_id in [a for a in argv[1:] if a != "--levers"]:
        out[env_id] = {"all": measure(env_id, rounds)}
        if levers and out[env_id]["all"]["graph"]:
            for lever in LEVERS:
                out[env_id][lever] = measure(env_id, rounds, lever)
        print(env_id, json.dumps(out[env_id]), file=sys.stderr, flush=True)
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
