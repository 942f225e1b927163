"""Branch values: Monte-Carlo values of a recorded state, from continuations played out of its capsule.

A capsule taken at a chunk boundary (`RolloutHost.snapshot`) holds the whole host: env, policy
(its noise state included), critic, action queue and hand-off. `branch_value` first replays it
with the episode's own noise, which must end exactly as the episode did (a restore that is not
bit-exact is refused, `ReplayDivergedError`), then plays `branches` continuations, each with a
fresh noise seed (`branch_seed`), and returns how many succeeded and their mean return from the
boundary on. The success fraction estimates the state's success probability under the policy.
`value_ceiling` judges critics with it; branch value targets and advantage labels are to use the
same routine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from capsules import Capsule
from rollout import episode_schema as S
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


def _ending(success: bool, length: int) -> str:
    return f"{'success' if success else 'failure'} at step {length}"
