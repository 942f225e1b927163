"""Registry of named experiments: name -> default config + runner (imported lazily).

A command registers by decorating its config class (`@command("name", "summary")`, next to the config in
`configs.py` / `bench_configs.py`); the runner is `experiments.<name>:run` unless named. Only the configs are
imported to list or parse commands (standard library only): a runner is imported when its command runs.
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


def register(experiment: Experiment) -> None:
    if experiment.name in _REGISTRY:
        raise ValueError(f"experiment {experiment.name!r} is registered twice")
    _REGISTRY[experiment.name] = experiment


def command(name: str, summary: str, runner: str = ""):
    """Class decorator: register the config class's defaults as command `name`."""

    def decorate(config_cls: type) -> type:
        register(Experiment(name, config_cls(), runner or f"capsule_rollout.experiments.{name}:run", summary))
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
