"""eval_policy: a policy checkpoint's success on held-out seeds, next to the scripted expert's."""

from __future__ import annotations

import time

from experiments.configs import EvalPolicyConfig
from experiments.console import make_console
from experiments.paths import resolve_input
from experiments.result import ExperimentResult, checking_inputs
from learning.evaluation import evaluate_expert, evaluate_policy
from policies.flow_policy import resolve_conditioning
from rollout.ray_rollout import init_ray, shutdown_ray


def run(config: EvalPolicyConfig) -> ExperimentResult:
    console = make_console()
    policy_dir = resolve_input(config.model.policy)
    with checking_inputs():
        conditioning = resolve_conditioning(policy_dir, config.act.advantage, config.act.beta)
    seeds = list(config.seeds.range)
    t0 = time.perf_counter()
    where = init_ray() if config.actors else ""
    try:
        policy = evaluate_policy(policy_dir, family=config.family, seeds=seeds, n_exec=config.act.n_exec,
                                 advantage=config.act.advantage, beta=config.act.beta,
                                 critics=[resolve_input(c) for c in config.model.critic], actors=config.actors)
    finally:
        if where:
            shutdown_ray(where)
    policy["seconds"] = time.perf_counter() - t0
    summary = {"policy_checkpoint": config.model.policy, "family": config.family, "seeds": [seeds[0], seeds[-1]],
               "n_exec": config.act.n_exec, "advantage": conditioning.advantage, "beta": conditioning.beta,
               "policy": policy}
    lo, hi = policy["ci95"]
    acting = "" if conditioning.advantage == "none" else (
        f" (advantage {conditioning.advantage}" + (f", guidance beta {conditioning.beta:g})" if conditioning.beta
                                                   else ")"))
    console.print(f"policy{acting}: {policy['successes']}/{policy['episodes']} = {policy['success_rate']:.0%} "
                  f"(95% CI {lo:.0%}-{hi:.0%}), mean steps to success {policy['mean_steps_to_success']}")
    aucs = policy.get("critic_failure_aucs") or [policy.get("critic_failure_auc")]
    state_only = policy.get("critic_failure_auc_state_only") or [None] * len(aucs)
    for name, auc, alone in zip(config.model.critic, aucs, state_only):
        _print_auc(console, f"critic {name}" + (" (with the policy's chunk)" if alone else ""), auc)
        if alone:
            _print_auc(console, f"critic {name} (the state alone)", alone)
    if "critic_failure_auc_mean" in policy:
        _print_auc(console, "the critics' mean value", policy["critic_failure_auc_mean"])
    if "phase_alone_failure_auc" in policy:
        _print_auc(console, "the task phase alone (its success rate)", policy["phase_alone_failure_auc"])
    if config.expert:
        expert = evaluate_expert(family=config.family, seeds=seeds)
        summary["expert"] = expert
        console.print(f"scripted expert: {expert['successes']}/{expert['episodes']} = {expert['success_rate']:.0%}, "
                      f"mean steps to success {expert['mean_steps_to_success']}")
    return ExperimentResult(summary)


def _print_auc(console, who: str, auc: dict) -> None:
    shown = "n/a (needs both successes and failures)" if auc["auc"] is None else \
        f"{auc['auc']:.2f} (95% CI {auc['ci95'][0]:.2f}-{auc['ci95'][1]:.2f})"
    console.print(f"{who}: failure AUC from values at the mid-episode step {shown}; "
                  f"{auc['failures']} failures, {auc['successes']} successes")
