"""bench_recording: what recording costs the driver, single writer vs sharded, with synthetic actors.

Each actor is a `RolloutActor` whose host returns one pre-built episode (renamed per work
item) at once, so nothing but recording limits the rate: the driver, its store and Ray's
transfers. Each measurement runs `run_rollouts` (the driver `sim_rollout` uses) over
`--episodes` items on N actors, with the single-writer store (every episode travels to the
driver, which writes it) and with a sharded one (each actor writes its own shard; the driver
commits a manifest entry), each at every `--episodes_per_call` (one Ray call hands an actor that
many items; sharded, the actor commits them to its shard at once and the driver their manifest
entries in one append). Figures are taken from the first returned episode to the store's close
(actor start-up left out): recorded control steps/s, the driver process's CPU seconds
per episode (`time.process_time`: every thread of the driver, Ray's included, and the
single writer's thread), and the bytes of episode arrays that reach the driver. Images are
random bytes (incompressible: the writer's worst case).

The measurements are `benchmarks/recording.py`'s; this command prints them.
"""

from __future__ import annotations

from rich.table import Table

from capsule_rollout.benchmarks.recording import measure
from capsule_rollout.commands.configs import BenchRecordingConfig
from capsule_rollout.commands.result import ExperimentResult
from capsule_rollout.experiments.console import make_console


def run(config: BenchRecordingConfig) -> ExperimentResult:
    summary = measure(config)
    _table(summary["rows"], summary["driver_cpu_ratios"], config.rounds)
    return ExperimentResult(summary)


def _table(rows: list[dict], ratios: list[dict], rounds: int) -> None:
    table = Table(title=f"bench_recording (synthetic actors, from the first episode back to the store's close; "
                        f"medians of {rounds} rounds)")
    for name in ("actors", "episodes / call", "store", "recorded", "steps/s", "driver CPU ms / episode",
                 "MB / episode via driver"):
        table.add_column(name, justify="right")
    for r in rows:
        table.add_row(str(r["actors"]), str(r["per_call"]), r["mode"], f"{r['recorded']}/{r['episodes']}",
                      f"{r['steps_per_s']:.0f}", f"{r['driver_cpu_s_per_episode'] * 1e3:.2f}",
                      f"{r['driver_mb_per_episode']:.3f}")
    console = make_console()
    console.print(table)
    console.print("driver CPU per episode, single / sharded (same episodes per call; against the single writer at "
                  "the first episodes-per-call value): "
                  + ", ".join(f"{r['actors']} actors x {r['per_call']}: {r['same_call']:.1f}x "
                              f"({r['vs_default_single']:.1f}x)" for r in ratios))
