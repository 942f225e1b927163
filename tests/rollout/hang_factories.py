"""Envs and a policy that hang, crash or reset slowly, as a user's factories are (zero arguments), named on the
command line as `tests.rollout.hang_factories:<name>` (the actors import this module; run from the repository
root). Each misbehaves the same way on every attempt: in the episode of `HANG_SEED` (a seed of
`sim_rollout`'s held-out block), at a fixed step.

The env is `tests.envs.broken_envs.Boxes` (a MuJoCo box and puck, captured with nothing declared) whose
observation ends with two numbers: 1 in `HANG_SEED`'s episode (else 0), and the steps taken; the policy acts
from the noise it is handed (`tests.envs.user_factories.NoisePolicy`).
"""

from __future__ import annotations

import os
import time

import gymnasium as gym
import numpy as np

from tests.envs.broken_envs import Boxes
from tests.envs.user_factories import NoisePolicy

HANG_SEED = 1_000_001
HANG_STEP = 3
"""The env step that hangs (or exits) in `HANG_SEED`'s episode."""
HANG_CHUNK_STEP = 8
"""The chunk the policy hangs in, by the step it starts at (its second: 8 actions per chunk)."""
COLD_RESET_S = 2.0
"""How long every cold reset of `slow_cold_reset` takes (a procedurally generated scene's, scaled down)."""


class MarkedBoxes(Boxes):
    """`Boxes` whose observation shows whether this is `HANG_SEED`'s episode, and its step count."""

    def __init__(self) -> None:
        super().__init__()
        n = self.model.nq + self.model.nv + 2
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (n,), np.float64)
        self.marked, self.count = 0.0, 0

    def reset(self, *, seed=None, options=None):
        self.marked, self.count = float(seed == HANG_SEED), 0
        obs, info = super().reset(seed=seed, options=options)
        return self.observe(), info

    def observe(self):
        return np.append(super().observe(), [getattr(self, "marked", 0.0), getattr(self, "count", 0)])

    def step(self, action):
        if self.marked and self.count == HANG_STEP:
            self.misbehave()
        self.count += 1
        return super().step(action)

    def misbehave(self) -> None:
        pass


class HangsInStep(MarkedBoxes):
    def misbehave(self) -> None:
        while True:
            time.sleep(3600)


class ExitsInStep(MarkedBoxes):
    def misbehave(self) -> None:
        os._exit(1)  # a crash of the process (a segfault in native code would look the same to the driver)


class SlowColdReset(MarkedBoxes):
    """Every cold reset takes `COLD_RESET_S` (a restore takes what it always does)."""

    seconds = COLD_RESET_S

    def reset(self, *, seed=None, options=None):
        time.sleep(self.seconds)
        return super().reset(seed=seed, options=options)


class SlowColdReset35(SlowColdReset):
    """The issue's cold reset: 35 s (for the figures in BENCHMARKS, with the default deadlines)."""

    seconds = 35.0


class HangsInInfer(NoisePolicy):
    """Hangs in `infer` on `HANG_SEED`'s chunk that starts at `HANG_CHUNK_STEP`."""

    def infer(self, obs, *, noise):
        state = np.asarray(obs["state"]).reshape(-1)
        if state[-2] == 1.0 and int(state[-1]) == HANG_CHUNK_STEP:
            while True:
                time.sleep(3600)
        return super().infer(obs, noise=noise)


marked = MarkedBoxes
hangs_in_step = HangsInStep
exits_in_step = ExitsInStep
slow_cold_reset = SlowColdReset
slow_cold_reset_35s = SlowColdReset35
hangs_in_infer = HangsInInfer
