"""bench_policy: per-chunk latency of policy and critic, serial vs two lanes, graph vs eager.

Side by side in one run (interleaved rounds): the policy's `act` (encoders + K
Euler steps), the critic's `evaluate`, both serially on one lane, and both on the
two lanes of a `TwoLaneContext`. On a GPU also the same policy eager vs captured
as one CUDA graph. Parameters and checkpoint sizes are reported too.

The measurements are `benchmarks/policy.py`'s; this command prints them and writes its section into the `--docs` file.
"""

from __future__ import annotations

import torch
from rich.table import Table

from capsule_rollout.benchmarks.policy import measure
from capsule_rollout.benchmarks.support import update_markdown_section
from capsule_rollout.commands.configs import BenchPolicyConfig
from capsule_rollout.commands.result import ExperimentResult
from capsule_rollout.experiments.console import make_console
from capsule_rollout.experiments.paths import resolve_input


def markdown(summary: dict) -> str:
    m = summary["machine"]
    lines = [
        f"Device: **{summary['device']}** ({m.get('gpu') or m['cpu']}), torch {m['torch']}. "
        f"Policy {summary['sizes']['policy_parameters'] / 1e6:.2f} M parameters "
        f"({_mb(summary['sizes']['policy_checkpoint_bytes'])}), critic "
        f"{summary['sizes']['critic_parameters'] / 1e6:.2f} M ({_mb(summary['sizes']['critic_checkpoint_bytes'])}); "
        f"batch 1, one 64x64 camera, K = {summary['denoise_steps']} Euler steps, chunk of {summary['chunk_length']}.",
        "",
        "| torch threads | policy act (median / p99 us) | critic (median / p99 us) | serial | two lanes | "
        "two lanes / slower | serial / slower | policy eager (not traced, not captured) | "
        "eager / runtime (TorchScript on the CPU, CUDA graph on a GPU) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for threads, r in summary["lanes"].items():
        lines.append(
            f"| {threads} | {r['policy']['median']:.0f} / {r['policy']['p99']:.0f} | "
            f"{r['critic']['median']:.0f} / {r['critic']['p99']:.0f} | {r['serial']['median']:.0f} | "
            f"{r['two_lane']['median']:.0f} | {r['two_lane_over_slower']:.2f}x | {r['serial_over_slower']:.2f}x | "
            f"{r['policy_eager']['median']:.0f} | {r['eager_over_traced']:.2f}x |"
        )
    g = summary.get("graph")
    lines.append("")
    if g:
        lines.append(f"CUDA graph vs eager (policy act): eager {g['eager']['median']:.0f} us, captured "
                     f"{g['cuda_graph']['median']:.0f} us, **{g['speedup']:.1f}x**; chunks bit-identical: {g['bit_exact']}.")
    else:
        lines.append("CUDA graph vs eager: not measured (no GPU in this run). On the CPU the runtimes run the "
                     "network traced to TorchScript (same ops, bit-identical, no GIL), compared with eager above.")
    lines += ["", "Targets:"]
    for name, ok in summary["targets"].items():
        lines.append(f"- {name}: {'met' if ok else 'NOT met' if ok is not None else 'not measured'}")
    return "\n".join(lines)


def _mb(n: int | None) -> str:
    return f"{n / 1e6:.1f} MB checkpoint" if n else "no checkpoint"


def run(config: BenchPolicyConfig) -> ExperimentResult:
    console = make_console()
    if config.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but no CUDA device is visible; use --device cpu or auto")
    use_cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if use_cuda else "cpu")
    summary = measure(config, device, resolve_input(config.policy), resolve_input(config.critic), console.print)
    lanes, graph = summary["lanes"], summary["graph"]
    table = Table(title=f"policy / critic per chunk on {device} (median us)")
    for col in ("threads", "policy", "critic", "serial", "two lanes", "two lanes / slower"):
        table.add_column(col, justify="right")
    for threads, r in lanes.items():
        table.add_row(threads, f"{r['policy']['median']:.0f}", f"{r['critic']['median']:.0f}",
                      f"{r['serial']['median']:.0f}", f"{r['two_lane']['median']:.0f}", f"{r['two_lane_over_slower']:.2f}x")
    console.print(table)
    if graph:
        console.print(f"CUDA graph {graph['cuda_graph']['median']:.0f} us vs eager {graph['eager']['median']:.0f} us "
                      f"({graph['speedup']:.1f}x), bit-exact {graph['bit_exact']}")
    if config.docs:
        update_markdown_section(config.docs, "bench_policy", markdown(summary))
        console.print(f"results written to {config.docs}")
    return ExperimentResult(summary)
