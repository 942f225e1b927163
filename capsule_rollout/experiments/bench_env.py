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

The measurements are `benchmarks/env.py`'s; this command prints them and writes its section into the `--docs` file.
"""

from __future__ import annotations

from rich.table import Table

from capsule_rollout.benchmarks.env import measure, measure_suite_envs
from capsule_rollout.benchmarks.support import update_markdown_section
from capsule_rollout.commands.configs import BenchEnvConfig
from capsule_rollout.commands.result import ExperimentResult, checking_inputs
from capsule_rollout.experiments.console import make_console


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


def suite_markdown(results: list[dict]) -> str:
    r0 = results[0]
    lines = [
        f"Suite envs through the capsule adapter (`MujocoCapsuleEnv`), mujoco {r0['mujoco']}, state only, "
        f"{r0['reset_seed']['n']} paired rounds, one torch thread (as each rollout actor runs); other work "
        "shared the machine's 2 cores while this ran.",
        "`restore` is `capsules.restore` of the env's arena (the library's checks, one slab copy, the adapter's "
        "hook); `hook` is the adapter's `after_restore` alone; `usual` restores the same state the usual way "
        "(`mj_setState` + `mj_forward`, generator state dicts, attribute copies)."
        + (" Envs marked (graph) are captured with nothing declared (their whole Python object graph is in the "
           "capsule); for them `usual` restores MjData alone." if any(r.get("capture") == "graph" for r in results)
           else ""),
        "",
        "| env | reset(seed) median / p99 us | restore median / p99 us | hook median us | usual median us "
        "| reset / restore | reset / hook | capsule bytes | steps/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| `{r['env']}`{' (graph)' if r.get('capture') == 'graph' else ''} | "
            f"{r['reset_seed']['median']:.0f} / {r['reset_seed']['p99']:.0f} | "
            f"{r['restore']['median']:.1f} / {r['restore']['p99']:.1f} | {r['restore_hook']['median']:.1f} | "
            f"{r['usual_restore']['median']:.1f} | {r['reset_over_restore']:.1f}x | "
            f"{r['reset_seed']['median'] / r['restore_hook']['median']:.1f}x | {r['capsule_bytes']} | "
            f"{r['steps_per_s']:.0f} |")
    return "\n".join(lines)


def run_suite_envs(config: BenchEnvConfig) -> ExperimentResult:
    import mujoco

    console = make_console()
    summary = measure_suite_envs(config, console.print)
    results = summary["suite_envs"]
    table = Table(title=f"bench_env: suite envs (mujoco {mujoco.__version__})")
    for col in ("env", "reset(seed) us", "restore us", "hook us", "usual us", "reset/restore", "capsule bytes"):
        table.add_column(col)
    for r in results:
        table.add_row(r["env"], f"{r['reset_seed']['median']:.0f}", f"{r['restore']['median']:.1f}",
                      f"{r['restore_hook']['median']:.1f}", f"{r['usual_restore']['median']:.1f}",
                      f"{r['reset_over_restore']:.1f}x", str(r["capsule_bytes"]))
    console.print(table)
    if config.docs:
        name = f"bench_suite_envs_mujoco{mujoco.__version__.replace('.', '')}" + (
            f"_{config.section}" if config.section else "")
        update_markdown_section(config.docs, name, suite_markdown(results))
        console.print(f"results written to {config.docs} ({name})")
    return ExperimentResult(summary)


def run(config: BenchEnvConfig) -> ExperimentResult:
    if config.env:
        with checking_inputs():
            from capsule_rollout.envs.suites import make_env

            for env_id in config.env:
                make_env(env_id, cameras=()).close()
        return run_suite_envs(config)
    console = make_console()
    summary = measure(config, console.print)
    stepping, resets, recorders = summary["stepping"], summary["reset"], summary["recorders"]
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
