"""The flow policy and the value critic for a host of N slots: one runtime of N rows, a component per slot.

`PolicyRuntime.batched(n)` / `CriticRuntime.batched(n)` make these. The rows runtime holds its own buffers
(an arena of its own that is never snapshotted) and runs the network once over all N rows per call (one
CUDA graph of N rows on a GPU): `act_rows(active)` / `evaluate_rows(active)`, `active` the slots that need
a chunk now; only their noise counters advance. Each slot is a `models.rows.RowSlot` with the one-row
runtime's state buffers and fingerprint, so its capsules are one-row capsules (see `models.rows`).

What a row computes does not depend on which row it is or on what the other rows hold (tested), nor on N: the
runtimes are batch-invariant (`models.runtime`: exact sums, each image through the convolutions alone, the rows
in one call where that gives each what it gets alone; a run recorded before exact sums plays its padded rows one at
a time), so a row's chunk and value are the same in a host of any
number of slots and in a runtime of batch 1: an episode is a function of its work item alone (tested at 1 to 17
rows and at 1, 2, 4, 8 and 16 slots).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from capsule_rollout.capsules import Arena, Role
from capsule_rollout.models.inputs import write_language
from capsule_rollout.models.rows import RowSlot, set_active
from capsule_rollout.stores.episode_schema import PRIVILEGED
from capsule_rollout.tabletop.critic_runtime import CriticRuntime
from capsule_rollout.tabletop.policy_runtime import PolicyRuntime


class _ModelRows:
    """A runtime of N rows made (`make_runtime()`) from a runtime of batch 1 (`template`), its own arena, a slot
    (`slot_class`) per row."""

    def __init__(self, template, n: int, make_runtime: Callable[[], Any], slot_class: type[_ModelSlot]) -> None:
        if n < 1:
            raise ValueError(f"a batched {template.name} has at least one row, got {n}")
        if template.batch != 1:
            raise ValueError(f"batched(n) is made from a runtime of batch 1; {template.name} has batch {template.batch}")
        specs = [s for s in template.buffer_specs() if s.role == Role.STATE]
        self.runtime = make_runtime()
        self.arena = Arena([self.runtime]).allocate()
        self.rows, self.spec, self.device = n, template.spec, template.device
        self.slots = [slot_class(self, i, specs, template.fingerprint()) for i in range(n)]

    def slot(self, i: int) -> _ModelSlot:
        return self.slots[i]


class _ModelSlot(RowSlot):
    """Slot i of a `_ModelRows`: a component of the rollout protocol acting through the shared rows."""

    def __init__(self, owner: _ModelRows, index: int, specs, fingerprint: Mapping[str, str]) -> None:
        super().__init__(owner.runtime.name, owner.runtime.buffers, index, specs, fingerprint)
        self.owner, self.spec, self.device = owner, owner.spec, owner.device
        self.config = owner.runtime.config

    def set_language(self, text: str) -> None:
        write_language(self.row("lang"), self.owner.runtime.model, text)


class PolicyRows(_ModelRows):
    """N slots of one flow policy (`PolicyRuntime.batched`)."""

    def __init__(self, template: PolicyRuntime, n: int) -> None:
        super().__init__(template, n, lambda: PolicyRuntime(
            template.model, name=template.name, device=str(template.device), batch=n, seed=template.seed,
            guidance=template.guidance, noise_scale=template.noise_scale, capture=template._capture,
            trace=template._trace, rows=True, batch_invariant=template.batch_invariant, sums=template.sums), PolicySlot)

    def act_rows(self, active: Sequence[int]) -> torch.Tensor:
        """One call over all rows; the chunks `(N, T, A)` of the `active` rows are valid (a view of the output
        buffer, until the next call)."""
        set_active(self.runtime.buffers["active"], active)
        self.runtime.runner()
        return self.runtime.buffers["chunk"]


class PolicySlot(_ModelSlot):
    """Slot i of a `PolicyRows`: the rollout protocol's policy."""

    @property
    def observation_keys(self) -> tuple[str, ...]:
        return self.owner.runtime.observation_keys

    def reset(self, episode_seed: int) -> None:
        self.row("rng").copy_(torch.tensor([[int(episode_seed), 0]]))

    def set_conditioning(self, advantage: int, beta: float | None = None) -> None:
        self.owner.runtime.check_conditioning(advantage, beta)
        self.row("advantage").fill_(advantage)
        self.row("beta").fill_(1.0 if beta is None else float(beta))

    def load_observation(self, obs) -> None:
        self.load_row(obs, cameras=self.config.cameras, who="policy")

    def act(self) -> torch.Tensor:
        """This slot alone (the other rows computed and left): its chunk `(T, A)`."""
        return self.owner.act_rows([self.index])[self.index]


class CriticRows(_ModelRows):
    """N slots of one value critic (`CriticRuntime.batched`)."""

    def __init__(self, template: CriticRuntime, n: int) -> None:
        super().__init__(template, n, lambda: CriticRuntime(
            template.model, name=template.name, device=str(template.device), batch=n, capture=template._capture,
            trace=template._trace, batch_invariant=template.batch_invariant, sums=template.sums), CriticSlot)

    def evaluate_rows(self, active: Sequence[int]) -> torch.Tensor:
        """One call over all rows; the values `(N,)` of the `active` rows are valid."""
        self.runtime.runner()
        return self.runtime.buffers["value"]


class CriticSlot(_ModelSlot):
    """Slot i of a `CriticRows`: the rollout protocol's critic."""

    def load_observation(self, obs, step=None) -> None:
        t = self.owner.runtime.check_step(step)
        if t is not None and t.shape[0] != 1:
            raise ValueError(f"a slot's step is one count, got {step!r}")
        privileged = self.owner.runtime.check_privileged(obs, 1)
        self.load_row(obs, cameras=self.config.cameras, who="critic")
        if privileged is not None:
            self.row(PRIVILEGED).copy_(privileged)
        if t is not None:
            self.row("step").copy_(t)
        if self.config.plan_steps:
            self.row("plan").fill_(float("nan"))

    def evaluate(self) -> torch.Tensor:
        """This slot alone: its value `(1,)`."""
        return self.owner.evaluate_rows([self.index])[self.index: self.index + 1]

