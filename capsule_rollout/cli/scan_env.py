"""scan_env: where does an env keep state outside MjData? Prints candidate capture declarations."""

from __future__ import annotations

from capsule_rollout.cli.console import make_console
from capsule_rollout.commands.configs import ScanEnvConfig
from capsule_rollout.commands.result import ExperimentResult, checking_inputs
from capsule_rollout.import_path import resolve


def run(config: ScanEnvConfig) -> ExperimentResult:
    from capsule_rollout.envs.hidden_state_scan import scan_env
    from capsule_rollout.envs.suites import parse_env_id

    with checking_inputs():
        suite, task = parse_env_id(config.env)
        if suite is not None:
            module = suite.load()
            if task not in module.tasks():
                raise ValueError(f"{suite.name} has no task {task!r}")
            capture = module.make(task)[1]

            def make():
                return module.make(task)[0]
        else:
            make = resolve(config.env, "env")
            capture = None
    report = scan_env(make, task=config.env, steps=config.steps, capture=capture)
    console = make_console()
    for line in report.lines():
        console.print(line, markup=False, highlight=False)
    return ExperimentResult({"env": config.env, "candidates": report.candidates, "declared": report.declared,
                             "live_views": report.live_views, "model_fields": report.model_fields,
                             "generators": report.generators, "wrappers": report.wrappers,
                             "seed_honoured": report.seed_honoured, "reset_deterministic": report.reset_deterministic,
                             "unsupported": report.unsupported})
