"""The flow policy and the value critic for a host of N slots: one runtime of N rows, a component per slot.

`PolicyRuntime.batched(n)` / `CriticRuntime.batched(n)` make these. The rows runtime holds its own buffers
(an arena of its own that is never snapshotted) and runs the network once over all N rows per call (one
CUDA graph of N rows on a GPU): `act_rows(active)` / `evaluate_rows(active)`, `active` the slots that need
a chunk now; only their noise counters advance. Each slot is a `models.rows.RowSlot` with the one-row
runtime's state buffers and fingerprint, so its capsules are one-row capsules (see `models.rows`).

What a row computes does not depend on which row it is or on what the other rows hold (tested), but it
does depend on N: a batch of 8 rounds differently from a batch of 1 (by about 1e-6), so an episode is the
same in any slot of an N-slot host and differs, slightly, from the same episode in a host of another N.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from capsule_rollout.capsules import Arena, Role
from capsule_rollout.models.inputs import write_language
from capsule_rollout.models.rows import RowSlot
from capsule_rollout.tabletop.critic_runtime import CriticRuntime
from capsule_rollout.tabletop.policy_runtime import PolicyRuntime


def _one_row_state(template) -> list:
    if template.batch != 1:
        raise ValueError(f"batched(n) is made from a runtime of batch 1; {template.name} has batch {template.batch}")
    return [s for s in template.buffer_specs() if s.role == Role.STATE]


def _mask(buffer: torch.Tensor, active: Sequence[int]) -> None:
    mask = np.zeros(buffer.shape[0], np.int64)
    mask[list(active)] = 1
    buffer.copy_(torch.from_numpy(mask))


class PolicyRows:
    """N slots of one flow policy (`PolicyRuntime.batched`)."""

    def __init__(self, template: PolicyRuntime, n: int) -> None:
        if n < 1:
            raise ValueError(f"a batched policy has at least one row, got {n}")
        specs = _one_row_state(template)
        self.runtime = PolicyRuntime(template.model, name=template.name, device=str(template.device), batch=n,
                                     seed=template.seed, guidance=template.guidance, noise_scale=template.noise_scale,
                                     capture=template._capture, trace=template._trace, rows=True)
        self.arena = Arena([self.runtime]).allocate()
        self.rows, self.spec, self.device = n, template.spec, template.device
        self.slots = [PolicySlot(self, i, specs, template.fingerprint()) for i in range(n)]

    def slot(self, i: int) -> PolicySlot:
        return self.slots[i]

    def act_rows(self, active: Sequence[int]) -> torch.Tensor:
        """One call over all rows; the chunks `(N, T, A)` of the `active` rows are valid (a view of the output
        buffer, until the next call)."""
        _mask(self.runtime.buffers["active"], active)
        self.runtime.runner()
        return self.runtime.buffers["chunk"]


class PolicySlot(RowSlot):
    """Slot i of a `PolicyRows`: the rollout protocol's policy, acting through the shared rows."""

    def __init__(self, owner: PolicyRows, index: int, specs, fingerprint: Mapping[str, str]) -> None:
        super().__init__(owner.runtime.name, owner.runtime.buffers, index, specs, fingerprint)
        self.owner = owner
        self.spec, self.device = owner.spec, owner.device
        self.config = owner.runtime.config

    @property
    def observation_keys(self) -> tuple[str, ...]:
        return self.owner.runtime.observation_keys

    def reset(self, episode_seed: int) -> None:
        self.row("rng").copy_(torch.tensor([[int(episode_seed), 0]]))

    def set_language(self, text: str) -> None:
        write_language(self.row("lang"), self.owner.runtime.model, text)

    def set_conditioning(self, advantage: int, beta: float | None = None) -> None:
        self.owner.runtime.check_conditioning(advantage, beta)
        self.row("advantage").fill_(advantage)
        self.row("beta").fill_(1.0 if beta is None else float(beta))

    def load_observation(self, obs) -> None:
        self.load_row(obs, cameras=self.config.cameras, who="policy")

    def act(self) -> torch.Tensor:
        """This slot alone (the other rows computed and left): its chunk `(T, A)`."""
        return self.owner.act_rows([self.index])[self.index]


class CriticRows:
    """N slots of one value critic (`CriticRuntime.batched`)."""

    def __init__(self, template: CriticRuntime, n: int) -> None:
        if n < 1:
            raise ValueError(f"a batched critic has at least one row, got {n}")
        specs = _one_row_state(template)
        self.runtime = CriticRuntime(template.model, name=template.name, device=str(template.device), batch=n,
                                     capture=template._capture, trace=template._trace)
        self.arena = Arena([self.runtime]).allocate()
        self.rows, self.spec = n, template.spec
        self.slots = [CriticSlot(self, i, specs, template.fingerprint()) for i in range(n)]

    def slot(self, i: int) -> CriticSlot:
        return self.slots[i]

    def evaluate_rows(self, active: Sequence[int]) -> torch.Tensor:
        """One call over all rows; the values `(N,)` of the `active` rows are valid."""
        self.runtime.runner()
        return self.runtime.buffers["value"]


class CriticSlot(RowSlot):
    """Slot i of a `CriticRows`: the rollout protocol's critic."""

    def __init__(self, owner: CriticRows, index: int, specs, fingerprint: Mapping[str, str]) -> None:
        super().__init__(owner.runtime.name, owner.runtime.buffers, index, specs, fingerprint)
        self.owner = owner
        self.spec = owner.spec
        self.config = owner.runtime.config

    def set_language(self, text: str) -> None:
        write_language(self.row("lang"), self.owner.runtime.model, text)

    def load_observation(self, obs, step=None) -> None:
        t = self.owner.runtime.check_step(step)
        if t is not None and t.shape[0] != 1:
            raise ValueError(f"a slot's step is one count, got {step!r}")
        self.load_row(obs, cameras=self.config.cameras, who="critic")
        if t is not None:
            self.row("step").copy_(t)
        if self.config.plan_steps:
            self.row("plan").fill_(float("nan"))

    def evaluate(self) -> torch.Tensor:
        """This slot alone: its value `(1,)`."""
        return self.owner.evaluate_rows([self.index])[self.index: self.index + 1]
