"""RECAP conditioning of a policy: the advantage indicator it acts with and the classifier-free guidance weight,
as a checkpoint records them (`CONDITIONING_INFO`) and as a command overrides them (`resolve_conditioning`).
A policy that takes conditioning implements `rollout_policy.AdvantageConditioned`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from capsule_rollout.policies.rollout_policy import ADV_NONE, ADV_POSITIVE

ADVANTAGE_MODES = {"none": ADV_NONE, "positive": ADV_POSITIVE}
CONDITIONING_INFO = "conditioning"  # checkpoint info key: {"advantage": "none" | "positive", "beta": float | None}


@dataclass(frozen=True)
class Conditioning:
    """How a policy acts: the RECAP indicator and the classifier-free guidance weight (None: no guidance)."""

    advantage: str = "none"
    beta: float | None = None

    def __post_init__(self) -> None:
        if self.advantage not in ADVANTAGE_MODES:
            raise ValueError(f"advantage must be one of {sorted(ADVANTAGE_MODES)}, got {self.advantage!r}")
        if self.beta is not None and (self.advantage != "positive" or not self.beta > 0):
            raise ValueError(f"guidance weight {self.beta}: guidance needs advantage 'positive' and a weight > 0")

    @property
    def indicator(self) -> int:
        return ADVANTAGE_MODES[self.advantage]

    def to_json(self) -> dict:
        return {"advantage": self.advantage, "beta": self.beta}


def checkpoint_conditioning(directory: str) -> Conditioning:
    """The conditioning a checkpoint records (RECAP training and `recap`'s guidance choice); none else."""
    from capsule_rollout.models.checkpoint import Checkpoint

    info = Checkpoint(directory).meta.get("info", {}).get(CONDITIONING_INFO) or {}
    return Conditioning(info.get("advantage", "none"), info.get("beta"))


def resolve_conditioning(directory: str, advantage: str = "checkpoint", beta: float | None = None) -> Conditioning:
    """What to act with: `advantage` "checkpoint" takes the checkpoint's record (with `beta`, when
    given, overriding its weight); "none" / "positive" are explicit, with `beta` or no guidance."""
    if advantage == "checkpoint":
        recorded = checkpoint_conditioning(directory)
        if beta is None:
            return recorded
        if recorded.advantage == "none":
            raise ValueError(f"--beta {beta}: the checkpoint {directory} was not trained with advantage labels; "
                             "pass --advantage positive to act with the indicator anyway")
        return Conditioning("positive", beta)
    return Conditioning(advantage, beta)


def check_noise_scale(noise_scale: float) -> None:
    """A noise scale is a finite number >= 0 (`PolicyRuntime`, and what commands record or are given)."""
    if not (math.isfinite(noise_scale) and noise_scale >= 0):
        raise ValueError(f"noise_scale must be a finite number >= 0, got {noise_scale}")
