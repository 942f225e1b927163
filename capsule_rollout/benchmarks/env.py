"""bench_env's measurements (what they compare: `experiments/bench_env.py`): env stepping speed, `reset(seed)`
against a capsule restore, recorder throughput and the caller's wait, and the same for suite envs."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from capsule_rollout.benchmarks.support import machine, stats_us, timed
from capsule_rollout.capsules import Arena, restore, snapshot
from capsule_rollout.commands.configs import BenchEnvConfig
from capsule_rollout.rollout.demo_collector import record_episode
from capsule_rollout.stores.episode import EpisodeBuilder
from capsule_rollout.stores.npz_recorder import NpzRecorder
from capsule_rollout.stores.zarr_recorder import ZarrRecorder
from capsule_rollout.tabletop.scripted_expert import ScriptedExpert
from capsule_rollout.tabletop.tabletop_env import TabletopEnv

CPU = torch.device("cpu")


def stepping(config: BenchEnvConfig, blocks: int) -> dict:
    """Control steps/s, state-only and with one camera, in interleaved blocks of 100 random actions: the median
    per mode."""
    envs = {"state_only": TabletopEnv(config.family, cameras=()),
            f"rendered_{config.image_size}px": TabletopEnv(config.family, image_size=config.image_size)}
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (100, 4)).astype(np.float32)
    for env in envs.values():
        env.reset(seed=0)
    rates: dict[str, list[float]] = {k: [] for k in envs}

    def block(env: TabletopEnv) -> None:
        for a in actions:
            _, _, term, trunc, _ = env.step(a)
            if term or trunc:
                env.reset(seed=int(rng.integers(1 << 30)))

    for _ in range(blocks):
        for name, env in envs.items():
            rates[name].append(100 / timed(lambda env=env: block(env), CPU))
    for env in envs.values():
        env.close()
    return {name: float(np.median(r)) for name, r in rates.items()}


def resets(config: BenchEnvConfig, rounds: int) -> dict:
    """`env.reset(seed)` against a capsule restore of the same initial state, alone and followed by `observe()`,
    in interleaved rounds: their statistics (us), the reset / restore ratio and the capsule's bytes."""
    env = TabletopEnv(config.family, image_size=config.image_size)
    arena = Arena([env]).allocate()
    env.reset(seed=123)
    initial = snapshot(arena, label="initial")
    samples: dict[str, list[float]] = {"reset_seed": [], "restore": [], "restore_observe": []}
    for _ in range(rounds):
        samples["reset_seed"].append(timed(lambda: env.reset(seed=123), CPU))
        samples["restore"].append(timed(lambda: restore(arena, initial), CPU))
        samples["restore_observe"].append(timed(lambda: (restore(arena, initial), env.observe()), CPU))
    env.close()
    out = {k: stats_us(v) for k, v in samples.items()}
    out["reset_over_restore"] = out["reset_seed"]["median"] / out["restore"]["median"]
    out["capsule_bytes"] = initial.nbytes
    return out


def recorders(config: BenchEnvConfig, n: int, directory: Path) -> dict:
    """`n` expert episodes written as .npz files and appended to a zarr store under `directory`: MB/s of raw
    episode bytes, bytes on disk, and the recording loop's caller time per step (with and without a recorder)."""
    env = TabletopEnv(config.family, image_size=config.image_size)
    episodes = [record_episode(env, ScriptedExpert(env, seed=s).act, seed=s, episode_id=f"bench-{s}") for s in range(n)]
    env.close()
    raw = sum(v.nbytes for ep in episodes for v in ep.steps.values())
    steps = sum(ep.length for ep in episodes)

    def caller_loop(write) -> float:
        """Rebuild every episode step by step (as a control loop does), then hand it to `write`."""
        spent = 0.0
        for ep in episodes:
            s = ep.steps
            t0 = time.perf_counter()
            builder = EpisodeBuilder()
            for t in range(ep.length):
                builder.add(images={"front": s["image_front"][t]}, state=s["state"][t], action=s["action"][t],
                            reward=float(s["reward"][t]), subtask_id=int(s["subtask_id"][t]),
                            timestamp=float(s["timestamp"][t]))
            m = ep.meta
            write(builder.finish(episode_id=m.episode_id, seed=m.seed, task=m.task, instruction=m.instruction,
                                 success=m.success, stop_reason=m.stop_reason))
            spent += time.perf_counter() - t0
        return spent

    npz = NpzRecorder(directory / "npz")
    t0 = time.perf_counter()
    npz_caller = caller_loop(npz.write)
    npz_total = time.perf_counter() - t0
    zarr_rec = ZarrRecorder(directory / "store.zarr")
    t0 = time.perf_counter()
    zarr_caller = caller_loop(zarr_rec.write)
    zarr_rec.close()
    zarr_total = time.perf_counter() - t0
    build_only = caller_loop(lambda ep: None)
    disk = lambda p: sum(f.stat().st_size for f in p.rglob("*") if f.is_file())  # noqa: E731
    return {
        "episodes": n,
        "steps": steps,
        "raw_mb": raw / 1e6,
        "npz": {"mb_s": raw / npz_total / 1e6, "caller_us_per_step": npz_caller / steps * 1e6,
                "disk_mb": disk(directory / "npz") / 1e6},
        "zarr": {"mb_s": raw / zarr_total / 1e6, "caller_us_per_step": zarr_caller / steps * 1e6,
                 "disk_mb": disk(directory / "store.zarr") / 1e6},
        "build_only_us_per_step": build_only / steps * 1e6,
    }


def measure(config: BenchEnvConfig, progress: Callable[[str], object] = lambda _: None) -> dict:
    """The task family's summary: stepping, resets and recorders (fewer rounds with `--quick`), the machine and
    the settings; `progress` is told which measurement starts."""
    quick = config.quick
    progress("stepping ...")
    stepping_rates = stepping(config, 4 if quick else config.step_blocks)
    progress("reset vs restore ...")
    reset_stats = resets(config, 20 if quick else config.resets)
    progress("recorders ...")
    with tempfile.TemporaryDirectory(dir=config.out_dir or None) as tmp:
        recorder_stats = recorders(config, 3 if quick else config.episodes, Path(tmp))
    return {
        "machine": machine(),
        "gl_backend": os.environ.get("MUJOCO_GL"),
        "family": config.family,
        "image_size": config.image_size,
        "quick": quick,
        "stepping": stepping_rates,
        "reset": reset_stats,
        "recorders": recorder_stats,
    }


def suite_env(env_id: str, rounds: int, step_count: int) -> dict:
    """One suite env, state only: `reset(seed)` against a capsule restore of the same initial state (paired
    rounds), the adapter's restore hook alone, the usual way of restoring (below), and steps/s."""
    import copy

    import mujoco

    from capsule_rollout.envs.suites import make_env

    env = make_env(env_id, cameras=())
    arena = Arena([env]).allocate()
    env.reset(seed=123)
    initial = snapshot(arena, label="initial")
    usual = usual_restore(env, copy)
    samples: dict[str, list[float]] = {"reset_seed": [], "restore": [], "restore_hook": [], "usual_restore": []}
    for _ in range(rounds):
        samples["reset_seed"].append(timed(lambda: env.reset(seed=123), CPU))
        samples["restore"].append(timed(lambda: restore(arena, initial), CPU))
        samples["restore_hook"].append(timed(env.after_restore, CPU))
        samples["usual_restore"].append(timed(usual, CPU))
    rng = np.random.default_rng(0)
    actions = rng.uniform(env.action_space.low, env.action_space.high, (step_count, env.action_space.shape[0]))
    restore(arena, initial)
    t0 = time.perf_counter()
    for a in actions:
        _, _, term, trunc, _ = env.step(a.astype(env.action_space.dtype))
        if term or trunc:
            restore(arena, initial)
    steps_s = step_count / (time.perf_counter() - t0)
    env.close()
    out: dict = {k: stats_us(v) for k, v in samples.items()}
    out.update(env=env_id, mujoco=mujoco.__version__, capsule_bytes=initial.nbytes, steps_per_s=steps_s,
               capture="graph" if getattr(env, "_graph", None) is not None else "declared",
               reset_over_restore=out["reset_seed"]["median"] / out["restore"]["median"])
    return out


def usual_restore(env, copy):
    """The usual way, for comparison: `mj_setState(mjSTATE_INTEGRATION)` + `mj_forward`, each generator's
    `bit_generator.state` dict, attributes set from copies (not bit-exact where an env reads derived data).
    Returns a function restoring the state `env` has now that way."""
    import mujoco

    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    state = np.empty(mujoco.mj_stateSize(env.model, spec))
    mujoco.mj_getState(env.model, env.data, state, spec)
    gens = [(owner, name, getattr(owner, name).bit_generator.state) for _, owner, name in env._generators
            if getattr(owner, name, None) is not None]
    attrs = [(owner, name, copy.copy(getattr(owner, name))) for owner, name, *_ in env._attr_views]

    def usual() -> None:
        mujoco.mj_setState(env.model, env.data, state, spec)
        mujoco.mj_forward(env.model, env.data)
        for owner, name, st in gens:
            getattr(owner, name).bit_generator.state = st
        for owner, name, value in attrs:
            setattr(owner, name, copy.copy(value))

    return usual


def measure_suite_envs(config: BenchEnvConfig, progress: Callable[[str], object] = lambda _: None) -> dict:
    """`suite_env` for every env of `config.env` (fewer rounds and steps with `--quick`) on one torch thread,
    and the machine; `progress` is told which env starts."""
    # one torch thread, as each rollout actor runs (HostSpec.threads): the slab copy of a restore is a torch
    # copy_, which on a busy machine waits for a second thread
    torch.set_num_threads(1)
    results = []
    for env_id in config.env:
        progress(f"{env_id} ...")
        results.append(suite_env(env_id, 20 if config.quick else config.resets, 50 if config.quick else 300))
    return {"machine": machine(), "suite_envs": results}
