"""Fault injection for tests, from outside the production code: an observer that kills, hangs or breaks
the CUDA context of the process playing one episode at one step, and an actor subclass that dies right
after writing an episode to its shard. Each fault happens once: it leaves a marker file.

On the command line: `sim_rollout --observers 'tests.rollout.faults:step_fault={"episode": ..., "step": 3,
"marker": "/tmp/m", "mode": "exit"}'` (the actors import this module; run from the repository root)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

from capsule_rollout.rollout.observer import EpisodeObserver
from capsule_rollout.rollout.rollout_actor import RolloutActor

MODES = ("exit", "hang", "cuda_error")


class StepFault(EpisodeObserver):
    """At control step `step` of episode `episode`: exit the process (`exit`), hang forever (`hang`), or raise
    what a dead CUDA context raises (`cuda_error`)."""

    name = "fault"

    def __init__(self, episode: str, step: int, marker: str, mode: str = "exit") -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.episode, self.step_at, self.marker, self.mode = episode, int(step), Path(marker), mode

    def step(self, host, tick) -> None:
        if host.episode_id != self.episode or host.env.steps != self.step_at or self.marker.exists():
            return
        self.marker.write_text(f"{self.mode}\n")
        if self.mode == "hang":
            while True:
                time.sleep(3600)
        if self.mode == "cuda_error":
            raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")
        os._exit(1)


def step_fault(**kwargs) -> StepFault:
    return StepFault(**kwargs)


def observer_spec(episode: str, step: int, marker: str | Path, mode: str = "exit") -> tuple[str, str]:
    """The `RunSpec.observers` entry that arms a `StepFault` in every actor."""
    return ("tests.rollout.faults:step_fault",
            json.dumps({"episode": episode, "step": step, "marker": str(marker), "mode": mode}))


def cli_option(episode: str, step: int, marker: str | Path, mode: str = "exit") -> list[str]:
    path, kwargs = observer_spec(episode, step, marker, mode)
    return ["--observers", f"{path}={kwargs}"]


class ExitAfterRecord(RolloutActor):
    """Dies once, right after episode `victim` is played and written to this actor's shard, before the driver
    hears of it (what a node lost at the worst moment does). `victim` and `marker` come from the class
    attributes a test sets on a subclass (`type(..., (ExitAfterRecord,), {...})`)."""

    victim = ""
    marker = ""

    def run_batch(self, items, watch=None):
        reports = super().run_batch(items, watch)
        if any(item.episode_id == self.victim for item in items) and not Path(self.marker).exists():
            Path(self.marker).write_text("exit_after_record\n")
            os._exit(1)
        return reports
