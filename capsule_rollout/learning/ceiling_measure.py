"""The value ceiling's measurement: keep a capsule of the whole host at each chunk boundary up to a step,
then judge the state there by branching (`rollout.branching.branch_value`, the routine the branch labels
use too). The command, its summary and printing are `cli/value_ceiling.py`."""

from __future__ import annotations

from collections.abc import Callable

from capsule_rollout.learning.closed_loop_eval import EpisodesLostError
from capsule_rollout.rollout.branching import branch_value, require_capturable
from capsule_rollout.rollout.observer import EpisodeObserver
from capsule_rollout.rollout.rollout_host import RolloutHost
from capsule_rollout.rollout.slots.host import SlotHost


class BoundaryKeeper(EpisodeObserver):
    """Keeps a capsule of the whole host at every chunk boundary up to `at_step` (the last is judged),
    with the task phase there: `phase(env)`, a label of where in its task the episode is (the example's
    `tabletop.tabletop_eval.task_phase`); without one, every state's phase is ""."""

    name = "boundaries"

    def __init__(self, at_step: int, phase: Callable[[object], str] | None = None) -> None:
        self.at_step = at_step
        self.phase = phase or (lambda env: "")
        self.last = None
        self.enabled = True  # off while branching: the branches' boundaries are not kept

    def episode_start(self, host: RolloutHost, seed: int) -> None:
        if self.enabled:
            self.last = None

    def chunk_start(self, host: RolloutHost, obs: dict) -> None:
        if self.enabled and host.env.steps <= self.at_step:
            self.last = (host.env.steps, host.snapshot(label="boundary"), self.phase(host.env))


def judge_state(host: RolloutHost | SlotHost, keeper: BoundaryKeeper, seed: int, at_step: int, *, branches: int,
                critic: bool) -> dict | None:
    """Play `seed`; from its capsule at the last boundary before `at_step`, replay it (it must end as it did)
    and play `branches` continuations with other noise. None: the episode ended before that step. On a `SlotHost`
    (the keeper observing its first slot) the episode plays in that slot and the branches side by side. A policy
    that cannot be captured (a policy server) is refused before the episode is played."""
    require_capturable(host)
    result = host.run_episode(seed)
    if result.episode is None:
        raise EpisodesLostError(f"seed {seed}: the episode was lost to an error: {result.error}")
    episode = result.episode
    success, length = bool(episode.meta.success), episode.meta.length
    if length <= at_step or keeper.last is None:
        return None  # ended before the step: not judged there
    step, capsule, phase = keeper.last
    row = {"seed": seed, "success": success, "length": length, "step": step, "phase": phase}
    if critic:
        row["critic_value"] = float(episode.steps["value"][step])  # the host's critic, at that chunk

    keeper.enabled = False
    try:
        value = branch_value(host, capsule, seed=seed, step=step, branches=branches, expect=(success, length))
    finally:
        keeper.enabled = True
    row["branch_success"] = value.success_fraction
    return row
