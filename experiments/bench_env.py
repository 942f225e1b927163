"""bench_env: env stepping speed, reset vs capsule restore, recorder throughput and caller wait.

Side by side in one run:
  steps/s   blocks of 100 random-action control steps, state-only and with one
            camera, interleaved;
  reset     `env.reset(seed)` (which renders the first observation) against a
            capsule restore of the same initial state, alone and followed by
            `observe()` (the same work a reset returns);
  recorders the same expert episodes written as .npz files (the caller waits for
            the disk) and appended to a zarr store (writer thread): MB/s of raw
            episode bytes, and the time the recording loop's caller spends per
            step (building the episode + handing it over).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
from rich.table import Table

from capsules import Arena, restore, snapshot
from envs.scripted_expert import ScriptedExpert
from envs.tabletop_env import TabletopEnv
from benchmarks.support import machine, stats_us, timed, update_markdown_section
from commands.configs import BenchEnvConfig
from experiments.console import make_console
from commands.result import ExperimentResult, checking_inputs
from rollout.demo_collector import record_episode
from rollout.episode import EpisodeBuilder
from rollout.npz_recorder import NpzRecorder
from rollout.zarr_recorder import ZarrRecorder

CPU = __import__("torch").device("cpu")


def _stepping(config: BenchEnvConfig, blocks: int) -> dict:
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


def _resets(config: BenchEnvConfig, rounds: int) -> dict:
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


def _recorders(config: BenchEnvConfig, n: int, directory: Path) -> dict:
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


def markdown(summary: dict) -> str:
    m, st, rs, rc = summary["machine"], summary["stepping"], summary["reset"], summary["recorders"]
    lines = [
        f"CPU: {m['cpu']}, torch threads {m['torch_threads']}, MUJOCO_GL={summary['gl_backend']}. "
        f"Family `{summary['family']}`, control at 10 Hz (50 physics steps of 2 ms per control step).",
        "",
        "| stepping | control steps/s (median of 100-step blocks) |",
        "|---|---|",
    ]
    lines += [f"| {k.replace('_', ' ')} | {v:.0f} |" for k, v in st.items()]
    lines += [
        "",
        "| reset | median us | p90 us |",
        "|---|---|---|",
        f"| `env.reset(seed)` (renders the first observation) | {rs['reset_seed']['median']:.0f} "
        f"| {rs['reset_seed']['p90']:.0f} |",
        f"| capsule restore ({rs['capsule_bytes']} bytes) | {rs['restore']['median']:.1f} | {rs['restore']['p90']:.1f} |",
        f"| capsule restore + `observe()` | {rs['restore_observe']['median']:.0f} | {rs['restore_observe']['p90']:.0f} |",
        "",
        f"Reset by restore is **{rs['reset_over_restore']:.0f}x** faster than `reset(seed)` for the state alone.",
        "",
        f"Recorders: {rc['episodes']} expert episodes, {rc['steps']} steps, {rc['raw_mb']:.1f} MB raw "
        f"({summary['image_size']}x{summary['image_size']} front camera).",
        "",
        "| recorder | MB/s (raw bytes) | on disk MB | caller wait per step (us) |",
        "|---|---|---|---|",
        *(f"| {label} | {rc[k]['mb_s']:.1f} | {rc[k]['disk_mb']:.1f} | {rc[k]['caller_us_per_step']:.0f} |"
          for k, label in (("npz", "npz (caller writes)"), ("zarr", "zarr (writer thread)"))),
        f"| building the episode only (no recorder) | - | - | {rc['build_only_us_per_step']:.0f} |",
    ]
    return "\n".join(lines)


def _suite_env(env_id: str, rounds: int, step_count: int) -> dict:
    """One suite env, state only: `reset(seed)` against a capsule restore of the same initial state (paired
    rounds), the adapter's restore hook alone, the usual way of restoring (below), and steps/s."""
    import copy

    import mujoco

    from envs.suites import make_env

    env = make_env(env_id, cameras=())
    arena = Arena([env]).allocate()
    env.reset(seed=123)
    initial = snapshot(arena, label="initial")
    usual = _usual_restore(env, copy)
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
               reset_over_restore=out["reset_seed"]["median"] / out["restore"]["median"])
    return out


def _usual_restore(env, copy):
    """The usual way, for comparison: `mj_setState(mjSTATE_INTEGRATION)` + `mj_forward`, each generator's
    `bit_generator.state` dict, attributes set from copies (not bit-exact where an env reads derived data)."""
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


def suite_markdown(results: list[dict]) -> str:
    r0 = results[0]
    lines = [
        f"Suite envs through the capsule adapter (`MujocoCapsuleEnv`), mujoco {r0['mujoco']}, state only, "
        f"{r0['reset_seed']['n']} paired rounds, one torch thread (as each rollout actor runs); other work "
        "shared the machine's 2 cores while this ran.",
        "`restore` is `capsules.restore` of the env's arena (the library's checks, one slab copy, the adapter's "
        "hook); `hook` is the adapter's `after_restore` alone; `usual` restores the same state the usual way "
        "(`mj_setState` + `mj_forward`, generator state dicts, attribute copies).",
        "",
        "| env | reset(seed) median / p99 us | restore median / p99 us | hook median us | usual median us "
        "| reset / restore | reset / hook | capsule bytes | steps/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| `{r['env']}` | {r['reset_seed']['median']:.0f} / {r['reset_seed']['p99']:.0f} | "
            f"{r['restore']['median']:.1f} / {r['restore']['p99']:.1f} | {r['restore_hook']['median']:.1f} | "
            f"{r['usual_restore']['median']:.1f} | {r['reset_over_restore']:.1f}x | "
            f"{r['reset_seed']['median'] / r['restore_hook']['median']:.1f}x | {r['capsule_bytes']} | "
            f"{r['steps_per_s']:.0f} |")
    return "\n".join(lines)


def run_suite_envs(config: BenchEnvConfig) -> ExperimentResult:
    import mujoco
    import torch

    # one torch thread, as each rollout actor runs (HostSpec.threads): the slab copy of a restore is a torch
    # copy_, which on a busy machine waits for a second thread
    torch.set_num_threads(1)
    console = make_console()
    results = []
    for env_id in config.env:
        console.print(f"{env_id} ...")
        results.append(_suite_env(env_id, 20 if config.quick else config.resets, 50 if config.quick else 300))
    table = Table(title=f"bench_env: suite envs (mujoco {mujoco.__version__})")
    for col in ("env", "reset(seed) us", "restore us", "hook us", "usual us", "reset/restore", "capsule bytes"):
        table.add_column(col)
    for r in results:
        table.add_row(r["env"], f"{r['reset_seed']['median']:.0f}", f"{r['restore']['median']:.1f}",
                      f"{r['restore_hook']['median']:.1f}", f"{r['usual_restore']['median']:.1f}",
                      f"{r['reset_over_restore']:.1f}x", str(r["capsule_bytes"]))
    console.print(table)
    if config.docs:
        name = f"bench_suite_envs_mujoco{mujoco.__version__.replace('.', '')}"
        update_markdown_section(config.docs, name, suite_markdown(results))
        console.print(f"results written to {config.docs} ({name})")
    return ExperimentResult({"machine": machine(), "suite_envs": results})


def run(config: BenchEnvConfig) -> ExperimentResult:
    import os

    if config.env:
        with checking_inputs():
            from envs.suites import make_env

            for env_id in config.env:
                make_env(env_id, cameras=()).close()
        return run_suite_envs(config)
    console = make_console()
    quick = config.quick
    console.print("stepping ...")
    stepping = _stepping(config, 4 if quick else config.step_blocks)
    console.print("reset vs restore ...")
    resets = _resets(config, 20 if quick else config.resets)
    console.print("recorders ...")
    with tempfile.TemporaryDirectory(dir=config.out_dir or None) as tmp:
        recorders = _recorders(config, 3 if quick else config.episodes, Path(tmp))
    summary = {
        "machine": machine(),
        "gl_backend": os.environ.get("MUJOCO_GL"),
        "family": config.family,
        "image_size": config.image_size,
        "quick": quick,
        "stepping": stepping,
        "reset": resets,
        "recorders": recorders,
    }
    table = Table(title="bench_env")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for k, v in stepping.items():
        table.add_row(f"steps/s {k}", f"{v:.0f}")
    table.add_row("reset(seed) median us", f"{resets['reset_seed']['median']:.0f}")
    table.add_row("capsule restore median us", f"{resets['restore']['median']:.1f}")
    table.add_row("restore + observe median us", f"{resets['restore_observe']['median']:.0f}")
    table.add_row("reset / restore", f"{resets['reset_over_restore']:.0f}x")
    for name in ("npz", "zarr"):
        table.add_row(f"{name} MB/s", f"{recorders[name]['mb_s']:.1f}")
        table.add_row(f"{name} caller us/step", f"{recorders[name]['caller_us_per_step']:.0f}")
    console.print(table)
    if config.docs:
        update_markdown_section(config.docs, "bench_env", markdown(summary))
        console.print(f"results written to {config.docs}")
    return ExperimentResult(summary)
