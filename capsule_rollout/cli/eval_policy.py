"""eval_policy: a policy's success on held-out seeds. On the tabletop (the example), next to the scripted
expert's, per family with `--family all`, with paraphrased subtasks (`--phrasing`) and mid-episode coaching
(`--coach`); on any env of the rollout protocols with `--env` (a checkpoint or a factory's import path for the
policy and critic, on Ray actors too: `learning.closed_loop_eval.evaluate_spec`)."""

from __future__ import annotations

import sys
import time

from capsule_rollout.cli.console import make_console
from capsule_rollout.cli.paths import resolve_input
from capsule_rollout.commands.configs import EvalPolicyConfig
from capsule_rollout.commands.result import ExperimentResult, checking_inputs
from capsule_rollout.input_bounds import check_run
from capsule_rollout.learning.closed_loop_eval import EpisodesLostError, evaluate_spec
from capsule_rollout.rollout.host_factory import RunSpec, check_spec, resolve_acting, resolve_spec
from capsule_rollout.rollout.preflight_checks import preflight
from capsule_rollout.rollout.ray_rollout import init_ray, shutdown_ray
from capsule_rollout.rollout.record import absolute_source
from capsule_rollout.rollout.rollout_host import HostConfig
from capsule_rollout.tabletop.coaching import COACHABLE, evaluate_coaching
from capsule_rollout.tabletop.tabletop_eval import evaluate_expert, evaluate_policy
from capsule_rollout.tabletop.tasks import FAMILY_NAMES


def run(config: EvalPolicyConfig) -> ExperimentResult:
    with checking_inputs():
        families = len(FAMILY_NAMES) if config.family == "all" and not config.env else 1
        check_run(config.seeds.count * families, "--seeds.count (--episodes)", config.actors, config.slots, 1.0)
    try:
        return _run_env(config) if config.env else _run_tabletop(config)
    except EpisodesLostError as exc:  # no figure to give: say why in one line
        print(f"error: {exc}", file=sys.stderr)
        return ExperimentResult({"error": str(exc)}, exit_code=1)


def _run_tabletop(config: EvalPolicyConfig) -> ExperimentResult:
    console = make_console()
    policy_dir = resolve_input(config.model.policy)
    families = FAMILY_NAMES if config.family == "all" else (config.family,)
    with checking_inputs():
        n_exec, noise_scale = resolve_acting(policy_dir, config.act.n_exec, config.act.noise_scale)
        # how the policy acts (a flow policy: its RECAP record unless overridden; any other checkpoint: as it is)
        conditioning = check_spec(RunSpec(env=f"tabletop:{families[0]}", policy=policy_dir,
                                           advantage=config.act.advantage, beta=config.act.beta,
                                           noise_scale=noise_scale, host=HostConfig(n_exec=n_exec)))
    seeds = list(config.seeds.range)
    critics = [resolve_input(c) for c in config.model.critic]
    results: dict[str, dict] = {}
    where = init_ray() if config.actors else ""
    try:
        for family in families:
            t0 = time.perf_counter()
            policy = evaluate_policy(policy_dir, family=family, seeds=seeds, n_exec=n_exec,
                                     advantage=config.act.advantage, beta=config.act.beta, critics=critics,
                                     actors=config.actors, phrasing=config.phrasing, noise_scale=noise_scale,
                                     slots=config.slots)
            policy["seconds"] = time.perf_counter() - t0
            results[family] = {"policy": policy}
    finally:
        if where:
            shutdown_ray(where)
    if config.expert:
        for family in families:
            results[family]["expert"] = evaluate_expert(family=family, seeds=seeds)
    if config.coach:
        for family in families:
            if family in COACHABLE:
                results[family]["coaching"] = evaluate_coaching(
                    policy_dir, family=family, seeds=seeds, n_exec=n_exec,
                    advantage=config.act.advantage, beta=config.act.beta, noise_scale=noise_scale)
    summary = {"policy_checkpoint": config.model.policy, "family": config.family, "seeds": [seeds[0], seeds[-1]],
               "n_exec": n_exec, "noise_scale": noise_scale, "advantage": conditioning.advantage,
               "beta": conditioning.beta, "phrasing": config.phrasing, "families": results}
    if len(families) == 1:  # one family: its figures at the top level too, as before `--family all`
        summary.update(results[families[0]])
    _print_summary(console, config, summary)
    return ExperimentResult(summary)


def _run_env(config: EvalPolicyConfig) -> ExperimentResult:
    """`--env`: the policy (and one critic) on a registered env or a factory's env, through the one loop."""
    console = make_console()
    policy = absolute_source(resolve_input(config.model.policy))
    critic = absolute_source(resolve_input(config.model.critic[0])) if config.model.critic else ""
    seeds = list(config.seeds.range)
    with checking_inputs():
        n_exec, noise_scale = resolve_acting(policy, config.act.n_exec, config.act.noise_scale)
        spec = RunSpec(env=config.env, policy=policy, critic=critic, advantage=config.act.advantage,
                        beta=config.act.beta, noise_scale=noise_scale,
                        host=HostConfig(n_exec=n_exec, record_images=False), slots=config.slots,
                        cameras=config.cameras, image_size=config.image_size)
        spec = resolve_spec(spec)  # once: the preflight and the hosts below take it as it is
        conditioning = spec.resolved.conditioning
        # built once here and probed, before any actor starts: a factory's policy executes its whole chunk
        spec = preflight(spec, seed=seeds[0], n_exec_given=config.act.n_exec is not None).spec
        n_exec = spec.host.n_exec
    where = init_ray() if config.actors else ""
    try:
        t0 = time.perf_counter()
        policy_result = evaluate_spec(spec, seeds, task=config.env, actors=config.actors)
        policy_result["seconds"] = time.perf_counter() - t0
    finally:
        if where:
            shutdown_ray(where)
    summary = {"policy": policy_result, "policy_source": config.model.policy, "env": config.env,
               "seeds": [seeds[0], seeds[-1]], "n_exec": n_exec, "noise_scale": noise_scale,
               "advantage": conditioning.advantage, "beta": conditioning.beta,
               "families": {config.env: {"policy": policy_result}}}
    _print_summary(console, config, summary)
    return ExperimentResult(summary)


def _print_summary(console, config: EvalPolicyConfig, summary: dict) -> None:
    advantage, beta, noise_scale = summary["advantage"], summary["beta"], summary["noise_scale"]
    acting = "" if advantage == "none" else (
        f" (advantage {advantage}" + (f", guidance beta {beta:g})" if beta else ")"))
    scaled = "" if noise_scale == 1.0 else f", noise scale {noise_scale:g}"
    worded = "" if config.phrasing == "canonical" else f", subtasks worded the {config.phrasing} way"
    for family, result in summary["families"].items():
        policy = result["policy"]
        lo, hi = policy["ci95"]
        console.print(f"{family}: policy{acting}{worded}, {summary['n_exec']} actions per chunk{scaled}: "
                      f"{policy['successes']}/{policy['episodes']} = {policy['success_rate']:.0%} "
                      f"(95% CI {lo:.0%}-{hi:.0%}), mean steps to success {policy['mean_steps_to_success']}")
        if policy.get("instances_by_actor"):  # played on slot hosts
            console.print(f"{family}: policy / critic instances per actor: " + ", ".join(
                f"actor {a} ({n['slots']} slots) {n['policy']} / {n['critic']}"
                for a, n in policy["instances_by_actor"].items()))
        _print_critics(console, config, policy)
        if "expert" in result:
            expert = result["expert"]
            console.print(f"{family}: scripted expert: {expert['successes']}/{expert['episodes']} = "
                          f"{expert['success_rate']:.0%}, mean steps to success {expert['mean_steps_to_success']}")
        if "coaching" in result:
            c = result["coaching"]
            rate = "n/a" if c["follow_rate"] is None else \
                f"{c['follow_rate']:.0%} (95% CI {c['follow_ci95'][0]:.0%}-{c['follow_ci95'][1]:.0%})"
            console.print(f"{family}: coached mid-episode ({c['example']!r}) in {c['coached']} of {c['episodes']} "
                          f"episodes: followed {c['followed']} = {rate}, kept the original plan {c['kept_plan']}, "
                          f"neither {c['neither']}; released nearest the coached pad {c['released_nearest_coached']}, "
                          f"still held at the end {c['held_at_end']}")
    if config.coach and not any(f in COACHABLE for f in summary["families"]):
        console.print(f"coaching: none of {list(summary['families'])} has a place-on-a-pad subtask "
                      f"({', '.join(COACHABLE)} do)")


def _print_critics(console, config: EvalPolicyConfig, policy: dict) -> None:
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


def _print_auc(console, who: str, auc: dict) -> None:
    shown = "n/a (needs both successes and failures)" if auc["auc"] is None else \
        f"{auc['auc']:.2f} (95% CI {auc['ci95'][0]:.2f}-{auc['ci95'][1]:.2f})"
    console.print(f"{who}: failure AUC from values at the mid-episode step {shown}; "
                  f"{auc['failures']} failures, {auc['successes']} successes")
