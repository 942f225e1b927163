"""The critic side of the rollout protocol: what `RolloutHost` needs from a value critic.

Optional for a host: without one, every value is recorded as NaN and there is no
low-value stop. A critic is a capsule component like the policy: it reads the
observation (and the episode step: values depend on the time left) and fills a
static value slot, on the critic lane while the policy runs on its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from capsule_rollout.capsules import CapsuleComponent


@dataclass(frozen=True)
class CriticSpec:
    observation_keys: tuple[str, ...]
    """Keys of the env's observation this critic reads (e.g. `image_front`, `state`)."""


@runtime_checkable
class RolloutCritic(CapsuleComponent, Protocol):
    """Required: `spec`, `load_observation`, `evaluate`. Optional: `set_language(text)`,
    `reset(episode_seed)` (a critic with randomness of its own)."""

    spec: CriticSpec

    def load_observation(self, obs: Mapping[str, Any], step: int) -> None:
        """Validate and copy the observation's `spec.observation_keys`; `step`: control steps so far."""
        ...

    def evaluate(self) -> torch.Tensor:
        """The value of the loaded observation, `(1,)` (a view of a static buffer)."""
        ...
