"""Policy and critic latency per chunk, serial vs two-lane, captured vs eager on a GPU.

Side by side in one run (interleaved rounds): the policy's `act` (encoders + K
Euler steps), the critic's `evaluate`, both serially on one lane, and both on the
two lanes of a `TwoLaneContext`. On a GPU also the same policy eager vs captured
as one CUDA graph. Parameters and checkpoint sizes are reported too.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from benchmarks import harness
from benchmarks.report import Block, Table, publish, targets
from benchmarks.timing import machine, stats_us, timed
from capsule_rollout.capsules import Arena
from capsule_rollout.cli.paths import resolve_input
from capsule_rollout.commands.result import ExperimentResult
from capsule_rollout.models.checkpoint import WEIGHTS_FILE
from capsule_rollout.policies.execution_context import TwoLaneContext
from capsule_rollout.tabletop.critic_runtime import CriticRuntime
from capsule_rollout.tabletop.flow_policy import FlowPolicy, load_policy
from capsule_rollout.tabletop.policy_runtime import PolicyRuntime
from capsule_rollout.tabletop.value_critic import ValueCritic, load_critic


@dataclass(frozen=True)
class BenchPolicyConfig:
    policy: str = "checkpoints/policy"
    """Policy checkpoint (a fresh model of the default size when the directory is missing)."""
    critic: str = "checkpoints/critic"
    """Critic checkpoint (likewise)."""
    rounds: int = 300
    """Interleaved rounds; each times every method once."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto: CUDA when present, else CPU."""
    threads: tuple[int, ...] = (1, 2)
    """CPU only: torch thread counts to measure (each a separate table row)."""
    quick: bool = False
    """Few rounds (a smoke run)."""
    docs: str = ""
    """Markdown file whose bench_policy section is replaced by the results; empty: none."""

    def __post_init__(self) -> None:
        if self.rounds < 3:
            raise ValueError("--rounds must be >= 3")
        if not self.threads or min(self.threads) < 1:
            raise ValueError("--threads needs one or more positive counts")


CONCURRENT_TARGET = 1.15  # two lanes within 1.15x the slower model alone
GRAPH_TARGET = 3.0  # captured at least 3x faster than eager on a GPU


def load_models(policy_dir: str, critic_dir: str) -> tuple[FlowPolicy, ValueCritic, dict]:
    """The policy and critic of these checkpoint directories (fresh models of the default size where one has no
    weights), and their parameter counts, checkpoint bytes and sources."""
    sizes = {}
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


def lanes(policy, critic, device: torch.device, rounds: int) -> dict:
    """Policy `act`, critic `evaluate`, both serially and both on two lanes, and the policy eager, in interleaved
    rounds: statistics in us, the ratios to the slower model and to the runtime, and the runners' modes."""
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


def graph_vs_eager(policy, rounds: int) -> dict:
    """The policy eager against captured as one CUDA graph, interleaved: statistics in us, the speed-up, and
    whether the chunks are bit-identical."""
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


def measure(config: BenchPolicyConfig, device: torch.device, policy_dir: str, critic_dir: str,
            progress: Callable[[str], object] = print) -> dict:
    """`lanes` at every thread count of the config (on a GPU at the default count only; 20 rounds with `--quick`),
    `graph_vs_eager` on a GPU, the models' sizes, the machine and whether each target is met; `progress` is told
    which thread count starts."""
    use_cuda = device.type == "cuda"
    rounds = 20 if config.quick else config.rounds
    policy, critic, sizes = load_models(policy_dir, critic_dir)
    lane_stats = {}
    default_threads = torch.get_num_threads()
    try:
        for threads in ([default_threads] if use_cuda else config.threads):
            torch.set_num_threads(threads)
            progress(f"timing policy and critic on {device} with {threads} torch thread(s) ...")
            lane_stats[str(threads)] = lanes(policy, critic, device, rounds)
    finally:
        torch.set_num_threads(default_threads)
    graph = graph_vs_eager(policy, rounds) if use_cuda else None
    best = min(r["two_lane_over_slower"] for r in lane_stats.values())
    return {
        "device": str(device),
        "machine": machine(),
        "sizes": sizes,
        "chunk_length": policy.config.chunk_length,
        "denoise_steps": policy.config.denoise_steps,
        "lanes": lane_stats,
        "graph": graph,
        "targets": {
            f"two lanes within {CONCURRENT_TARGET}x the slower model (best thread setting)": best <= CONCURRENT_TARGET,
            f"CUDA graph at least {GRAPH_TARGET}x faster than eager": (graph["speedup"] >= GRAPH_TARGET) if graph else None,
        },
    }


def report(summary: dict) -> list[Block]:
    m, sizes = summary["machine"], summary["sizes"]
    rows = [(threads, f"{r['policy']['median']:.0f} / {r['policy']['p99']:.0f}",
             f"{r['critic']['median']:.0f} / {r['critic']['p99']:.0f}", f"{r['serial']['median']:.0f}",
             f"{r['two_lane']['median']:.0f}", f"{r['two_lane_over_slower']:.2f}x", f"{r['serial_over_slower']:.2f}x",
             f"{r['policy_eager']['median']:.0f}", f"{r['eager_over_traced']:.2f}x")
            for threads, r in summary["lanes"].items()]
    g = summary.get("graph")
    if g:
        graph = (f"CUDA graph vs eager (policy act): eager {g['eager']['median']:.0f} us, captured "
                 f"{g['cuda_graph']['median']:.0f} us, **{g['speedup']:.1f}x**; chunks bit-identical: {g['bit_exact']}.")
    else:
        graph = ("CUDA graph vs eager: not measured (no GPU in this run). On the CPU the runtimes run the network "
                 "traced to TorchScript (same ops, bit-identical, no GIL), compared with eager above.")
    return [
        f"Device: **{summary['device']}** ({m.get('gpu') or m['cpu']}), torch {m['torch']}. "
        f"Policy {sizes['policy_parameters'] / 1e6:.2f} M parameters ({_mb(sizes['policy_checkpoint_bytes'])}), "
        f"critic {sizes['critic_parameters'] / 1e6:.2f} M ({_mb(sizes['critic_checkpoint_bytes'])}); "
        f"batch 1, one 64x64 camera, K = {summary['denoise_steps']} Euler steps, chunk of {summary['chunk_length']}.",
        Table(("torch threads", "policy act (median / p99 us)", "critic (median / p99 us)", "serial", "two lanes",
               "two lanes / slower", "serial / slower", "policy eager (not traced, not captured)",
               "eager / runtime (TorchScript on the CPU, CUDA graph on a GPU)"), rows,
              title=f"policy / critic per chunk on {summary['device']} (us)"),
        graph,
        targets(summary["targets"]),
    ]


def _mb(n: int | None) -> str:
    return f"{n / 1e6:.1f} MB checkpoint" if n else "no checkpoint"


def run(config: BenchPolicyConfig) -> ExperimentResult:
    if config.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but no CUDA device is visible; use --device cpu or auto")
    use_cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if use_cuda else "cpu")
    summary = measure(config, device, resolve_input(config.policy), resolve_input(config.critic))
    publish("bench_policy", report(summary), config.docs)
    return ExperimentResult(summary)


def main(argv: list[str] | None = None) -> int:
    return harness.main(BenchPolicyConfig(), run, "benchmarks.policy", __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
