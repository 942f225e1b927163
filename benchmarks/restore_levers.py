"""Restore against reset, and what each lever of the graph capture's compiled restore gives (issue 52).

For each env (a registered id or a factory's import path, made by `envs.suites.make_env` with no camera): two envs
of it, one that only resets (`reset(seed=0)`) and one that only restores the capsule taken right after its own
`reset(seed=0)` (as a host does: a restore is its reset), each after 2 random steps, in paired rounds; the median
and p99 of each in microseconds, and the capsule file's bytes. With `--levers` (the default), for a graph-captured
env, the restore again with each lever turned off, each in fresh envs: `no_bound` (every restore resolves its
targets again), `no_quick_generators` (generator states thawed with the rest, an MT19937 key as an array),
`no_array_templates` (no templates compiled: the states read from their bytes at every restore), `no_direct` (a bound
restore's states made as dicts and tuples, then applied, not set straight into the objects), `no_word_copies` (every
generator state, the global ones too, set through numpy's and random's own setters, not by copying its words),
`no_kept_arrays` (the env's checks read the capsule through numpy views made from its tensors at every restore,
torch called each time, not views kept with the capsule), `no_direct_copies` (the MjData image and the model runs
copied into the arena, then from there into MjData and MjModel, not straight from the capsule: only an env whose
MjData buffer is `envs.mujoco_capsule.DIRECT_BYTES` or more copies them straight). The summary names
the package it measured (`code`): to measure another tree the same way, run this from outside the repository with
both on `PYTHONPATH`, that tree first.
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import numpy as np

import capsule_rollout
from benchmarks import harness
from benchmarks.report import Block, Table, publish
from capsule_rollout.capsules import Arena, restore, save_capsule, snapshot
from capsule_rollout.commands.result import ExperimentResult, checking_inputs
from capsule_rollout.envs.suites import make_env


@dataclass(frozen=True)
class RestoreLeversConfig:
    env: tuple[str, ...] = ("gymnasium:Ant-v5", "examples.own_env_and_policy:make_env")
    """Envs measured: registered ids (`suite:task`) or factories' import paths (`package.module:factory`); the
    defaults are one declared env and one graph-captured, both in the project's venv."""
    rounds: int = 200
    """Paired rounds of reset and restore per env (and per lever turned off)."""
    levers: bool = True
    """For a graph-captured env, measure the restore again with each lever of the compiled restore turned off."""
    docs: str = ""
    """Markdown file whose restore_levers section is replaced by the results; empty: none."""

    def __post_init__(self) -> None:
        if self.rounds < 3 or not self.env:
            raise ValueError("--rounds must be >= 3 and --env must name one or more envs")


LEVERS = ("no_bound", "no_quick_generators", "no_array_templates", "no_direct", "no_word_copies", "no_kept_arrays",
          "no_direct_copies")


@contextmanager
def _turned_off(lever: str, env) -> Iterator[None]:
    """`lever` off for `env` while inside (each put back after). The levers are the compiled restore's own
    (`capsules.graph.state`'s names, patched where it looks them up)."""
    from capsule_rollout.capsules.graph import state as graph_state
    from capsule_rollout.envs import mujoco_capsule

    quick, compile_template = graph_state.quick_state, graph_state.compile_template
    compile_direct, kept_arrays = graph_state.compile_direct, mujoco_capsule.host_arrays
    if lever == "no_bound":
        class Never(dict):
            def __setitem__(self, key, value) -> None:
                pass

        env._graph._bound = Never()
    elif lever == "no_quick_generators":
        graph_state.quick_state = lambda state: state
    elif lever == "no_array_templates":  # no template compiled: every restore reads the states from their bytes
        graph_state.compile_template = lambda *args, **kwargs: None
    elif lever == "no_direct":  # the states made as dicts and tuples, then applied
        graph_state.compile_direct = lambda *args, **kwargs: None
    elif lever == "no_word_copies":  # every generator state set through numpy's and random's own setters
        def own_globals(numpy_state, python_state) -> None:
            np.random.set_state(numpy_state)
            random.setstate(python_state)

        env._graph._generators.set, env._graph._generators.set_globals = graph_state.set_generator_state, own_globals
    elif lever == "no_direct_copies":  # read by the arena when it is allocated (`_measure`, after this)
        env.direct_buffers = ()
    elif lever == "no_kept_arrays":  # the check's numpy views made from the capsule's tensors at every restore
        mujoco_capsule.host_arrays = lambda view: {k: v.numpy() for k, v in view.items() if v.device.type == "cpu"}
    try:
        yield
    finally:
        graph_state.quick_state, graph_state.compile_template = quick, compile_template
        graph_state.compile_direct, mujoco_capsule.host_arrays = compile_direct, kept_arrays


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


LEVER_NAMES = {"no_bound": "without bound targets", "no_quick_generators": "without shared generator states",
               "no_array_templates": "without templates", "no_direct": "without states set straight in",
               "no_word_copies": "without generator words copied", "no_kept_arrays": "without arrays kept per capsule",
               "no_direct_copies": "without MjData copied straight from the capsule"}


def measure_all(config: RestoreLeversConfig) -> dict:
    """Every env of the config (and each lever turned off, for a graph-captured one with `levers`), and the package
    measured."""
    out: dict = {"code": capsule_rollout.__file__}
    for env_id in config.env:
        print(f"{env_id} ...", flush=True)
        out[env_id] = {"all": measure(env_id, config.rounds)}
        if config.levers and out[env_id]["all"]["graph"]:
            for lever in LEVERS:
                out[env_id][lever] = measure(env_id, config.rounds, lever)
    return out


def report(summary: dict, config: RestoreLeversConfig) -> list[Block]:
    envs = [e for e in config.env if e in summary]
    rows = []
    for env_id in envs:
        a = summary[env_id]["all"]
        rows.append((f"`{env_id}` ({'graph' if a['graph'] else 'declared'})",
                     f"{a['reset_med']:,.0f} / {a['reset_p99']:,.0f}", f"{a['restore_med']:,.0f} / {a['restore_p99']:,.0f}",
                     f"{a['restore_med'] / a['reset_med']:.2f}x", f"{a['file_bytes']:,}"))
    blocks: list[Block] = [
        f"`python -m benchmarks.restore_levers`, {config.rounds} paired rounds per env, package `{summary['code']}`. "
        "Two envs of each: one only resets (`reset(seed=0)`), the other only restores the capsule taken right after "
        "its own `reset(seed=0)`, each after 2 random steps; median / p99 in us; capsule bytes: the signed file.",
        Table(("env", "reset(seed) median / p99", "restore median / p99", "restore / reset", "capsule file"), rows,
              title="restore against reset (us)")]
    levered = [e for e in envs if set(LEVERS) <= set(summary[e])]
    if levered:
        blocks += ["The levers, each turned off alone in the same run (restore median, us):",
                   Table(("env", "now", *LEVER_NAMES.values()),
                         [(f"`{e}`", f"{summary[e]['all']['restore_med']:,.0f}",
                           *(f"{summary[e][lever]['restore_med']:,.0f}" for lever in LEVER_NAMES)) for e in levered],
                         title="the levers of the compiled restore (restore median, us)")]
    return blocks


def run(config: RestoreLeversConfig) -> ExperimentResult:
    with checking_inputs():
        for env_id in config.env:
            make_env(env_id, cameras=()).close()
    summary = measure_all(config)
    publish("restore_levers", report(summary, config), config.docs)
    return ExperimentResult(summary)


def main(argv: list[str] | None = None) -> int:
    return harness.main(RestoreLeversConfig(), run, "benchmarks.restore_levers", __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
