"""`EpisodeObserver`: what attaches to the one episode loop (`RolloutHost`) instead of copying it.

Metrics, extra critics, failure classifiers and branch points subscribe to these
hooks. They run in the control loop, so keep them cheap; an observer must not
change the host's state (it may read it, and `host.snapshot()` at `chunk_start`).
Per-episode results go into `result.extra[name]` at `episode_end` (they travel back
from Ray actors with the episode).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the host imports this module
    from capsule_rollout.rollout.rollout_host import EpisodeResult, RolloutHost, Tick


class EpisodeObserver:
    """Every hook is optional: subclass and override what you need."""

    name: str = "observer"

    def episode_start(self, host: RolloutHost, seed: int) -> None:
        """After the reset (or a branch's restore), before the first step."""

    def chunk_start(self, host: RolloutHost, obs: dict) -> None:
        """At a committed chunk boundary, before the policy is asked: `host.snapshot()` here
        restores to exactly this point (`host.branch`)."""

    def chunk(self, host: RolloutHost, chunk: np.ndarray) -> None:
        """The chunk `(T, A)` the policy proposed, before any of it runs (the critic's value is in
        `host.value`)."""

    def step(self, host: RolloutHost, tick: Tick) -> None:
        """After each env step (`tick.obs`, `tick.info` are the step's result)."""

    def episode_end(self, host: RolloutHost, result: EpisodeResult) -> None:
        """After the episode ended (and before it is recorded); add results to `result.extra`."""
