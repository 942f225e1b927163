"""A benchmark's command line: its options from its config (parsed as the package's commands parse theirs: tyro,
docstrings as help, "did you mean"), its run, and the summary `--json PATH` writes; the exit status."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from capsule_rollout.commands.option_parsing import ConfigError, parse_config
from capsule_rollout.commands.result import ExperimentResult, UsageError, write_json
from capsule_rollout.extras import MissingExtraError


def main(defaults: Any, run: Callable[[Any], ExperimentResult], module: str, doc: str | None,
         argv: list[str] | None = None) -> int:
    """Parse `argv` (default: the process's) into a config from `defaults`, run it, write `--json`; the exit status
    (2: a bad command line or input, else the run's). `module` is the benchmark's (`benchmarks.capsules`), `doc` its
    docstring, whose first paragraph `--help` shows."""
    argv = list(sys.argv[1:] if argv is None else argv)
    summary = " ".join((doc or "").split("\n\n")[0].split())
    try:
        config, json_path = parse_config(defaults, argv, f"python -m {module}", summary)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # tyro: --help (0) or a malformed command line (2), already printed
        return int(exc.code or 0)
    try:
        result = run(config)
    except (UsageError, MissingExtraError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if json_path:
        print(f"summary written to {write_json(json_path, result.summary)}")
    return result.exit_code
