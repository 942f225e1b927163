"""label_advantages: RECAP advantage labels for a zarr store, written as a sidecar next to it
(`learning.advantage_labels`; `<store>.advantage.npz` or `--out`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from capsule_rollout.cli.console import make_console
from capsule_rollout.cli.paths import resolve_input
from capsule_rollout.commands.configs import LabelAdvantagesConfig
from capsule_rollout.commands.result import ExperimentResult, checking_inputs
from capsule_rollout.critics.advantage import INDICATOR_POSITIVE
from capsule_rollout.learning.advantage_labels import label_store
from capsule_rollout.learning.recap_recipe import load_recipe


def run(config: LabelAdvantagesConfig) -> ExperimentResult:
    console = make_console()
    with checking_inputs():
        critic = load_recipe(config.recipe).store_critic(Path(resolve_input(config.critic)))
    done = label_store(critic, config.data, n=config.n, max_steps=config.max_steps,
                       positive_fraction=config.positive_fraction, out=config.out or None, critic_name=config.critic)
    labels, steps = done.labels, int(len(done.values))
    pos = float(np.mean(labels.indicator == INDICATOR_POSITIVE))
    console.print(f"{done.episodes} episodes, {steps} steps: {pos:.0%} positive; thresholds "
                  + ", ".join(f"{t} {v:+.3f}" for t, v in labels.thresholds.items()) + f" -> {done.sidecar}")
    return ExperimentResult({"sidecar": str(done.sidecar), "episodes": done.episodes, "steps": steps,
                             "positive_fraction": pos, "thresholds": labels.thresholds})
