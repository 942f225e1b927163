"""collect_demos: scripted-expert episodes to a zarr store or .npz files (`learning.demo_sources`; the tabletop's
expert in `tabletop.expert_demos`)."""

from __future__ import annotations

from capsule_rollout.cli.console import make_console
from capsule_rollout.commands.configs import CollectDemosConfig
from capsule_rollout.commands.result import ExperimentResult, checking_inputs
from capsule_rollout.input_bounds import check_output_dir
from capsule_rollout.learning.demo_sources import collect_demos
from capsule_rollout.tabletop.expert_demos import demo_source


def run(config: CollectDemosConfig) -> ExperimentResult:
    with checking_inputs():
        check_output_dir(config.out)
        source = demo_source(config)
    summary = collect_demos(config, source)
    episodes, skipped = summary["episodes"], summary["skipped_already_recorded"]
    if episodes:
        done = (f"followed the coaching {summary['plan_completed'] / episodes:.1%} (the env's own goal is not met)"
                if config.coach else f"success {summary['success_rate']:.1%}")
        make_console().print(
            f"{episodes} episodes ({skipped} already recorded), {done}, "
            f"{summary['steps_per_s'] or 0:.0f} steps/s -> {config.out}")
    else:  # a resumed run: no rate to report over zero new episodes
        make_console().print(f"all {skipped} episodes already recorded in {config.out}")
    return ExperimentResult(summary)
