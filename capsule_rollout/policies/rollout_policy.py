"""The policy side of the rollout protocol: what `RolloutHost` needs from a policy.

A policy is a capsule component (its committed state, e.g. the noise generator and
the language embedding, lives in arena buffers) that turns the env's observation
into a chunk of actions: `load_observation(obs)`, then `act()` fills a static
`(chunk_length, action_dim)` buffer and returns it (`(1, T, A)` is accepted too).
`reset(episode_seed)` starts an episode's noise: the policy seeds itself, so a
(task, seed) pair gives the same episode on any host, in any order. Language and
RECAP conditioning are optional methods a host calls only when present.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from capsule_rollout.capsules import CapsuleComponent

ADV_NONE, ADV_POSITIVE, ADV_NEGATIVE = 0, 1, 2  # RECAP advantage indicator values


@dataclass(frozen=True)
class PolicySpec:
    """What a host sizes and checks from: the chunk, the action, the observation keys read."""

    chunk_length: int
    action_dim: int
    observation_keys: tuple[str, ...]
    """Keys of the env's observation this policy reads (e.g. `image_front`, `state`)."""

    def __post_init__(self) -> None:
        if self.chunk_length < 1 or self.action_dim < 1:
            raise ValueError(f"chunk_length and action_dim must be >= 1, got {self.chunk_length}, {self.action_dim}")


@runtime_checkable
class RolloutPolicy(CapsuleComponent, Protocol):
    """Required: `spec`, `device`, `reset`, `load_observation`, `act`.

    Optional (called only when present): `set_language(text)` for a
    language-conditioned policy, `set_conditioning(advantage, beta)` for a RECAP one.
    """

    spec: PolicySpec
    device: torch.device

    def reset(self, episode_seed: int) -> None:
        """A new episode (or branch) starts: seed the policy's randomness from `episode_seed`."""
        ...

    def load_observation(self, obs: Mapping[str, Any]) -> None:
        """Validate the observation's `spec.observation_keys` and copy them into the input slots."""
        ...

    def act(self) -> torch.Tensor:
        """The next chunk `(T, A)` for the loaded observation (a view of a static buffer)."""
        ...


@runtime_checkable
class LanguageConditioned(Protocol):
    def set_language(self, text: str) -> None:
        """Encode the current subtask's (or instruction's) text once; read by every later chunk."""
        ...


@runtime_checkable
class AdvantageConditioned(Protocol):
    def set_conditioning(self, advantage: int, beta: float | None) -> None:
        """RECAP: act with this indicator (0 none, 1 positive, 2 negative) and guidance weight (None: none)."""
        ...
