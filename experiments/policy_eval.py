"""Closed-loop evaluation of a policy (and the scripted expert) on held-out seeds.

Receding horizon: each chunk's first `n_exec` actions are executed, and a new
chunk is asked for as soon as the subtask changes (the scripted planner's choice:
the env's current subtask).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

from capsules import Arena
from critics.critic_runtime import CriticRuntime
from critics.value_critic import ValueCritic
from envs.scripted_expert import ScriptedExpert
from envs.tabletop_env import CONTROL_HZ, TabletopEnv, image_key
from experiments.stats import failure_auc_summary, mid_episode_step, phase_breakdown, wilson_interval
from policies.flow_policy import FlowPolicy
from policies.policy_runtime import PolicyRuntime


def _summary(results: list[tuple[bool, int, str]]) -> dict:
    n = len(results)
    wins = sum(ok for ok, _, _ in results)
    steps = [s for ok, s, _ in results if ok]
    low, high = wilson_interval(wins, n)
    sim_seconds = sum(s for _, s, _ in results) / CONTROL_HZ  # every episode's control steps, success or not
    return {
        "episodes": n,
        "successes": wins,
        "success_rate": wins / n if n else 0.0,
        "ci95": [low, high],
        "mean_steps_to_success": float(np.mean(steps)) if steps else None,
        "sim_seconds": sim_seconds,
        "successes_per_sim_hour": 3600 * wins / sim_seconds if sim_seconds else 0.0,
        "failures": dict(Counter(kind for ok, _, kind in results if not ok)),
        "success_by_seed": [int(ok) for ok, _, _ in results],  # in seed order, for paired comparisons
    }


class _FailureTracker:
    """Classifies a failed episode: wrong block held, never picked, or picked but not placed."""

    def __init__(self, env: TabletopEnv) -> None:
        self.env = env
        self.targets = {sub.block for sub in env.subtasks}
        self.wrong_block = False
        self.max_subtask = 0

    def step(self) -> None:
        holding = self.env.world().holding
        self.wrong_block |= holding is not None and holding not in self.targets
        self.max_subtask = max(self.max_subtask, self.env.subtask_index)

    def kind(self) -> str:
        if self.wrong_block:
            return "held_wrong_block"
        return "never_picked" if self.max_subtask == 0 else "picked_not_placed"


def task_phase(env: TabletopEnv) -> str:
    """Where in its task an episode is: the subtask and what the gripper holds (its block, another, nothing)."""
    index = min(env.subtask_index, len(env.subtasks) - 1)
    holding = env.world().holding
    held = ("nothing" if holding is None else
            "its block" if holding == env.subtasks[index].block else "another block")
    return f"subtask {index} ({env.subtasks[index].kind}), holding {held}"


def evaluate_policy(model: FlowPolicy, *, family: str, seeds: list[int], n_exec: int = 8,
                    noise_seed: int = 0, advantage: int = 0, beta: float | None = None,
                    critics: Sequence[ValueCritic] = ()) -> dict:
    """Success of `model` on `seeds` (fresh runtime; the model is only read).

    `advantage`: the RECAP indicator to act with (1: positive); `beta`: classifier-free
    guidance weight over it (None: no guidance, the conditional policy alone).
    `critics`: also value every chunk's first observation with each and report how
    well the value at the mid-episode step (half the episode limit; episodes still
    running then) predicts failure: `critic_failure_auc` for the first; with more
    than one, `critic_failure_aucs` (each, on the same states) and
    `critic_failure_auc_mean` (their mean value, an ensemble); and, on the same states,
    `phase_alone_failure_auc` (each state scored by its task phase's success rate, see
    `task_phase`) and `critic_phases` (per phase, the first critic's AUC within it). A critic
    that reads the plan (`plan_steps`) is asked after the policy's chunk is known and valued
    with it; `critic_failure_auc_state_only` gives, per critic (None for the others), its
    AUC without the plan on the same states. They do not change what the policy does.
    """
    cameras = tuple(dict.fromkeys((*model.config.cameras, *(c for critic in critics for c in critic.config.cameras))))
    env = TabletopEnv(family, cameras=cameras, image_size=model.config.image_size)
    runtime = PolicyRuntime(model, seed=noise_seed, guidance=beta is not None)
    critic_runtimes = []
    for i, critic in enumerate(critics):
        if critic.config.image_size != model.config.image_size:
            raise ValueError(f"critic image size {critic.config.image_size} != policy image size "
                             f"{model.config.image_size}: evaluate them on one env with one size")
        critic_runtimes.append(CriticRuntime(critic, name=f"critic{i}"))
    components: list = [runtime, *critic_runtimes]
    Arena(components).allocate()
    runtime.set_advantage(advantage, 1.0 if beta is None else beta)
    results = []
    mids: list[tuple[np.ndarray | None, bool, str | None]] = []  # per episode: each critic's mid value, phase
    plan_critics = [i for i, critic in enumerate(critics) if critic.config.plan_steps]
    state_mids: list[list[float] | None] = []  # per episode: the critics' mid values without any plan
    mid_step = env.max_steps // 2
    try:
        for seed in seeds:
            obs, info = env.reset(seed=seed)
            tracker = _FailureTracker(env)
            chunk_values: dict[int, list[float]] = {}  # control step where a chunk started -> each critic's value
            state_values: dict[int, list[float]] = {}  # and, plan critics only, its value without the plan
            chunk_phases: dict[int, str] = {}  # and the task phase there (up to the mid step, the one judged)

            def value_chunk(obs: dict, subtask: str) -> None:
                if critic_runtimes:
                    chunk_values[env.steps] = [float(rt.evaluate({c: obs[image_key(c)] for c in rt.config.cameras},
                                                                 obs["state"], env.steps)[0])
                                               for rt in critic_runtimes]
                    if env.steps <= mid_step:
                        chunk_phases[env.steps] = task_phase(env)

            def value_plan(chunk: np.ndarray) -> None:
                # a critic that reads the plan: the same observation, now with the chunk about to run
                # (what value_chunk gave it is the value of the state alone)
                values = chunk_values[env.steps]
                state_values[env.steps] = list(values)
                for i in plan_critics:
                    values[i] = float(critic_runtimes[i].evaluate(plan=chunk)[0])

            info = play_episode(env, runtime, obs, info, n_exec=n_exec, readers=components,
                                on_chunk=value_chunk, on_step=tracker.step,
                                on_act=value_plan if plan_critics else None)
            results.append((bool(info["success"]), env.steps, tracker.kind()))
            if critic_runtimes:
                starts = np.full(env.steps, np.nan)  # per control step, finite where a chunk started
                starts[list(chunk_values)] = 0.0
                at = mid_episode_step(starts, mid_step)
                mids.append((None, bool(info["success"]), None) if at is None else
                            (np.array(chunk_values[at]), bool(info["success"]), chunk_phases[at]))
                if plan_critics:
                    state_mids.append(None if at is None else state_values[at])
    finally:
        env.close()
    summary = _summary(results)
    if critic_runtimes:
        judged = [(v, ok) for v, ok, _ in mids if v is not None]  # episodes still running at the mid step
        aucs = [failure_auc_summary([(float(v[i]), ok) for v, ok in judged]) for i in range(len(critics))]
        summary["critic_failure_auc"] = aucs[0]
        if plan_critics:  # a plan critic's AUC above is its value with the chunk; without it, on the same states
            summary["critic_failure_auc_state_only"] = [
                failure_auc_summary([(float(v[i]), ok) for v, (_, ok, _) in zip(state_mids, mids) if v is not None])
                if i in plan_critics else None for i in range(len(critics))]
        # the first critic against what the task phase alone gives, and within each phase
        phases = phase_breakdown([{"phase": p, "success": ok, "critic_value": float(v[0])}
                                  for v, ok, p in mids if v is not None], ["critic_value"])
        summary["phase_alone_failure_auc"] = phases["phase_alone"]
        summary["critic_phases"] = phases["phases"]
        if len(critics) > 1:
            summary["critic_failure_aucs"] = aucs
            summary["critic_failure_auc_mean"] = failure_auc_summary([(float(v.mean()), ok) for v, ok in judged])
            # per episode (seed order): each critic's mid-episode value, None where the episode had ended
            summary["critic_mid_values"] = [None if v is None else v.tolist() for v, _, _ in mids]
    return summary


def play_episode(env: TabletopEnv, runtime: PolicyRuntime, obs: dict, info: dict, *, n_exec: int,
                 readers: Sequence, on_chunk: Callable[[dict, str], None] | None = None,
                 on_step: Callable[[], None] | None = None,
                 on_act: Callable[[np.ndarray], None] | None = None) -> dict:
    """Run the policy from `obs` (the env's current observation) to the episode's end; the last info.

    Receding horizon: the first `n_exec` actions of each chunk, and a new chunk as soon as the
    subtask changes. `readers` (the policy runtime, a critic runtime) get every subtask's
    language. `on_chunk(obs, subtask)` runs before each chunk is asked for (env.steps is its
    step); `on_act(chunk)` with the chunk the policy returned, before any of it runs; `on_step()`
    after each env step.
    """
    subtask = info["subtask"]
    for reader in readers:
        reader.set_subtask(subtask)
    cameras = runtime.config.cameras
    while True:
        if on_chunk is not None:
            on_chunk(obs, subtask)
        chunk = runtime.act({c: obs[image_key(c)] for c in cameras}, obs["state"])[0].numpy().copy()
        if on_act is not None:
            on_act(chunk)
        for action in chunk[:n_exec]:
            obs, _, terminated, truncated, info = env.step(action)
            if on_step is not None:
                on_step()
            if terminated or truncated:
                return info
            if info["subtask"] != subtask:  # the planner moved on: new language, new chunk
                subtask = info["subtask"]
                for reader in readers:
                    reader.set_subtask(subtask)
                break


def evaluate_expert(*, family: str, seeds: list[int], noise: float = 0.0) -> dict:
    env = TabletopEnv(family, cameras=())
    results = []
    for seed in seeds:
        env.reset(seed=seed)
        expert = ScriptedExpert(env, noise=noise, seed=seed)
        tracker = _FailureTracker(env)
        while True:
            _, _, terminated, truncated, info = env.step(expert.act())
            tracker.step()
            if terminated or truncated:
                break
        results.append((bool(info["success"]), env.steps, tracker.kind()))
    return _summary(results)
