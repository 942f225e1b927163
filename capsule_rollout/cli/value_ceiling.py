"""value_ceiling: how well can any critic predict failure at the mid-episode step?

For every held-out seed the rollout host plays one episode, snapshotting a capsule of the
whole host (env, policy, critic, queue, hand-off) at each chunk start up to `at_step`. For
the episodes still running at `at_step`, the host branches from the capsule of the last
chunk started at or before it (`RolloutHost.branch`: restore, reseed the policy's noise,
play to the end) `branches` times, each with a fresh noise seed; the fraction of branches
that succeed is a Monte-Carlo estimate of the state's true success probability under this
policy (the episodes themselves are eval_policy's: same seeds, same noise).
Its failure AUC against the episode's own outcome is the ceiling a
learned critic is compared with (a noisy estimate of the optimum, so a lower bound on it);
`--critic` scores a critic on the same states. Before branching, the episode is replayed
once from the capsule with its own noise and must end exactly as it did (bit-exact restore).

Each judged state also gets its task phase (subtask, and what the gripper holds): the
summary gives the failure AUC of the phase alone (each state scored by its phase's success rate)
and, per phase, the ceiling's and the critic's AUC within it, which tells a critic that
only knows where in the task an episode is from one that sees how it is going there.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from capsule_rollout.cli.console import make_console
from capsule_rollout.cli.paths import resolve_input
from capsule_rollout.commands.configs import ValueCeilingConfig
from capsule_rollout.commands.result import ExperimentResult, UsageError, checking_inputs
from capsule_rollout.learning.ceiling_measure import BoundaryKeeper, judge_state
from capsule_rollout.learning.closed_loop_eval import EpisodesLostError
from capsule_rollout.learning.stats import failure_auc_summary, phase_breakdown
from capsule_rollout.rollout.branching import require_capturable_source
from capsule_rollout.rollout.host_factory import RunSpec, build_host, build_slots, resolve_acting, resolve_spec
from capsule_rollout.rollout.preflight_checks import preflight
from capsule_rollout.rollout.rollout_host import HostConfig
from capsule_rollout.tabletop.tabletop_eval import task_phase


def run(config: ValueCeilingConfig) -> ExperimentResult:
    console = make_console()
    keeper = BoundaryKeeper(0, phase=None if config.env else task_phase)  # phases: the tabletop's
    policy = resolve_input(config.model.policy)
    if config.act.noise_scale == 0:
        raise UsageError("--act.noise_scale 0: every branch would play the same continuation; pass a scale > 0")
    # branches sample the learned distribution (scale 1) unless told otherwise, whatever the policy is deployed with
    scale = 1.0 if config.act.noise_scale is None else config.act.noise_scale
    with checking_inputs():
        require_capturable_source(policy)  # branches restore mid-episode capsules: a policy server cannot
        n_exec, noise_scale = resolve_acting(policy, config.act.n_exec, scale)
        spec = RunSpec(env=config.env or f"tabletop:{config.family}", policy=policy,
                        critic=resolve_input(config.model.critic) if config.model.critic else "",
                        host=HostConfig(n_exec=n_exec, record_images=False),
                        advantage=config.act.advantage, beta=config.act.beta, noise_scale=noise_scale,
                        slots=config.slots, cameras=config.cameras, image_size=config.image_size)
        spec = resolve_spec(spec)  # once: the preflight and the hosts below take it as it is
        if config.env:  # a user's env: built once and probed first (a factory's policy executes its whole chunk)
            spec = preflight(spec, seed=config.seeds.first, n_exec_given=config.act.n_exec is not None).spec
        if config.slots > 1:  # the keeper watches the first slot, where each episode plays
            host = build_slots(spec)
            host.observe(keeper, [0])
        else:
            host = build_host(spec, observers=[keeper])
    at_step = host.env.max_steps // 2 if config.at_step is None else config.at_step
    if at_step >= host.env.max_steps:
        raise ValueError(f"--at_step {at_step} is not before the episode limit {host.env.max_steps}")
    keeper.at_step = at_step
    conditioning = spec.resolved.conditioning
    rows, t0 = [], time.perf_counter()
    try:
        for seed in config.seeds.range:
            row = judge_state(host, keeper, seed, at_step, branches=config.branches,
                              critic=bool(config.model.critic))
            if row is not None:
                rows.append(row)
    except EpisodesLostError as exc:  # a state that cannot be played cannot be judged: say why in one line
        print(f"error: {exc}", file=sys.stderr)
        return ExperimentResult({"error": str(exc), "judged_episodes": len(rows)}, exit_code=1)
    finally:
        host.close()
    seconds = time.perf_counter() - t0
    oracle = failure_auc_summary([(r["branch_success"], r["success"]) for r in rows])
    summary = {"policy_checkpoint": config.model.policy, "critic_checkpoint": config.model.critic or None,
               "family": None if config.env else config.family, "env": config.env or None,
               "seeds": [config.seeds.first, config.seeds.range[-1]],
               "at_step": at_step, "branches": config.branches, "advantage": conditioning.advantage,
               "beta": conditioning.beta, "judged_episodes": len(rows), "branch_failure_auc": oracle,
               "mean_branch_success": float(np.mean([r["branch_success"] for r in rows])) if rows else None,
               "seconds": seconds, "episodes": rows}
    console.print(f"{len(rows)} of {config.seeds.count} episodes still running at step {at_step}; "
                  f"{config.branches} branches each from the capsule there ({seconds:.0f} s)")
    console.print(f"failure AUC of the branch success fraction (the ceiling): {_shown(oracle)}")
    if config.model.critic:
        summary["critic_failure_auc"] = failure_auc_summary([(r["critic_value"], r["success"]) for r in rows])
        console.print(f"failure AUC of the critic on the same states: {_shown(summary['critic_failure_auc'])}")
    if config.env:  # a foreign env tells no task phases
        return ExperimentResult(summary=summary)
    breakdown = phase_breakdown(rows, ["branch_success", *(["critic_value"] if config.model.critic else [])])
    summary["phase_alone_failure_auc"] = breakdown["phase_alone"]
    summary["phases"] = breakdown["phases"]
    console.print(f"failure AUC of the phase alone (each state scored by its phase's success rate): "
                  f"{_shown(breakdown['phase_alone'])}")
    for name, info in breakdown["phases"].items():
        within = "; ".join(f"{label} {_auc(info[key])}" for key, label in
                           (("branch_success", "ceiling"), ("critic_value", "critic")) if key in info)
        console.print(f"  {name}: {info['states']} states, {info['successes']} successes; AUC within: {within}")
    return ExperimentResult(summary=summary)


def _auc(auc: dict) -> str:
    return "n/a" if auc["auc"] is None else f"{auc['auc']:.2f}"


def _shown(auc: dict) -> str:
    if auc["auc"] is None:
        return f"n/a (needs both successes and failures; {auc['failures']} failures, {auc['successes']} successes)"
    lo, hi = auc["ci95"]
    return f"{auc['auc']:.2f} (95% CI {lo:.2f}-{hi:.2f}; {auc['failures']} failures, {auc['successes']} successes)"
