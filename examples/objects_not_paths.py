"""Your env factory and policy as Python objects, not import paths: a script's own functions and classes handed to
`record_rollouts`, played on 2 Ray actors (Ray ships them), and an episode replayed bit for bit with them given
again.

    python examples/objects_not_paths.py
"""

import gymnasium as gym
import numpy as np

from capsule_rollout.rollout import record_rollouts, replay_episode
from examples.own_env_and_policy import PuckToGoal


def make_env():  # defined here, in the script: no module for the actors to import it from
    return gym.wrappers.TimeLimit(PuckToGoal(), max_episode_steps=60)


class Nudge:
    """A chunk of 4 actions toward the goal, explored with the `noise` it is handed (so capsules replay it)."""

    chunk_length = 4

    def __init__(self, gain: float = 2.0) -> None:
        self.gain = gain

    def infer(self, obs, *, noise):
        s = obs["state"]
        return np.clip(self.gain * (s[4:6] - s[0:2]) + 0.3 * noise, -1.0, 1.0)


if __name__ == "__main__":
    run = record_rollouts("runs/objects", env=make_env, policy=Nudge, seeds=range(2), repeats=2, actors=2)
    print("episodes", run.summary["episodes"], "resets", run.summary["reset_kinds"])
    replayed = replay_episode(run.out, run.episode_ids[-1], named={"env": make_env, "policy": Nudge})
    print("replay bit-identical:", replayed.exact)
