"""Branch values: Monte-Carlo values of a recorded state, from continuations played out of its capsule.

A capsule taken at a chunk boundary (`RolloutHost.snapshot`) holds the whole host: env, policy
(its noise state included), critic, action queue and hand-off. `branch_value` first replays it
with the episode's own noise, which must end exactly as the episode did (a restore that is not
bit-exact is refused, `ReplayDivergedError`), then plays `branches` continuations, each with a
fresh noise seed (`branch_seed`), and returns how many succeeded and their mean return from the
boundary on. The success fraction estimates the state's success probability under the policy.
`value_ceiling` judges critics with it; RECAP's branch value targets and advantage labels
(`learning.branch_values`) use the same routine. `branch_episode` plays an episode and branches from
the chunk boundaries asked for (a recorded episode is played again from its seed: the same episode,
bit for bit). `BranchActor` does that on the Ray actor pool: `run_rollouts(spec, [BranchItem...],
actor_cls=BranchActor)` with the spec the episodes were recorded with. On a `SlotHost` (`RunSpec.slots` > 1) the
continuations of every boundary, and the replay check, are forks of the boundary's capsule into the slots, played
side by side with their policy calls batched (`branch_values_in_slots`): the same values as one at a time on a
host of those slots. A policy that cannot be captured (a policy server: `capturable = False`) is refused
before anything is played (`NotCapturableError`): its mid-episode state is on the server.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from capsule_rollout.capsules import Capsule
from capsule_rollout.rollout.host_config import EpisodeResult
from capsule_rollout.rollout.observer import EpisodeObserver
from capsule_rollout.rollout.rollout_actor import ActorReport, RolloutActor, WorkItem
from capsule_rollout.rollout.rollout_host import RolloutHost
from capsule_rollout.rollout.slots.host import SlotHost
from capsule_rollout.rollout.slots.work import branch_job
from capsule_rollout.rollout.sources import REMOTE, source_kind
from capsule_rollout.stores import episode_schema as S
from capsule_rollout.stores.episode import Episode


class ReplayDivergedError(RuntimeError):
    """Replaying an episode from its own capsule did not reproduce it: a restore is not exact."""


class NotCapturableError(ValueError):
    """Branching needs mid-episode capsules, and the policy's state cannot be captured (a policy server)."""


def _refusal(where: str) -> NotCapturableError:
    return NotCapturableError(
        f"branch values restore capsules taken mid-episode, and the policy acts through the policy server {where}, "
        "whose state no capsule holds: branch with the policy in process (its checkpoint or factory; serve_policy "
        "serves the same one), or label the recorded episodes with a critic (label_advantages)")


def require_capturable(host: RolloutHost | SlotHost) -> None:
    """Refuse (`NotCapturableError`) a host whose policy cannot be captured, before anything is played."""
    policy = (host.hosts[0] if isinstance(host, SlotHost) else host).policy
    if not getattr(policy, "capturable", True):
        raise _refusal(getattr(policy, "server", "?"))


def require_capturable_source(policy: str) -> None:
    """`require_capturable` for a spec's policy source, before any host is built."""
    if source_kind(policy) == REMOTE:
        raise _refusal(policy)


def branch_seed(seed: int, branch: int) -> int:
    """Noise seed of branch `branch` from episode `seed` (distinct from every episode's own)."""
    return (1 + seed * 1009 + branch) | (1 << 61)


@dataclass(frozen=True)
class BranchValue:
    step: int  # the control step of the boundary the branches start from
    outcomes: tuple[tuple[bool, float, int], ...]  # each branch's (success, return from the boundary, steps played)

    @property
    def branches(self) -> int:
        return len(self.outcomes)

    @property
    def successes(self) -> int:
        return sum(o[0] for o in self.outcomes)

    @property
    def success_fraction(self) -> float:
        return self.successes / self.branches

    @property
    def mean_return(self) -> float:
        """The branches' mean sum of rewards from the boundary to their end."""
        return float(np.mean([o[1] for o in self.outcomes]))

    @property
    def steps_played(self) -> int:
        return sum(o[2] for o in self.outcomes)

    def to_json(self) -> dict:
        return {"step": self.step, "outcomes": [list(o) for o in self.outcomes]}

    @classmethod
    def from_json(cls, data: dict) -> BranchValue:
        return cls(step=int(data["step"]), outcomes=tuple((bool(s), float(r), int(n)) for s, r, n in data["outcomes"]))


def branch_value(host: RolloutHost | SlotHost, capsule: Capsule, *, seed: int, step: int, branches: int,
                 expect: tuple[bool, int] | None = None, first: int = 0) -> BranchValue:
    """Play `branches` continuations of episode `seed` from `capsule` (taken at control step `step`): those
    numbered `first` to `first + branches - 1` (`branch_seed`; a later call with `first` past an earlier
    call's continuations plays new ones).

    `expect`: the episode's (success, length); when given, the capsule is first replayed with the
    episode's own noise and must end the same way (else `ReplayDivergedError`). On a `SlotHost` the replay and
    the continuations are forks of the capsule into the slots, side by side (`branch_values_in_slots`).
    """
    require_capturable(host)
    if isinstance(host, SlotHost):
        return branch_values_in_slots(host, {step: capsule}, seed=seed, branches=branches, expect=expect,
                                      first=first)[0]
    if branches < 1:
        raise ValueError(f"branches must be >= 1, got {branches}")

    def play(noise_seed: int | None) -> tuple[bool, int, float, int]:
        result = host.branch(capsule, seed=seed, noise_seed=noise_seed)
        rewards = result.episode.steps[S.REWARD]
        return bool(result.episode.meta.success), host.env.steps, float(np.sum(rewards)), len(rewards)

    if expect is not None:
        success, length, _, _ = play(None)
        _check_replay(seed, step, (success, length), expect)
    outcomes = [play(branch_seed(seed, b)) for b in range(first, first + branches)]
    return BranchValue(step=step, outcomes=tuple((o[0], o[2], o[3]) for o in outcomes))


def _check_replay(seed: int, step: int, got: tuple[bool, int], expect: tuple[bool, int]) -> None:
    if tuple(got) != tuple(expect):
        raise ReplayDivergedError(
            f"seed {seed}: replaying from the step-{step} capsule with the episode's own noise did not end as "
            f"the episode did ({_ending(*got)} against {_ending(*expect)}); run verify_capsule")


def branch_values_in_slots(slots: SlotHost, capsules: dict[int, Capsule], *, seed: int, branches: int,
                           expect: tuple[bool, int] | None = None, first: int = 0) -> list[BranchValue]:
    """`branch_value` from each of `capsules` (control step -> the capsule taken there), every continuation a fork
    of its boundary's capsule into a free slot, all of them (and the replay check from the first boundary, when
    `expect` is given) played side by side; the values in step order."""
    require_capturable(slots)
    if branches < 1:
        raise ValueError(f"branches must be >= 1, got {branches}")
    steps = sorted(capsules)
    plan = [(step, branch_seed(seed, b)) for step in steps for b in range(first, first + branches)]
    if expect is not None and steps:
        plan.insert(0, (steps[0], None))
    results = slots.run_items(branch_job(capsules[step], seed=seed, noise_seed=noise) for step, noise in plan)
    outcomes: dict[int, list] = {step: [] for step in steps}
    for (step, noise), result in zip(plan, results, strict=True):
        if result.error is not None:
            raise result.error
        episode = result.value.episode
        rewards = episode.steps[S.REWARD]
        success, length = bool(episode.meta.success), step + len(rewards)
        if noise is None:
            _check_replay(seed, step, (success, length), expect)
        else:
            outcomes[step].append((success, float(np.sum(rewards)), len(rewards)))
    return [BranchValue(step=step, outcomes=tuple(outcomes[step])) for step in steps]


class BoundaryCapsules(EpisodeObserver):
    """Capsules of the whole host at the chunk starts whose control step is in `steps` (None: every one)."""

    name = "branch_boundaries"

    def __init__(self, steps=None) -> None:
        self.steps = None if steps is None else {int(s) for s in steps}
        self.capsules: dict[int, Capsule] = {}
        self.enabled = True  # off while branching: the branches' boundaries are not kept

    def episode_start(self, host: RolloutHost, seed: int) -> None:
        if self.enabled:
            self.capsules = {}

    def chunk_start(self, host: RolloutHost, obs: dict) -> None:
        if self.enabled and (self.steps is None or host.env.steps in self.steps):
            self.capsules[host.env.steps] = host.snapshot(label="branch boundary")


def branch_episode(host: RolloutHost | SlotHost, seed: int, *, steps, branches: int, episode_id: str | None = None,
                   attempt: int = 0, repeat: int = 0, first: int = 0) -> tuple[EpisodeResult, list[BranchValue]]:
    """Play episode `seed` (attempt, repeat: as recorded), keeping a capsule at each chunk start whose step
    is in `steps`, then `branch_value` from each, in step order (continuations `first` on). Steps that were no
    chunk start of the episode (past its end, between boundaries) get no value. The replay check runs at the first boundary
    (one exact replay shows the restore is exact for this host and episode). On a `SlotHost` the episode plays in
    its first slot, then every continuation of every boundary in the slots side by side (`branch_values_in_slots`)."""
    require_capturable(host)
    keeper = BoundaryCapsules(steps)
    watched = host.hosts[0] if isinstance(host, SlotHost) else host  # where the episode plays
    watched.observers.append(keeper)
    try:
        result = host.run_episode(seed, episode_id=episode_id, attempt=attempt, repeat=repeat)
        keeper.enabled = False
        expect = (bool(result.episode.meta.success), result.episode.meta.length)
        if isinstance(host, SlotHost):
            values = branch_values_in_slots(host, keeper.capsules, seed=seed, branches=branches, expect=expect,
                                            first=first)
        else:
            values = [branch_value(host, keeper.capsules[step], seed=seed, step=step, branches=branches,
                                   expect=expect if i == 0 else None, first=first)
                      for i, step in enumerate(sorted(keeper.capsules))]
    finally:
        watched.observers.remove(keeper)
    return result, values


@dataclass(frozen=True)
class BranchItem(WorkItem):
    """A recorded episode to play again (seed, attempt, repeat as recorded) and branch from: `branches`
    continuations from each chunk start in `steps`, numbered from `first`."""

    steps: tuple[int, ...] = ()
    branches: int = 1
    first: int = 0

    @property
    def plays(self) -> int:
        """The episode, the replay check and `branches` continuations from each boundary in `steps`."""
        return 2 + self.branches * len(self.steps)


class BranchActor(RolloutActor):
    """A rollout actor that plays `BranchItem`s: the episode again, then the branches (`branch_episode`).
    Its report's episode is the replay without images or step arrays (nothing is recorded; its metadata
    lets the driver check the replay is the recorded episode), `extra["branch_values"]` the values and
    `extra["branch_steps"]` the control steps played for them, replay included. With slots, the items of a call
    are played one after another, each item's continuations side by side."""

    side_by_side = False

    def _play(self, item: WorkItem) -> ActorReport:
        if not isinstance(item, BranchItem):
            raise TypeError(f"BranchActor plays BranchItems, got {type(item).__name__}")
        try:
            result, values = branch_episode(self.host, item.seed, steps=item.steps, branches=item.branches,
                                            episode_id=item.episode_id, attempt=item.attempt, repeat=item.repeat,
                                            first=item.first)
        except Exception as exc:  # a replay that diverged, a reset that raised: this item failed
            return ActorReport(None, "failed", 0.0, 0.0, f"{type(exc).__name__}: {exc}", os.getpid(), item, {},
                               self.index, node=self.node)
        episode = result.episode
        length = episode.meta.length
        # the episode, the check's replay from the first boundary, the branches
        played = length + (length - values[0].step if values else 0) + sum(v.steps_played for v in values)
        return ActorReport(episode=Episode({}, episode.meta, {}), reset_kind=result.reset_kind,
                           reset_ms=result.reset_ms, steps_per_s=result.steps_per_s, error=result.error,
                           actor_pid=os.getpid(), item=item,
                           extra={"branch_values": [v.to_json() for v in values], "branch_steps": played},
                           actor_index=self.index, node=self.node, steps=played)


def _ending(success: bool, length: int) -> str:
    return f"{'success' if success else 'failure'} at step {length}"
