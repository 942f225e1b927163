"""verify_capsule: the bit-exactness report for every capsule-bearing component; with `--env`, that env's
adapter under the harness's checks and in the scenarios rollouts put it through (`envs.env_scenarios`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from rich.markup import escape
from rich.table import Table

from capsule_rollout.capsules import Steppable, VerifyReport, digest_backend, verify_steppable
from capsule_rollout.capsules.reference_components import CombinedStandIn, NoisyChunkSteppable, NumpyWalkerSteppable
from capsule_rollout.cli.console import make_console
from capsule_rollout.cli.paths import resolve_input
from capsule_rollout.commands.configs import VerifyCapsuleConfig
from capsule_rollout.commands.result import ExperimentResult, checking_inputs
from capsule_rollout.envs.env_scenarios import SCENARIOS, ScenarioReport, verify_scenarios
from capsule_rollout.models.checkpoint import META_FILE
from capsule_rollout.tabletop.critic_steppable import CriticSteppable
from capsule_rollout.tabletop.env_steppable import TabletopSteppable
from capsule_rollout.tabletop.flow_policy import FlowPolicy, load_policy
from capsule_rollout.tabletop.policy_steppable import PolicySteppable
from capsule_rollout.tabletop.rollout_steppable import RolloutSteppable
from capsule_rollout.tabletop.tasks import FAMILY_NAMES
from capsule_rollout.tabletop.value_critic import ValueCritic, load_critic


def _devices(config: VerifyCapsuleConfig) -> list[str]:
    has_cuda = torch.cuda.is_available()
    if config.device == "cuda" and not has_cuda:
        raise SystemExit("error: --device cuda but no CUDA device is visible; use --device cpu or auto")
    if config.device == "cpu":
        return ["cpu"]
    if config.device == "cuda":
        return ["cuda"]
    return ["cpu", "cuda"] if has_cuda else ["cpu"]


def targets(config: VerifyCapsuleConfig) -> list[Callable[[], Steppable]]:
    """Factories of every component verified; each later package adds its own here. With `--env`, that env's
    adapter alone."""
    if config.env:
        from capsule_rollout.envs.mujoco_capsule_steppable import MujocoCapsuleSteppable
        from capsule_rollout.envs.suites import make_env

        # a bad id or a missing suite: a usage error now
        make_env(config.env, cameras=config.cameras, image_size=config.image_size).close()
        return [lambda: MujocoCapsuleSteppable(config.env, cameras=config.cameras, image_size=config.image_size)]
    found: list[Callable[[], Steppable]] = []
    for device in _devices(config):
        found.append(lambda device=device: NoisyChunkSteppable(device))
    found += [NumpyWalkerSteppable, CombinedStandIn]
    # the env with both cameras: images must come back bit for bit too
    found += [lambda family=family: TabletopSteppable(family) for family in FAMILY_NAMES]
    # the shipped policy and critic when present (weights do not change what is checked)
    # one model per kind, shared by every instance the harness builds (a fork needs equal weights)
    torch.manual_seed(config.seed)
    policy_dir, critic_dir = resolve_input(config.model.policy), resolve_input(config.model.critic)
    policy = load_policy(policy_dir) if (Path(policy_dir) / META_FILE).exists() else FlowPolicy()
    critic = load_critic(critic_dir) if (Path(critic_dir) / META_FILE).exists() else ValueCritic()
    for device in _devices(config):
        found.append(lambda device=device: PolicySteppable(policy, device=device))
        found.append(lambda device=device: CriticSteppable(critic, device=device))
    # the whole rollout boundary as one component: env + policy + critic + host state + hand-off
    for device in _devices(config):
        found.append(lambda device=device: RolloutSteppable(policy, critic, device=device))
    return found


def report_table(reports: list[VerifyReport]) -> Table:
    table = Table(title="capsule bit-exactness")
    for col in ("component", "device", "bit_exact", "max_abs_diff", "cosine", "capsule_bytes", "failures"):
        table.add_column(col)
    for r in reports:
        table.add_row(
            escape(r.name), r.device, "[green]yes[/]" if r.bit_exact else "[red]NO[/]", f"{r.max_abs_diff:.3g}",
            f"{r.cosine:.6f}", str(r.capsule_bytes), escape("; ".join(r.failures)) or "-",
        )
    return table


def scenario_table(report: ScenarioReport) -> Table:
    table = Table(title=f"{escape(report.env)} as rollouts use its capsule")
    for col in ("scenario", "bit_exact", "first divergence"):
        table.add_column(col)
    for name in SCENARIOS:
        ok = report.checks.get(name)
        why = report.errors.get(name) or report.divergences.get(name) or "-"
        table.add_row(name, "[green]yes[/]" if ok else "[red]NO[/]", escape(why))
    for name, why in report.errors.items():
        if name not in SCENARIOS:
            table.add_row(name, "[red]NO[/]", escape(why))
    return table


def run(config: VerifyCapsuleConfig) -> ExperimentResult:
    with checking_inputs():
        factories = targets(config)
    reports = [verify_steppable(f, steps=config.steps, warmup=config.warmup, seed=config.seed) for f in factories]
    make_console().print(report_table(reports))
    all_exact = all(r.bit_exact for r in reports)
    scenarios = None
    if config.env:
        scenarios = verify_scenarios(config.env, cameras=config.cameras, image_size=config.image_size,
                                     seed=config.seed, steps=config.steps)
        make_console().print(scenario_table(scenarios))
        all_exact &= scenarios.ok
    components = [
        {k: v for k, v in r.to_json().items() if k in ("name", "bit_exact", "max_abs_diff", "cosine", "capsule_bytes")}
        | {"device": r.device, "checks": r.checks, "failures": r.failures}
        for r in reports
    ]
    # which digest backend checked each device's capsules, and why (Triton on CUDA when a first launch works)
    backends = {d: digest_backend(d).to_json() for d in _devices(config)}
    for device, choice in backends.items():
        make_console().print(f"digests on {device}: {choice['backend']} ({escape(choice['reason'])})")
    summary = {"components": components, "all_bit_exact": all_exact, "digest_backends": backends}
    if scenarios is not None:
        summary["scenarios"] = scenarios.to_json()
    return ExperimentResult(summary, exit_code=0 if all_exact else 1)
