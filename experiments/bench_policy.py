"""bench_policy: per-chunk latency of policy and critic, serial vs two lanes, graph vs eager.

Side by side in one run (interleaved rounds): the policy's `act` (encoders + K
Euler steps), the critic's `evaluate`, both serially on one lane, and both on the
two lanes of a `TwoLaneContext`. On a GPU also the same policy eager vs captured
as one CUDA graph. Parameters and checkpoint sizes are reported too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from rich.table import Table

from capsules import Arena
from critics.critic_runtime import CriticRuntime
from critics.value_critic import ValueCritic, load_critic
from benchmarks.support import machine, stats_us, timed, update_markdown_section
from commands.configs import BenchPolicyConfig
from experiments.console import make_console
from experiments.paths import resolve_input
from commands.result import ExperimentResult
from models.checkpoint import WEIGHTS_FILE
from policies.execution_context import TwoLaneContext
from policies.flow_policy import FlowPolicy, load_policy
from policies.policy_runtime import PolicyRuntime

CONCURRENT_TARGET = 1.15  # two lanes within 1.15x the slower model alone
GRAPH_TARGET = 3.0  # captured at least 3x faster than eager on a GPU


def _models(config: BenchPolicyConfig) -> tuple[FlowPolicy, ValueCritic, dict]:
    sizes = {}
    policy_dir, critic_dir = resolve_input(config.policy), resolve_input(config.critic)
    have_policy = (Path(policy_dir) / WEIGHTS_FILE).exists()
    have_critic = (Path(critic_dir) / WEIGHTS_FILE).exists()
    policy = load_policy(policy_dir) if have_policy else FlowPolicy()
    critic = load_critic(critic_dir) if have_critic else ValueCritic()
    for name, path, have in (("policy", policy_dir, have_policy), ("critic", critic_dir, have_critic)):
        sizes[f"{name}_checkpoint_bytes"] = (Path(path) / WEIGHTS_FILE).stat().st_size if have else None
        sizes[f"{name}_source"] = path if have else "fresh (no checkpoint found)"
    sizes["policy_parameters"] = sum(p.numel() for p in policy.parameters())
    sizes["critic_parameters"] = sum(p.numel() for p in critic.parameters())
    return policy, critic, sizes


def _observation(size: int) -> dict:
    """An observation as the env gives it: the front camera's image and the state."""
    rng = np.random.default_rng(0)
    return {"image_front": rng.integers(0, 256, (size, size, 3), dtype=np.uint8),
            "state": rng.normal(size=8).astype(np.float32)}


def _lanes(policy, critic, device: torch.device, rounds: int) -> dict:
    pol = PolicyRuntime(policy, device=str(device))
    cri = CriticRuntime(critic, device=str(device))
    Arena([pol, cri]).allocate()
    # the same policy run eagerly: neither traced to TorchScript (the CPU default) nor captured (CUDA's)
    pol_eager = PolicyRuntime(policy, device=str(device), trace=False, capture=False, name="policy_eager")
    Arena([pol_eager]).allocate()
    obs = _observation(policy.config.image_size)
    for runtime in (pol, cri, pol_eager):
        runtime.set_language("pick up the red block")
    for runtime in (pol, pol_eager):
        runtime.load_observation(obs)
    cri.load_observation(obs, step=0)  # a critic with a time input reads the episode step
    ctx = TwoLaneContext(device)
    methods = {
        "policy": pol.runner,
        "critic": cri.runner,
        "serial": lambda: ctx.serial(pol.runner, cri.runner),
        "two_lane": lambda: ctx.run(pol.runner, cri.runner),
        "policy_eager": pol_eager.runner,
    }
    samples = {k: [] for k in methods}
    for _ in range(5):
        for fn in methods.values():
            fn()
    for _ in range(rounds):
        for name, fn in methods.items():
            samples[name].append(timed(fn, device))
    ctx.close()
    out = {k: stats_us(v) for k, v in samples.items()}
    slower = max(out["policy"]["median"], out["critic"]["median"])
    out["two_lane_over_slower"] = out["two_lane"]["median"] / slower
    out["serial_over_slower"] = out["serial"]["median"] / slower
    out["eager_over_traced"] = out["policy_eager"]["median"] / out["policy"]["median"]
    out["policy_mode"] = pol.runner.mode
    out["eager_mode"] = pol_eager.runner.mode
    return out


def _graph_vs_eager(policy, rounds: int) -> dict:
    device = torch.device("cuda")
    eager = PolicyRuntime(policy, device="cuda", capture=False, name="eager")
    graph = PolicyRuntime(policy, device="cuda", capture=True, name="graph")
    Arena([eager, graph]).allocate()
    obs = _observation(policy.config.image_size)
    for runtime in (eager, graph):
        runtime.set_language("pick up the red block")
        runtime.load_observation(obs)
    for _ in range(5):
        eager.runner(), graph.runner()
    samples = {"eager": [], "cuda_graph": []}
    for _ in range(rounds):
        samples["eager"].append(timed(eager.runner, device))
        samples["cuda_graph"].append(timed(graph.runner, device))
    out = {k: stats_us(v) for k, v in samples.items()}
    out["speedup"] = out["eager"]["median"] / out["cuda_graph"]["median"]
    out["bit_exact"] = bool(torch.equal(eager.buffers["chunk"], graph.buffers["chunk"]))
    return out


def markdown(summary: dict) -> str:
    m = summary["machine"]
    lines = [
        f"Device: **{summary['device']}** ({m.get('gpu') or m['cpu']}), torch {m['torch']}. "
        f"Policy {summary['sizes']['policy_parameters'] / 1e6:.2f} M parameters "
        f"({_mb(summary['sizes']['policy_checkpoint_bytes'])}), critic "
        f"{summary['sizes']['critic_parameters'] / 1e6:.2f} M ({_mb(summary['sizes']['critic_checkpoint_bytes'])}); "
        f"batch 1, one 64x64 camera, K = {summary['denoise_steps']} Euler steps, chunk of {summary['horizon']}.",
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
    rounds = 20 if config.quick else config.rounds
    policy, critic, sizes = _models(config)
    lanes = {}
    default_threads = torch.get_num_threads()
    try:
        for threads in ([default_threads] if use_cuda else config.threads):
            torch.set_num_threads(threads)
            console.print(f"timing policy and critic on {device} with {threads} torch thread(s) ...")
            lanes[str(threads)] = _lanes(policy, critic, device, rounds)
    finally:
        torch.set_num_threads(default_threads)
    graph = _graph_vs_eager(policy, rounds) if use_cuda else None
    best = min(r["two_lane_over_slower"] for r in lanes.values())
    summary = {
        "device": str(device),
        "machine": machine(),
        "sizes": sizes,
        "chunk_length": policy.config.chunk_length,
        "denoise_steps": policy.config.denoise_steps,
        "lanes": lanes,
        "graph": graph,
        "targets": {
            f"two lanes within {CONCURRENT_TARGET}x the slower model (best thread setting)": best <= CONCURRENT_TARGET,
            f"CUDA graph at least {GRAPH_TARGET}x faster than eager": (graph["speedup"] >= GRAPH_TARGET) if graph else None,
        },
    }
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
