"""bench_lerobot_policy: LeRobot policies in the host, where LeRobot is installed (`make lerobot-venv`).

1. Per network call and per step: the adapter (`LeRobotPolicy`) against the same network called as LeRobot's own
   evaluation calls it (processors and `select_action`), batch 1, one torch thread.
2. Env slots: steps/s of N slots served by one model against one slot, the same seeds and episodes.

The measurements are `benchmarks/lerobot_policy.py`'s; this command prints them and writes its section into `--docs`.
"""

from __future__ import annotations

from capsule_rollout.benchmarks.lerobot_policy import measure
from capsule_rollout.benchmarks.support import update_markdown_section
from capsule_rollout.commands.bench_configs import BenchLeRobotPolicyConfig
from capsule_rollout.commands.result import ExperimentResult, checking_inputs
from capsule_rollout.experiments.console import make_console, measure_table
from capsule_rollout.experiments.paths import resolve_input
from capsule_rollout.rollout.plug_in import describe_source


def run(config: BenchLeRobotPolicyConfig) -> ExperimentResult:
    console = make_console()
    with checking_inputs():
        if not config.policies:
            raise ValueError("--policies: give one or more LeRobot policy directories (lerobot-train writes "
                             "<output_dir>/checkpoints/last/pretrained_model)")
        for path in config.policies:
            describe_source(resolve_input(path))  # a directory that is no LeRobot policy: refused here
    summary = measure(config, console.print)
    rows = [(a, f"{b} ({c})" if c else b, "") for a, b, c in _rows(summary)]
    console.print(measure_table("bench_lerobot_policy (one torch thread)", rows))
    if config.docs:
        update_markdown_section(config.docs, "bench_lerobot_policy", _markdown(summary))
    return ExperimentResult(summary)


def _rows(s: dict) -> list[tuple[str, str, str]]:
    rows = []
    for p in s["policies"]:
        a, d, sl = p["adapter"], p["direct"], p["slots"]
        name = f"{p['type']} ({p['parameters'] / 1e6:.1f} M parameters, {p['n_obs_steps']} obs, " \
               f"{p['n_action_steps']} actions a call)"
        rows += [
            (f"{name}: network call, direct / adapter", f"{d['call_ms']:.1f} / {a['call_ms']:.1f} ms",
             f"{p['call_ratio']:.2f}x"),
            (f"{name}: queued step, direct / adapter", f"{d['step_ms']:.3f} / {a['step_ms']:.3f} ms", ""),
            (f"{name}: 1 slot / {sl['slots']} slots ({sl['mode']}, {sl['instances']} model)",
             f"{sl['steps_per_s']['one']:.0f} / {sl['steps_per_s']['slots']:.0f} steps/s", f"{sl['ratio']:.2f}x"),
            (f"{name}: network calls per control step, 1 slot / {sl['slots']} slots",
             f"{sl['calls_per_step']['one']:.3f} / {sl['calls_per_step']['slots']:.3f}", ""),
        ]
    return rows


def _markdown(s: dict) -> str:
    m = s["machine"]
    lines = [f"Device: **cpu** ({m.get('cpu', '?')}), torch {m.get('torch', '?')}, one torch thread; {s['rounds']} "
             f"rounds of {s['calls']} network calls per method, medians; steps/s over "
             f"{s['policies'][0]['slots']['episodes']} pick_place episodes of at most "
             f"{s['policies'][0]['slots']['max_steps']} steps per host and round.", "",
             "| measure | value | ratio |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in _rows(s)]
    return "\n".join(lines)
