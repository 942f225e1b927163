"""Branch values: Monte-Carlo values of a recorded state, from continuations played out of its capsule.

A capsule taken at a chunk boundary (`RolloutHost.snapshot`) holds the whole host: env, policy
(its noise state included), critic, action queue and hand-off. `branch_value` first replays it
with the episode's own noise, which must end exactly as the episode did (a restore that is not
bit-exact is refused, `ReplayDivergedError`), then plays `branches` continuations, each with a
fresh noise seed (`branch_seed`), and returns how many succeeded and their mean return from the
boundary on. The success fraction estimates the state's success probability under the policy.
`value_ceiling` judges critics with it; branch value targets and advantage labels are to use the
same routine. `branch_episode` plays an episode and branches from the chunk boundaries asked for
(a recorded episode is played again from its seed: the same episode, bit for bit).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from capsules import Capsule
from rollout import episode_schema as S
from rollout.host_config import EpisodeResult
from rollout.observer import EpisodeObserver
from rollout.rollout_host import RolloutHost


class ReplayDivergedError(RuntimeError):
    """Replaying an episode from its own capsule did not reproduce it: a restore is not exact."""


def branch_seed(seed: int, branch: int) -> int:
    """Noise seed of branch `branch` from episode `seed` (distinct from every episode's own)."""
    return (1 + seed * 1009 + branch) | (1 << 61)


@dataclass(frozen=True)
class BranchValue:
    step: int  # the control step of the boundary the branches start from
    branches: int
    successes: int
    mean_return: float  # the branches' mean sum of rewards from the boundary to their end

    @property
    def success_fraction(self) -> float:
        return self.successes / self.branches


def branch_value(host: RolloutHost, capsule: Capsule, *, seed: int, step: int, branches: int,
                 expect: tuple[bool, int] | None = None) -> BranchValue:
    """Play `branches` continuations of episode `seed` from `capsule` (taken at control step `step`).

    `expect`: the episode's (success, length); when given, the capsule is first replayed with the
    episode's own noise and must end the same way (else `ReplayDivergedError`).
    """
    if branches < 1:
        raise ValueError(f"branches must be >= 1, got {branches}")

    def play(noise_seed: int | None) -> tuple[bool, int, float]:
        result = host.branch(capsule, seed=seed, noise_seed=noise_seed)
        return bool(result.episode.meta.success), host.env.steps, float(np.sum(result.episode.steps[S.REWARD]))

    if expect is not None:
        success, length, _ = play(None)
        if (success, length) != tuple(expect):
            raise ReplayDivergedError(
                f"seed {seed}: replaying from the step-{step} capsule with the episode's own noise did not end as "
                f"the episode did ({_ending(success, length)} against {_ending(*expect)}); run verify_capsule")
    outcomes = [play(branch_seed(seed, b)) for b in range(branches)]
    return BranchValue(step=step, branches=branches, successes=sum(o[0] for o in outcomes),
                       mean_return=float(np.mean([o[2] for o in outcomes])))


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


def branch_episode(host: RolloutHost, seed: int, *, steps, branches: int, episode_id: str | None = None,
                   attempt: int = 0, repeat: int = 0) -> tuple[EpisodeResult, list[BranchValue]]:
    """Play episode `seed` (attempt, repeat: as recorded), keeping a capsule at each chunk start whose step
    is in `steps`, then `branch_value` from each, in step order. Steps that were no chunk start of the
    episode (past its end, between boundaries) get no value. The replay check runs at the first boundary
    (one exact replay shows the restore is exact for this host and episode)."""
    keeper = BoundaryCapsules(steps)
    host.observers.append(keeper)
    try:
        result = host.run_episode(seed, episode_id=episode_id, attempt=attempt, repeat=repeat)
        keeper.enabled = False
        expect = (bool(result.episode.meta.success), result.episode.meta.length)
        values = [branch_value(host, keeper.capsules[step], seed=seed, step=step, branches=branches,
                               expect=expect if i == 0 else None)
                  for i, step in enumerate(sorted(keeper.capsules))]
    finally:
        host.observers.remove(keeper)
    return result, values


def _ending(success: bool, length: int) -> str:
    return f"{'success' if success else 'failure'} at step {length}"
