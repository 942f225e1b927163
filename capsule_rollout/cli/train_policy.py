"""train_policy: flow-matching behaviour cloning from a zarr store of episodes (`tabletop.fit_policy`)."""

from __future__ import annotations

import numpy as np

from capsule_rollout.cli.console import make_console
from capsule_rollout.commands.configs import TrainPolicyConfig
from capsule_rollout.commands.result import ExperimentResult
from capsule_rollout.tabletop.fit_policy import fit_policy


def run(config: TrainPolicyConfig, advantage: np.ndarray | None = None) -> ExperimentResult:
    """`advantage`: per-step indicators (RECAP labels) aligned with the store's steps, or None."""
    return ExperimentResult(fit_policy(config, advantage, log=make_console().print))
