"""value_ceiling: how well can any critic predict failure at the mid-episode step?

For every held-out seed the policy runs one episode, snapshotting a capsule of the env and
the policy runtime at each chunk start. For the episodes still running at step
`at_step`, the capsule of the last chunk started at or before it is restored and the
policy plays on to the end `branches` times, each with a fresh noise seed; the fraction of
branches that succeed is a Monte-Carlo estimate of the state's true success probability
under this policy (the episodes themselves are eval_policy's: same seeds, same noise).
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

import time

import numpy as np
import torch

from capsules import Arena, restore, snapshot
from critics.critic_runtime import CriticRuntime
from critics.value_critic import load_critic
from envs.tabletop_env import TabletopEnv, image_key
from experiments.configs import ValueCeilingConfig
from experiments.console import make_console
from experiments.paths import resolve_input
from experiments.policy_eval import play_episode, task_phase
from experiments.result import ExperimentResult
from experiments.stats import failure_auc_summary, phase_breakdown
from policies.flow_policy import ADV_NONE, ADV_POSITIVE, load_policy
from policies.policy_runtime import PolicyRuntime


class ReplayDivergedError(RuntimeError):
    """Replaying an episode from its own capsule did not reproduce it: a restore is not exact."""


def branch_seed(seed: int, branch: int) -> int:
    """Noise seed of branch `branch` from episode `seed` (never the episode's own noise seed, 0)."""
    return 1 + seed * 1009 + branch


def run(config: ValueCeilingConfig) -> ExperimentResult:
    console = make_console()
    model = load_policy(resolve_input(config.policy))
    critic = load_critic(resolve_input(config.critic)) if config.critic else None
    env = TabletopEnv(config.family, cameras=model.config.cameras, image_size=model.config.image_size)
    at_step = env.max_steps // 2 if config.at_step is None else config.at_step
    if at_step >= env.max_steps:
        raise ValueError(f"--at_step {at_step} is not before the episode limit {env.max_steps}")
    runtime = PolicyRuntime(model, seed=0, guidance=config.beta is not None)
    arena = Arena([env, runtime]).allocate()  # what a branch restores: the sim and the policy's noise
    readers: list = [runtime]
    if critic is not None:
        if critic.config.image_size != model.config.image_size:
            raise ValueError(f"critic image size {critic.config.image_size} != policy image size "
                             f"{model.config.image_size}: score them on one env with one size")
        missing = set(critic.config.cameras) - set(model.config.cameras)
        if missing:
            raise ValueError(f"the critic reads cameras {sorted(missing)} the policy does not render")
        critic_runtime = CriticRuntime(critic)
        Arena([critic_runtime]).allocate()
        readers.append(critic_runtime)
    runtime.set_advantage(ADV_POSITIVE if config.advantage == "positive" else ADV_NONE,
                          1.0 if config.beta is None else config.beta)
    rows, t0 = [], time.perf_counter()
    try:
        for seed in range(config.seed, config.seed + config.episodes):
            obs, info = env.reset(seed=seed)
            starts: list[tuple[int, object, dict, str, str]] = []  # (step, capsule, observation, subtask, phase)

            def keep(obs: dict, subtask: str) -> None:
                if env.steps <= at_step:
                    starts.append((env.steps, snapshot(arena, step=env.steps, force=True, digest=False),
                                   obs, subtask, task_phase(env)))

            info = play_episode(env, runtime, obs, info, n_exec=config.n_exec, readers=readers, on_chunk=keep)
            success, length = bool(info["success"]), env.steps
            noise_after = runtime.buffers["rng"].clone()  # the next episode's noise, as in eval_policy
            if length <= at_step:
                continue  # ended before the step: not judged there
            step, capsule, mid_obs, subtask, phase = starts[-1]
            row = {"seed": seed, "success": success, "length": length, "step": step, "phase": phase}
            if critic is not None:
                critic_runtime.set_subtask(subtask)
                row["critic_value"] = float(critic_runtime.evaluate(
                    {c: mid_obs[image_key(c)] for c in critic.config.cameras}, mid_obs["state"], step)[0])

            def branch(noise_seed: int | None) -> tuple[bool, int]:
                restore(arena, capsule)
                if noise_seed is not None:
                    runtime.buffers["rng"].copy_(torch.tensor([noise_seed, 0]))
                end = play_episode(env, runtime, mid_obs, {"subtask": subtask}, n_exec=config.n_exec,
                                   readers=readers)
                return bool(end["success"]), env.steps

            if branch(None) != (success, length):
                raise ReplayDivergedError(f"seed {seed}: replaying from the step-{step} capsule with the episode's "
                                          f"own noise did not end as the episode did; run verify_capsule")
            wins = sum(branch(branch_seed(seed, b))[0] for b in range(config.branches))
            row["branch_success"] = wins / config.branches
            runtime.buffers["rng"].copy_(noise_after)
            rows.append(row)
    finally:
        env.close()
    seconds = time.perf_counter() - t0
    oracle = failure_auc_summary([(r["branch_success"], r["success"]) for r in rows])
    summary = {"policy_checkpoint": config.policy, "critic_checkpoint": config.critic or None,
               "family": config.family, "seeds": [config.seed, config.seed + config.episodes - 1],
               "at_step": at_step, "branches": config.branches, "advantage": config.advantage, "beta": config.beta,
               "judged_episodes": len(rows), "branch_failure_auc": oracle,
               "mean_branch_success": float(np.mean([r["branch_success"] for r in rows])) if rows else None,
               "seconds": seconds, "episodes": rows}
    console.print(f"{len(rows)} of {config.episodes} episodes still running at step {at_step}; "
                  f"{config.branches} branches each from the capsule there ({seconds:.0f} s)")
    console.print(f"failure AUC of the branch success fraction (the ceiling): {_shown(oracle)}")
    if critic is not None:
        summary["critic_failure_auc"] = failure_auc_summary([(r["critic_value"], r["success"]) for r in rows])
        console.print(f"failure AUC of the critic on the same states: {_shown(summary['critic_failure_auc'])}")
    breakdown = phase_breakdown(rows, ["branch_success", *(["critic_value"] if critic is not None else [])])
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
