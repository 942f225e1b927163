"""The options of a recorded run as a library call (`record_rollouts`), in a few small typed groups, each field
with its meaning and default: how the policy acts (`Acting`, the command line's `--act.*` too), how each episode is
played (`Episodes`), what is recorded (`Recording`), where and how the hosts run (`Placement`), and what a run does
about hangs and crashes (`Faults`). Standard library only: the command line imports `Acting` for its `--help`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

from capsule_rollout.input_bounds import check_finite

ADVANTAGE = Literal["checkpoint", "none", "positive"]  # rollout.host_factory.ADVANTAGE_CHOICES


def check_noise_scale_option(noise_scale: float | None, option: str = "noise_scale") -> None:
    """An optional noise scale option: None, or a finite number >= 0 (`policies.conditioning.check_noise_scale`,
    kept here in the standard library for the command line)."""
    if noise_scale is not None and not (math.isfinite(noise_scale) and noise_scale >= 0):
        raise ValueError(f"{option} must be a finite number >= 0 (got {noise_scale})")


@dataclass(frozen=True)
class Acting:
    """How the policy acts: its RECAP conditioning and its receding horizon."""

    advantage: ADVANTAGE = "checkpoint"
    """RECAP indicator to act with: checkpoint = what the checkpoint records (a RECAP policy: positive, with
    the guidance weight recap chose; a BC policy: none), or none / positive."""
    beta: float | None = None
    """Classifier-free guidance weight over the positive indicator: overrides the checkpoint's; with advantage
    positive, None = the conditioned policy alone."""
    n_exec: int | None = None
    """Actions of each chunk executed before the next inference (receding horizon); None: what the policy
    checkpoint records (`export_checkpoint --n_exec`), the chunk length for a factory's policy, else 8."""
    noise_scale: float | None = None
    """Scale of the policy's chunk noise, a sampling temperature (1: the learned distribution; 0: one chunk
    per observation); None: what the policy checkpoint records (`export_checkpoint --noise_scale`), else 1."""

    def __post_init__(self) -> None:
        if self.n_exec is not None and self.n_exec < 1:
            raise ValueError(f"n_exec must be >= 1 (got {self.n_exec})")
        check_noise_scale_option(self.noise_scale)
        check_finite(self.beta, "beta", "none: the conditioned policy alone")
        if self.beta is not None and not self.beta > 0:
            raise ValueError(f"beta must be > 0 (got {self.beta})")
        if self.beta is not None and self.advantage == "none":
            raise ValueError("beta (> 0) guides towards the positive indicator: not with --advantage none")


@dataclass(frozen=True)
class Episodes:
    """How each episode is played, and tried again."""

    max_steps: int | None = None
    """Control steps an episode may take at most (None: the env's own limit, which also caps this)."""
    value_threshold: float | None = None
    """Stop when the critic's value stays below this for `value_patience` chunks (None: never; needs a critic)."""
    value_patience: int = 3
    """Consecutive low-value chunks before stopping."""
    attempts: int = 1
    """Tries per rollout: a failed one is retried from its initial capsule with new noise, up to this many times
    in all (ids get -a1, -a2...; each attempt is recorded; needs a noise scale > 0)."""

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.value_patience < 1:
            raise ValueError(f"attempts and value_patience must be >= 1, got {self.attempts}, {self.value_patience}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1 or None, got {self.max_steps}")


@dataclass(frozen=True)
class Recording:
    """What is recorded of each episode, and where."""

    cameras: Sequence[str] | None = None
    """Cameras rendered (and recorded), by the env's names; (): no images; None: what the policy and critic read
    (the env's default camera for one that does not say)."""
    image_size: int | None = None
    """Side of the rendered images in pixels (None: what the policy and critic were made for, else 64)."""
    observers: Sequence[str] = ()
    """Episode observers built in every actor, each `package.module:factory` or `package.module:factory={JSON
    kwargs}` (called as factory(**kwargs); its hooks: `rollout.observer.EpisodeObserver`)."""
    shards: bool = False
    """Record sharded: each actor writes its episodes to its own shard of the store and the driver commits a
    manifest entry per episode (readers see one store)."""


@dataclass(frozen=True)
class Placement:
    """Where and how the hosts run: slots, threads, devices, how items are handed out."""

    slots: int = 1
    """Env slots per actor: episodes played side by side in one process, their policy and critic calls batched
    into one per round; a run resumes with the slots it was made with."""
    env_threads: int = 1
    """Threads stepping each actor's slots between batched calls (does not change what is played)."""
    lanes: Literal["auto", "two", "serial"] = "auto"
    """Policy and critic on two lanes at once, or one after the other; auto: two on a GPU or with 2+ cores for
    torch (what is played is the same)."""
    batch_invariant: bool = True
    """The project's policy and critic batch-invariant: an episode the same at any slot count; False: the network
    over the batch as it is (faster, episodes that change with the slots)."""
    cpus_per_actor: float = 1.0
    """Ray CPU resources per actor (its torch threads too)."""
    gpus_per_actor: float = 0.0
    """Ray GPU fraction per actor (the policy and critic then run on CUDA)."""
    pin_cores: bool = False
    """Pin actor i to CPU core i."""
    pin_seeds: Sequence[int] = ()
    """Seeds whose initial capsules stay pinned in every actor's store (a fixed evaluation set)."""
    capsule_budget_mb: float | None = None
    """Memory budget of each actor's capsule store (None: unbounded); past it, the least recently used capsules
    are dropped and read back from the run's capsules/ when needed."""
    episodes_per_call: int = 1
    """Episodes handed to an actor in one Ray call; with slots, at least 4 per slot."""

    def __post_init__(self) -> None:
        if self.slots < 1 or self.env_threads < 1 or self.episodes_per_call < 1:
            raise ValueError(f"slots, env_threads and episodes_per_call must be >= 1, got {self.slots}, "
                             f"{self.env_threads}, {self.episodes_per_call}")


@dataclass(frozen=True)
class Faults:
    """What a run does about hangs and crashes."""

    max_restarts: int = 3
    """Restarts an actor gets after it dies on its own (a crash; a kill for a hang does not count)."""
    episode_timeout_s: float | None = None
    """None: deadlines per phase, each 3 x the longest time the actors measured for it, at least
    `deadline_floor_s` (`rollout.deadlines`); a number: seconds an episode may run instead; 0: no deadline."""
    first_call_s: float = 600.0
    """The deadline of a phase no actor has measured yet, and the most a phase's first occurrence in a process
    (a first compile) may take."""
    deadline_floor_s: float = 30.0
    """The shortest deadline of a phase (a GC pause or a slow disk is no hang)."""


GROUPS = (Acting, Episodes, Recording, Placement, Faults)


def as_group(group: type, given: Any, name: str) -> Any:
    """`given` as an instance of `group`: one already, or a mapping of its fields (`acting={"n_exec": 4}`); a
    field it does not have is named in one line."""
    if isinstance(given, group):
        return given
    if isinstance(given, Mapping):
        known = {f.name for f in fields(group)}
        unknown = sorted(set(given) - known)
        if unknown:
            raise TypeError(f"{name}: {group.__name__} has no field {unknown[0]!r}; its fields: {', '.join(sorted(known))}")
        return group(**given)
    raise TypeError(f"{name}: give a {group.__name__} or a dict of its fields, got {type(given).__name__}")
