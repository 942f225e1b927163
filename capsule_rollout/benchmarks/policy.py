"""bench_policy's measurements (what they compare: `experiments/bench_policy.py`): per-chunk latency of policy
and critic, serial vs two lanes, traced or captured vs eager."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from capsule_rollout.benchmarks.support import machine, stats_us, timed
from capsule_rollout.capsules import Arena
from capsule_rollout.commands.configs import BenchPolicyConfig
from capsule_rollout.models.checkpoint import WEIGHTS_FILE
from capsule_rollout.policies.execution_context import TwoLaneContext
from capsule_rollout.tabletop.critic_runtime import CriticRuntime
from capsule_rollout.tabletop.flow_policy import FlowPolicy, load_policy
from capsule_rollout.tabletop.policy_runtime import PolicyRuntime
from capsule_rollout.tabletop.value_critic import ValueCritic, load_critic

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
            progress: Callable[[str], object] = lambda _: None) -> dict:
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
