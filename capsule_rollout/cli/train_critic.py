"""train_critic: the distributional value critic from a zarr store of episodes (`tabletop.fit_critic`)."""

from __future__ import annotations

from capsule_rollout.cli.console import make_console
from capsule_rollout.cli.paths import resolve_input
from capsule_rollout.commands.configs import TrainCriticConfig
from capsule_rollout.commands.result import ExperimentResult, checking_inputs
from capsule_rollout.tabletop.fit_critic import fit_critic, privileged_dim


def run(config: TrainCriticConfig) -> ExperimentResult:
    init = resolve_input(config.init_policy) if config.init_policy else ""
    with checking_inputs():  # a --privileged critic on a store without the sim's state: said before anything
        privileged_dim(config)
    return ExperimentResult(fit_critic(config, init_policy=init, log=make_console().print))
