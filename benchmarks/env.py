"""Env steps/s (state-only, rendered), reset(seed) vs capsule restore, recorder MB/s and caller wait.

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
With `--env`, suite envs instead: `reset(seed)` against a capsule restore, the adapter's restore hook and the usual
way of restoring, capsule bytes and steps/s (the section bench_suite_envs_mujoco<version>[_<section>]).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from benchmarks import harness
from benchmarks.report import Block, Table, publish
from benchmarks.timing import machine, stats_us, timed
from capsule_rollout.capsules import Arena, restore, snapshot
from capsule_rollout.commands.result import ExperimentResult, checking_inputs
from capsule_rollout.learning.options import FAMILIES
from capsule_rollout.rollout.demo_collector import record_episode
from capsule_rollout.stores.episode import EpisodeBuilder
from capsule_rollout.stores.npz_recorder import NpzRecorder
from capsule_rollout.stores.zarr_recorder import ZarrRecorder
from capsule_rollout.tabletop.scripted_expert import ScriptedExpert
from capsule_rollout.tabletop.tabletop_env import TabletopEnv


@dataclass(frozen=True)
class BenchEnvConfig:
    family: FAMILIES = "pick_place"
    """Task family measured."""
    env: tuple[str, ...] = ()
    """Suite envs to measure instead (`reset(seed)` vs capsule restore, capsule bytes, steps/s), e.g.
    gymnasium:Ant-v5 metaworld:pick-place-v3; `--docs` then writes the bench_suite_envs section."""
    image_size: int = 64
    """Square camera image size for the rendered measurements."""
    step_blocks: int = 30
    """Interleaved blocks of 100 control steps for each stepping mode."""
    resets: int = 300
    """Interleaved rounds of reset(seed) vs capsule restore."""
    episodes: int = 30
    """Expert episodes recorded for the recorder measurements."""
    quick: bool = False
    """Fewer rounds (a smoke run)."""
    docs: str = ""
    """Markdown file whose bench_env section is replaced by the results; empty: none."""
    section: str = ""
    """With --env: a name appended to the docs section's (one per mujoco version), so that several sets of
    envs keep tables of their own."""
    out_dir: str = ""
    """Directory for the recorder measurements; empty means a fresh temporary directory."""

    def __post_init__(self) -> None:
        if min(self.step_blocks, self.resets, self.episodes) < 2:
            raise ValueError("--step_blocks, --resets and --episodes must be >= 2")


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


def measure(config: BenchEnvConfig, progress: Callable[[str], object] = print) -> dict:
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


def measure_suite_envs(config: BenchEnvConfig, progress: Callable[[str], object] = print) -> dict:
    """`suite_env` for every env of `config.env` (fewer rounds and steps with `--quick`) on one torch thread,
    and the machine; `progress` is told which env starts."""
    # one torch thread, as each rollout actor runs (RunSpec.threads): the slab copy of a restore is a torch
    # copy_, which on a busy machine waits for a second thread
    torch.set_num_threads(1)
    results = []
    for env_id in config.env:
        progress(f"{env_id} ...")
        results.append(suite_env(env_id, 20 if config.quick else config.resets, 50 if config.quick else 300))
    return {"machine": machine(), "suite_envs": results}


def report(summary: dict) -> list[Block]:
    m, st, rs, rc = summary["machine"], summary["stepping"], summary["reset"], summary["recorders"]
    recorders = [(label, f"{rc[k]['mb_s']:.1f}", f"{rc[k]['disk_mb']:.1f}", f"{rc[k]['caller_us_per_step']:.0f}")
                 for k, label in (("npz", "npz (caller writes)"), ("zarr", "zarr (writer thread)"))]
    return [
        f"CPU: {m['cpu']}, torch threads {m['torch_threads']}, MUJOCO_GL={summary['gl_backend']}. "
        f"Family `{summary['family']}`, control at 10 Hz (50 physics steps of 2 ms per control step).",
        Table(("stepping", "control steps/s (median of 100-step blocks)"),
              [(k.replace("_", " "), f"{v:.0f}") for k, v in st.items()], title="bench_env: stepping"),
        Table(("reset", "median us", "p90 us"), [
            ("`env.reset(seed)` (renders the first observation)", f"{rs['reset_seed']['median']:.0f}",
             f"{rs['reset_seed']['p90']:.0f}"),
            (f"capsule restore ({rs['capsule_bytes']} bytes)", f"{rs['restore']['median']:.1f}",
             f"{rs['restore']['p90']:.1f}"),
            ("capsule restore + `observe()`", f"{rs['restore_observe']['median']:.0f}",
             f"{rs['restore_observe']['p90']:.0f}")], title="bench_env: reset"),
        f"Reset by restore is **{rs['reset_over_restore']:.0f}x** faster than `reset(seed)` for the state alone.",
        f"Recorders: {rc['episodes']} expert episodes, {rc['steps']} steps, {rc['raw_mb']:.1f} MB raw "
        f"({summary['image_size']}x{summary['image_size']} front camera).",
        Table(("recorder", "MB/s (raw bytes)", "on disk MB", "caller wait per step (us)"),
              [*recorders, ("building the episode only (no recorder)", "-", "-", f"{rc['build_only_us_per_step']:.0f}")],
              title="bench_env: recorders"),
    ]


def suite_report(results: list[dict]) -> list[Block]:
    r0 = results[0]
    rows = [(f"`{r['env']}`{' (graph)' if r.get('capture') == 'graph' else ''}",
             f"{r['reset_seed']['median']:.0f} / {r['reset_seed']['p99']:.0f}",
             f"{r['restore']['median']:.1f} / {r['restore']['p99']:.1f}", f"{r['restore_hook']['median']:.1f}",
             f"{r['usual_restore']['median']:.1f}", f"{r['reset_over_restore']:.1f}x",
             f"{r['reset_seed']['median'] / r['restore_hook']['median']:.1f}x", str(r["capsule_bytes"]),
             f"{r['steps_per_s']:.0f}") for r in results]
    return [
        f"Suite envs through the capsule adapter (`MujocoCapsuleEnv`), mujoco {r0['mujoco']}, state only, "
        f"{r0['reset_seed']['n']} paired rounds, one torch thread (as each rollout actor runs); other work "
        "shared the machine's 2 cores while this ran.\n"
        "`restore` is `capsules.restore` of the env's arena (the library's checks, one slab copy, the adapter's "
        "hook); `hook` is the adapter's `after_restore` alone; `usual` restores the same state the usual way "
        "(`mj_setState` + `mj_forward`, generator state dicts, attribute copies)."
        + (" Envs marked (graph) are captured with nothing declared (their whole Python object graph is in the "
           "capsule); for them `usual` restores MjData alone." if any(r.get("capture") == "graph" for r in results)
           else ""),
        Table(("env", "reset(seed) median / p99 us", "restore median / p99 us", "hook median us", "usual median us",
               "reset / restore", "reset / hook", "capsule bytes", "steps/s"), rows,
              title=f"bench_env: suite envs (mujoco {r0['mujoco']})"),
    ]


def run(config: BenchEnvConfig) -> ExperimentResult:
    if config.env:
        import mujoco

        with checking_inputs():
            from capsule_rollout.envs.suites import make_env

            for env_id in config.env:
                make_env(env_id, cameras=()).close()
        summary = measure_suite_envs(config)
        section = f"bench_suite_envs_mujoco{mujoco.__version__.replace('.', '')}" + (
            f"_{config.section}" if config.section else "")
        publish(section, suite_report(summary["suite_envs"]), config.docs)
        return ExperimentResult(summary)
    summary = measure(config)
    publish("bench_env", report(summary), config.docs)
    return ExperimentResult(summary)


def main(argv: list[str] | None = None) -> int:
    return harness.main(BenchEnvConfig(), run, "benchmarks.env", __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
