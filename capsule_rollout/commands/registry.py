"""Registry of the named commands: name -> default config + runner (imported lazily), and the groups `--help` lists
them in.

A command registers by decorating its config class (`@command("name", "summary")`, next to the config in
`configs.py` and its siblings); the runner is `cli.<name>:run` unless named. Only the configs are
imported to list or parse commands (standard library only): a runner is imported when its command runs. The
project's benchmarks are no commands: they live apart from the package (`benchmarks/` in the repository).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from capsule_rollout.commands.result import ExperimentResult
from capsule_rollout.import_path import resolve


class UnknownExperimentError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Experiment:
    name: str
    config: Any  # the default config (a frozen dataclass instance)
    runner: str  # "module:function"; imported only when the experiment runs
    summary: str

    def load_runner(self) -> Callable[[Any], ExperimentResult]:
        return resolve(self.runner, f"the runner of {self.name}")


_REGISTRY: dict[str, Experiment] = {}

# What users do, in the order `--help` lists it; each command in one group, in the order a user meets it
GROUPS: dict[str, tuple[str, ...]] = {
    "run and replay": ("sim_rollout", "replay", "eval_policy", "serve_policy"),
    "inspect and verify": ("verify_capsule", "verify_store", "scan_env"),
    "data": ("collect_demos", "consolidate", "export_lerobot", "import_lerobot"),
    "robot": ("real_recap", "sim_robot_server"),
    "learning": ("train_policy", "train_critic", "train_state_policy", "export_checkpoint", "label_advantages", "recap",
                 "recap_study", "value_ceiling"),
}


def register(experiment: Experiment) -> None:
    if experiment.name in _REGISTRY:
        raise ValueError(f"experiment {experiment.name!r} is registered twice")
    _REGISTRY[experiment.name] = experiment


def command(name: str, summary: str, runner: str = ""):
    """Class decorator: register the config class's defaults as command `name`."""

    def decorate(config_cls: type) -> type:
        register(Experiment(name, config_cls(), runner or f"capsule_rollout.cli.{name}:run", summary))
        return config_cls

    return decorate


def _registered() -> dict[str, Experiment]:
    import capsule_rollout.commands.configs  # noqa: F401 - importing the configs registers every command

    return _REGISTRY


def get(name: str) -> Experiment:
    registry = _registered()
    try:
        return registry[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(registry), n=3, cutoff=0.5)
        hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
        raise UnknownExperimentError(
            f"unknown experiment {name!r}; {hint}known: {', '.join(sorted(registry))}"
        ) from None


def names() -> list[str]:
    return sorted(_registered())


def groups() -> dict[str, list[Experiment]]:
    """Every command under its group (`GROUPS`), in the groups' order; one no group names comes last, under
    "other", so that `--help` never hides a command."""
    registry = _registered()
    out = {group: [registry[name] for name in members if name in registry] for group, members in GROUPS.items()}
    placed = {name for members in GROUPS.values() for name in members}
    other = [registry[name] for name in sorted(registry) if name not in placed]
    return {**out, **({"other": other} if other else {})}
