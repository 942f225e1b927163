"""recap: the RECAP loop in sim, measured on fixed held-out seeds every iteration (`learning.recap_loop`,
whose docstring says what each iteration does)."""

from __future__ import annotations

from capsule_rollout.cli.console import make_console
from capsule_rollout.cli.recap_report import report_iteration
from capsule_rollout.commands.configs import RecapConfig
from capsule_rollout.commands.result import ExperimentResult
from capsule_rollout.learning.recap_loop import recap_loop, resumable_store
from capsule_rollout.learning.recap_recipe import load_recipe


def run(config: RecapConfig) -> ExperimentResult:
    console = make_console()
    try:
        recipe = load_recipe(config.recipe)
        resumable_store(config, recipe)
    except ValueError as exc:  # a bad --recipe (an ImportPathError is one) or a store of other cameras
        raise SystemExit(f"error: {exc}") from None
    return ExperimentResult(recap_loop(config, log=console.print, report=lambda it: report_iteration(console, it),
                                       recipe=recipe))
