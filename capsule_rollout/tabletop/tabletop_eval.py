"""The example's evaluation: a policy's (and the scripted expert's) success on held-out tabletop seeds, each
failure classified (wrong block held, never picked, picked but not placed), critics judged by their values at
the mid-episode step against the task phase there. Episodes are played through the core's
`learning.closed_loop_eval` (the one episode loop, in this process or on Ray actors); `EvalObserver` attaches to the
host and records, per episode, the failure kind and, at the mid-episode step, each critic's value and the task
phase.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from capsule_rollout.capsules import Arena
from capsule_rollout.learning.closed_loop_eval import EVAL, outcome_summary, run_items, summarize
from capsule_rollout.learning.stats import mid_episode_step
from capsule_rollout.policies.conditioning import Conditioning
from capsule_rollout.rollout.host_factory import RunSpec
from capsule_rollout.rollout.observer import EpisodeObserver
from capsule_rollout.rollout.rollout_actor import WorkItem
from capsule_rollout.rollout.rollout_host import HostConfig, RolloutHost
from capsule_rollout.tabletop.critic_runtime import CriticRuntime
from capsule_rollout.tabletop.flow_policy import FlowPolicy
from capsule_rollout.tabletop.policy_runtime import PolicyRuntime
from capsule_rollout.tabletop.scripted_expert import ScriptedExpert
from capsule_rollout.tabletop.tabletop_env import CONTROL_HZ, TabletopEnv
from capsule_rollout.tabletop.value_critic import ValueCritic, load_critic

OBSERVER = "capsule_rollout.tabletop.tabletop_eval:EvalObserver"


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


class EvalObserver(EpisodeObserver):
    """Per episode (in `result.extra["eval"]`): the failure kind and, at the mid-episode step (the last
    chunk started at or before `mid_step`, default half the episode limit), the host critic's and every
    extra critic's value there and the task phase. A critic that reads the plan is asked again once the
    chunk is known, with it; its value of the state alone is kept beside."""

    name = EVAL

    def __init__(self, critics: Sequence[str] = (), mid_step: int | None = None, *,
                 critic_models: Sequence[ValueCritic] = ()) -> None:
        models = [*(load_critic(path) for path in critics), *critic_models]
        self.extra = [CriticRuntime(model, name=f"critic{i + 1}") for i, model in enumerate(models)]
        if self.extra:
            Arena(self.extra).allocate()
        self.mid_step = mid_step
        self._language = ""

    def episode_start(self, host: RolloutHost, seed: int) -> None:
        self.tracker = _FailureTracker(host.env)
        self.at = host.env.max_steps // 2 if self.mid_step is None else self.mid_step
        self.values: dict[int, list[float]] = {}  # chunk start step -> each critic's value
        self.state_values: dict[int, list[float]] = {}  # and without the plan (plan critics)
        self.phases: dict[int, str] = {}
        self._obs = None

    def chunk_start(self, host: RolloutHost, obs: dict) -> None:
        self._obs = obs
        text = host.channel.read().text
        if text and text != self._language:
            for runtime in self.extra:
                runtime.set_language(text)
            self._language = text

    def chunk(self, host: RolloutHost, chunk: np.ndarray) -> None:
        step = host.env.steps
        critics = ([host.critic] if host.critic is not None else []) + self.extra
        if not critics:
            return
        alone = ([host.value] if host.critic is not None else []) + [float(rt.evaluate(self._obs, step)[0])
                                                                      for rt in self.extra]
        with_plan = [float(rt.evaluate(plan=chunk)[0]) if getattr(rt.config, "plan_steps", 0) else v
                     for rt, v in zip(critics, alone)]
        self.values[step] = with_plan
        self.state_values[step] = alone
        if step <= self.at:
            self.phases[step] = task_phase(host.env)

    def step(self, host: RolloutHost, tick) -> None:
        self.tracker.step()

    def episode_end(self, host: RolloutHost, result) -> None:
        out = {"failure_kind": self.tracker.kind(), "steps": host.env.steps}
        if self.values:
            starts = np.full(host.env.steps, np.nan)  # per control step, finite where a chunk started
            starts[[s for s in self.values if s < host.env.steps]] = 0.0
            at = mid_episode_step(starts, self.at)
            if at is not None:
                out.update(mid_step=at, mid_values=self.values[at], mid_state_values=self.state_values[at],
                           phase=self.phases[at])
        result.extra[self.name] = out


def eval_spec(policy: str, *, family: str, n_exec: int = 8, noise_seed: int = 0, advantage: str = "checkpoint",
              beta: float | None = None, critics: Sequence[str] = (), mid_step: int | None = None,
              threads: int = 1, phrasing: str = "canonical", noise_scale: float = 1.0, slots: int = 1) -> RunSpec:
    """The host spec of an evaluation: the first critic runs on the host's critic lane, the others in
    the observer."""
    import json

    kwargs = json.dumps({"critics": list(critics[1:]), "mid_step": mid_step})
    return RunSpec(env=f"tabletop:{family}", policy=policy, critic=critics[0] if critics else "",
                    host=HostConfig(n_exec=n_exec, noise_seed=noise_seed, record_images=False, phrasing=phrasing),
                    advantage=advantage, beta=beta, noise_scale=noise_scale, threads=threads,
                    observers=((OBSERVER, kwargs),), slots=slots)


def local_eval_host(model: FlowPolicy, *, family: str, n_exec: int = 8, noise_seed: int = 0,
                    conditioning: Conditioning = Conditioning(), critics: Sequence[ValueCritic] = (),
                    mid_step: int | None = None, phrasing: str = "canonical", noise_scale: float = 1.0) -> RolloutHost:
    """An evaluation host around models in memory (a training loop's policy)."""
    cameras = tuple(dict.fromkeys((*model.config.cameras, *(c for critic in critics for c in critic.config.cameras))))
    for critic in critics:
        if critic.config.image_size != model.config.image_size:
            raise ValueError(f"critic image size {critic.config.image_size} != policy image size "
                             f"{model.config.image_size}: evaluate them on one env with one size")
    env = TabletopEnv(family, cameras=cameras, image_size=model.config.image_size)
    runtime = PolicyRuntime(model, guidance=conditioning.beta is not None, noise_scale=noise_scale)
    host = RolloutHost(env=env, policy=runtime, critic=CriticRuntime(critics[0]) if critics else None,
                       config=HostConfig(n_exec=n_exec, noise_seed=noise_seed, record_images=False,
                                         phrasing=phrasing),
                       observers=[EvalObserver(critic_models=critics[1:], mid_step=mid_step)])
    runtime.set_conditioning(conditioning.indicator, conditioning.beta)
    return host


def evaluate_policy(policy: str | FlowPolicy, *, family: str, seeds: list[int], n_exec: int = 8,
                    noise_seed: int = 0, advantage: str = "checkpoint", beta: float | None = None,
                    critics: Sequence[str | ValueCritic] = (), actors: int = 0, phrasing: str = "canonical",
                    noise_scale: float = 1.0, slots: int = 1) -> dict:
    """Success of `policy` (a checkpoint directory, or a model in memory) on `seeds`.

    `advantage`/`beta`: how the policy acts (see `policies.conditioning.resolve_conditioning`; a model in
    memory takes "none" / "positive" only). `actors`: Ray actors to play on (0: this process; needs
    checkpoint paths). `critics`: each values every chunk's first observation; the value at the
    mid-episode step (half the episode limit; episodes still running then) gives `critic_failure_auc`
    for the first; with more than one, `critic_failure_aucs` (each, on the same states) and
    `critic_failure_auc_mean` (their mean value, an ensemble); and, on the same states,
    `phase_alone_failure_auc` (each state scored by its task phase's success rate, see `task_phase`) and
    `critic_phases` (per phase, the first critic's AUC within it). A critic that reads the plan
    (`plan_steps`) is valued with the policy's chunk; `critic_failure_auc_state_only` gives, per critic
    (None for the others), its AUC without the plan on the same states. They do not change what the
    policy does. `phrasing`: how the planner words the subtasks (`tabletop.phrasing`). `noise_scale`: of the policy's
    chunk noise (`PolicyRuntime`). `slots`: env slots per actor (a checkpoint policy; `RunSpec.slots`).
    """
    reports, plan_critics = play(policy, family=family, seeds=seeds, n_exec=n_exec, noise_seed=noise_seed,
                                 advantage=advantage, beta=beta, critics=critics, actors=actors, phrasing=phrasing,
                                 noise_scale=noise_scale, slots=slots)
    return summarize(reports, control_hz=CONTROL_HZ, n_critics=len(critics), plan_critics=plan_critics)


def play(policy: str | FlowPolicy, *, family: str, seeds: list[int], n_exec: int = 8, noise_seed: int = 0,
         advantage: str = "checkpoint", beta: float | None = None, critics: Sequence[str | ValueCritic] = (),
         actors: int = 0, phrasing: str = "canonical", noise_scale: float = 1.0,
         slots: int = 1) -> tuple[list, list[int]]:
    """The evaluation's episodes (`ActorReport`s in seed order, each with `extra["eval"]`), and which
    critics read the plan; see `evaluate_policy`."""
    items = [WorkItem(f"{family}-s{seed:07d}", seed) for seed in seeds]
    if isinstance(policy, FlowPolicy):
        if actors or slots > 1:
            raise ValueError("evaluating a model in memory runs in this process on one slot (actors=0, slots=1); "
                             "save a checkpoint to evaluate on Ray actors or slots")
        if advantage == "checkpoint":
            advantage = "none"
        models = [c if isinstance(c, ValueCritic) else load_critic(c) for c in critics]
        host = local_eval_host(policy, family=family, n_exec=n_exec, noise_seed=noise_seed,
                               conditioning=Conditioning(advantage, beta), critics=models, phrasing=phrasing,
                               noise_scale=noise_scale)
        reports = run_items(RunSpec(env=f"tabletop:{family}"), items, host=host)
        plan_critics = [i for i, m in enumerate(models) if m.config.plan_steps]
    else:
        if any(not isinstance(c, str) for c in critics):
            raise ValueError("with a checkpoint policy, give critics as checkpoint directories")
        spec = eval_spec(policy, family=family, n_exec=n_exec, noise_seed=noise_seed, advantage=advantage,
                         beta=beta, critics=list(critics), phrasing=phrasing, noise_scale=noise_scale, slots=slots)
        reports = run_items(spec, items, actors=actors)
        plan_critics = [i for i, c in enumerate(critics) if load_critic(c).config.plan_steps]
    return reports, plan_critics


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
    return outcome_summary(results, CONTROL_HZ)
