"""The rollout host's configuration and the values it hands back.

`HostConfig` (what a host is told), `Phase` (its state machine), `Tick` (one control
step), `EpisodeResult` (one episode), `SafetyStop` (a check stopping an episode), and
the two naming rules every process shares: the capsule key of a (task, seed) and the
policy's noise seed of an episode.
"""

from __future__ import annotations

import enum
import os
import re
import zlib
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from capsule_rollout.stores.episode import Episode


class Phase(str, enum.Enum):
    IDLE = "idle"
    RESET = "reset"
    RUNNING = "running"
    STOP_INFER = "stop_infer"
    RECORD = "record"


ALLOWED_TRANSITIONS = {
    Phase.IDLE: {Phase.RESET},
    Phase.RESET: {Phase.RUNNING, Phase.STOP_INFER},  # a reset can fail: error, recorded if there were steps
    Phase.RUNNING: {Phase.STOP_INFER},
    Phase.STOP_INFER: {Phase.RECORD},
    Phase.RECORD: {Phase.RESET, Phase.IDLE},
}


class SafetyStop(Exception):
    """Raised by a safety check: the episode stops with stop reason `safety`."""


@dataclass(frozen=True)
class HostConfig:
    """How one host plays each episode (`RunSpec.host`): the receding horizon, when to stop, the planner's
    cadence, the noise seed, what is recorded."""

    n_exec: int = 8
    """Actions of each chunk executed before the next inference (receding horizon)."""
    value_threshold: float | None = None
    """Stop when the critic's value is below this for `value_patience` consecutive chunks (None: never)."""
    value_patience: int = 3
    """M: consecutive low-value chunks before stopping."""
    max_steps: int | None = None
    """Timeout in control steps (None: the env's limit)."""
    planner_every: int = 1
    """Control steps between planner updates (the planner's rate)."""
    phrasing: str = "canonical"
    """How the scripted planner words each subtask: the env's own text, or a style the env's `phrase` knows
    (the tabletop's "train" / "heldout" paraphrases; the same one every time that subtask is published)."""
    noise_seed: int = 0
    """Base seed of the policy's per-episode noise."""
    pin_seeds: tuple[int, ...] = ()
    """Seeds whose initial capsules stay pinned in the store (a fixed evaluation set)."""
    record_images: bool = True
    """Record the cameras' images in each episode."""
    lanes: Literal["auto", "two", "serial"] = "auto"
    """Run policy and critic on two lanes at once, or one after the other on one; `auto`: two lanes on a GPU, or
    on the CPU when the process has two cores or more for torch, else one after the other (a second lane without
    a core of its own only adds its thread's switching: `bench_slots`). Not part of what is played."""
    images_on_demand: bool = True
    """With an env that can leave images out of an observation (`images_wanted`), render them only for the steps
    that read them: chunk starts, recorded images, observers that declare `needs_images`. The episode is the
    same either way."""

    def __post_init__(self) -> None:
        if self.n_exec < 1 or self.value_patience < 1 or self.planner_every < 1:
            raise ValueError("n_exec, value_patience and planner_every must be >= 1")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1 or None, got {self.max_steps}")
        if self.lanes not in ("auto", "two", "serial"):
            raise ValueError(f"lanes must be 'auto', 'two' or 'serial', got {self.lanes!r}")


def two_lanes(config: HostConfig, device) -> bool:
    """Whether the policy and critic run on two lanes at once (`HostConfig.lanes`; `auto` decided now)."""
    if config.lanes != "auto":
        return config.lanes == "two"
    if torch.device(device).type != "cpu":
        return True
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(cores, torch.get_num_threads()) >= 2


@dataclass(slots=True)
class Tick:
    """What one control step did (see `RolloutHost.tick`)."""

    new_chunk: bool
    value: float
    low_value: bool = False
    proposed: np.ndarray | None = None
    action: np.ndarray | None = None
    subtask_id: int = 0
    obs: dict | None = None
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict | None = None
    intervention: bool = False


@dataclass
class EpisodeResult:
    episode: Episode | None  # None only when the episode failed before its first step
    reset_kind: str  # "restore", "cold", "physical" (a robot) or "branch"
    reset_ms: float
    run_s: float
    steps_per_s: float
    error: str = ""
    transitions: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)  # observers' per-episode results (by observer name)
    exception: BaseException | None = field(default=None, repr=False, compare=False)
    """What ended the episode with an error (its text is `error`), for callers that act on its type."""
    initial_capsule: object = field(default=None, repr=False, compare=False)
    """The capsule the episode started from (`capsules.Capsule`; a branch: the one it was restored from)."""

    @property
    def meta(self):
        return self.episode.meta


_ATTEMPT_MIX, _REPEAT_MIX = 0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F


def episode_noise_seed(noise_seed: int, task: str, seed: int, attempt: int = 0, repeat: int = 0) -> int:
    """The policy's noise seed for one episode (stable across processes, hosts and runs).

    `attempt` / `repeat` > 0: a retry of a failed episode / another rollout from the same
    initial state, each with noise of its own."""
    return (noise_seed * 1_000_003 + zlib.crc32(task.encode()) * 7919 + seed
            + attempt * _ATTEMPT_MIX + repeat * _REPEAT_MIX) % (2**62)


def capsule_key(task: str, seed: int) -> str:
    return f"{task}/s{seed:07d}"


def file_safe(text: str) -> str:
    """`text` as a file-system-safe name: every character but letters, digits, `.`, `_` and `-` as `_`
    (`mylab.envs:make_env` -> `mylab.envs_make_env`, `gymnasium:Pusher-v5` -> `gymnasium_Pusher-v5`)."""
    return _UNSAFE.sub("_", text)


def episode_id(task: str, seed: int) -> str:
    """The id of a seed's first episode of `task`: `<task, file-system-safe>-s<seed>` (runs recorded before ids
    were made safe keep theirs: `rollout.record.OpenedRun.legacy_ids`)."""
    return f"{file_safe(task)}-s{seed:07d}"


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
