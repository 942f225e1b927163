"""bench_rollout: the rollout layer's costs, each pair measured side by side in one run.

1. Episode reset: restoring the seed's initial capsule vs a cold reset (build the
   env, load both checkpoints, reset, first inference), interleaved rounds.
2. Control loop: steps/s of the same episode (same seed, restored: identical work)
   with recording on (EpisodeBuilder + zarr writer thread) and off, alternating.
3. Loop overhead: the host (serial lanes, and two lanes) against a plain hand-written
   loop over the same env, policy and critic objects (policy and critic called one after
   the other, same seeds, same noise: the episodes are checked identical), steps/s of
   the control loop in paired rounds (order shuffled per round); the ratio per round.
4. Throughput: 1 vs 2 Ray actors (warmed up), episodes split between them.
5. Hand-off: publish -> visible latency of the subtask channel, reader spinning,
   in-process (threads) and cross-process (shared memory, a spawned writer).

The measurements are `benchmarks/rollout.py`'s; this command prints them and writes its section into the `--docs` file.
"""

from __future__ import annotations

from capsule_rollout.benchmarks.rollout import host_spec, measure
from capsule_rollout.benchmarks.support import update_markdown_section
from capsule_rollout.commands.configs import BenchRolloutConfig
from capsule_rollout.commands.result import ExperimentResult
from capsule_rollout.experiments.console import make_console, measure_table
from capsule_rollout.experiments.paths import resolve_input


def run(config: BenchRolloutConfig) -> ExperimentResult:
    console = make_console()
    spec = host_spec(config, resolve_input(config.policy), resolve_input(config.critic))
    summary = measure(config, spec, console.print)
    body = _markdown(summary)
    console.print(measure_table("bench_rollout", _rows(summary)))
    if config.docs:
        update_markdown_section(config.docs, "bench_rollout", body)
    return ExperimentResult(summary)


def _rows(s: dict) -> list[tuple[str, str, str]]:
    r, rec, h, sc, lo = s["reset"], s["recording"], s["handoff"], s["scaling"], s["loop"]
    rows = [
        ("reset: capsule restore (median / p99)", f"{r['restore_us']['median']:.0f} / {r['restore_us']['p99']:.0f} µs", ""),
        ("reset: cold (env + weights + first inference)", f"{r['cold_us']['median'] / 1e3:.0f} ms", ""),
        ("reset speed-up", f"{r['speedup']:.0f}x", "≥ 100x"),
        ("control loop, recording off", f"{rec['off_steps_per_s']:.0f} steps/s", ""),
        ("control loop, recording on (zarr)", f"{rec['on_steps_per_s']:.0f} steps/s", ""),
        ("recording slowdown", f"{(rec['slowdown'] - 1) * 100:+.1f}%", "≤ +5%"),
        ("hand-written loop (policy, critic, env; same objects and seeds)", f"{lo['hand_steps_per_s']:.0f} steps/s", ""),
        ("host, serial lanes", f"{lo['serial_steps_per_s']:.0f} steps/s", ""),
        ("host, two lanes", f"{lo['two_steps_per_s']:.0f} steps/s", ""),
        ("host (serial lanes) / hand-written loop, median of rounds", f"{lo['serial_over_hand']:.3f}", "≥ 0.97"),
        ("host (two lanes) / hand-written loop, median of rounds", f"{lo['two_over_hand']:.3f}", ""),
        ("hand-off in-process (median / p99)",
         f"{h['in_process_us']['median']:.1f} / {h['in_process_us']['p99']:.1f} µs", ""),
        ("hand-off cross-process (median / p99)",
         f"{h['cross_process_us']['median']:.1f} / {h['cross_process_us']['p99']:.1f} µs", ""),
    ]
    for mode, label in (("free", "unpinned"), ("pinned", "one core per actor")):
        if sc:
            r = sc[mode]
            rows += [(f"1 actor ({label})", f"{r['one_actor_steps_per_s']:.0f} steps/s", ""),
                     (f"2 actors ({label})", f"{r['two_actors_steps_per_s']:.0f} steps/s", ""),
                     (f"scaling ({label})", f"{r['scaling']:.2f}x", "≥ 1.8x")]
    return rows


def _markdown(s: dict) -> str:
    m = s["machine"]
    lines = [f"Device: **cpu** ({m.get('cpu', '?')}), torch {m.get('torch', '?')}, one torch thread per host.", "",
             "| measure | value | target |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in _rows(s)]
    met = {k: ("met" if v else "not met" if v is not None else "not measured") for k, v in s["targets"].items()}
    lines += ["", "Targets: " + ", ".join(f"{k}: {v}" for k, v in met.items())]
    return "\n".join(lines)
