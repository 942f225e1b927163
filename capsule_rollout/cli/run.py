"""`python -m capsule_rollout NAME [--field value ...] [--json PATH]`."""

from __future__ import annotations

import gc
import sys

from capsule_rollout.commands import registry
from capsule_rollout.commands.option_parsing import ConfigError, parse_config
from capsule_rollout.commands.result import ExperimentResult, UsageError, write_json
from capsule_rollout.extras import MissingExtraError
from capsule_rollout.stores.store_damage import StoreDamageError
from capsule_rollout.stores.writer_lock import WriterLockError
from capsule_rollout.user_code import UserCodeError


def _usage() -> str:
    lines = ["usage: python -m capsule_rollout NAME [--field value ...] [--json PATH]"]
    width = max(map(len, registry.names()))
    for group, experiments in registry.groups().items():
        lines += ["", f"{group}:"]
        lines += [f"  {e.name:<{width}}  {e.summary}" for e in experiments]
    lines.append("\n`python -m capsule_rollout NAME --help` lists a command's options.")
    return "\n".join(lines)


def parse(name: str, argv: list[str]) -> tuple[registry.Experiment, object, str | None]:
    """Resolve the experiment and its config from the command line."""
    experiment = registry.get(name)
    config, json_path = parse_config(experiment.config, argv, f"python -m capsule_rollout {name}", experiment.summary)
    return experiment, config, json_path


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    try:
        experiment, config, json_path = parse(argv[0], argv[1:])
    except (registry.UnknownExperimentError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # tyro: --help (0) or a malformed command line (2), already printed
        return int(exc.code or 0)
    try:
        result: ExperimentResult = experiment.load_runner()(config)
    except (UsageError, WriterLockError, MissingExtraError) as exc:  # a store another writes, or its lock unopenable
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except StoreDamageError as exc:  # recorded data that does not read back as written: not a usage error
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except UserCodeError as exc:  # the user's env, policy or critic raised: one line and the user's own frames
        print(f"error: {exc.details()}", file=sys.stderr)
        return 1
    if json_path:
        path = write_json(json_path, result.summary)
        print(f"summary written to {path}")
    return result.exit_code


def cli() -> None:
    """The `capsule-rollout` console script."""
    code = main()
    # Everything the command made is closed by now. Frozen, the objects alive at exit are left out of the
    # interpreter's last collections: its teardown after torch and Ray took about 1 s of a short run's end here.
    # atexit handlers and module teardown still run; finalizers of cyclic garbage alive at exit, which Python
    # does not promise anyway, may not.
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    cli()
