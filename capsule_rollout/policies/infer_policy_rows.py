"""`InferPolicy` for a host of N slots: one `infer` object serves every slot, one call over N rows.

An object batches when it has `infer_batch(obs, *, noise)` or says `batches = True` (its `infer` then takes the
same batched arguments):

    policy.infer_batch(obs: dict[str, np.ndarray | list], *, noise: np.ndarray) -> dict | np.ndarray

`obs[key]` is `(N, ...)`: row i is slot i's observation (the last one it loaded: a slot between episodes keeps its
rows filled, so every call has N rows and what a row gets does not depend on which others act); `prompt` is a
list of N texts (None for a slot without one); `noise` is `(N, T, A)`, row i drawn from slot i's counter-based
stream (only rows that act advance). The answer is `(N, T, A)` (as it is or under `actions`). A batching object
keeps no episode state across calls, or keeps it per row: its `reset_row(i)`, when it has one, is called when slot
i starts an episode (its `reset()` is not: it would clear the other slots'). Each slot is a `models.rows.RowSlot`
with the one-row policy's state buffers and fingerprint, so its capsules are one-slot capsules.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from capsule_rollout.capsules import BufferComponent, BufferSpec, Role
from capsule_rollout.models.counter_rng import normal_rows_
from capsule_rollout.models.inputs import gather, require_keys
from capsule_rollout.models.prompt_buffer import PROMPT_BYTES, read_prompt, write_prompt
from capsule_rollout.models.rows import ObjectRows, RowSlot, set_active
from capsule_rollout.policies.infer_policy import PROMPT_KEY, InferPolicy, accepts_noise, answer_chunks
from capsule_rollout.user_code import calling


def batches(obj: Any) -> bool:
    """Whether `obj` serves N rows in one call (`infer_batch`, or `batches = True`)."""
    return callable(getattr(obj, "infer_batch", None)) or getattr(obj, "batches", False) is True


class _Rows(BufferComponent):
    def __init__(self, template: InferPolicy, n: int) -> None:
        super().__init__()
        self.name, self.n, self.template = template.name, n, template

    def buffer_specs(self) -> list[BufferSpec]:
        n, spec = self.n, self.template.spec
        return [BufferSpec("rng", (n, 2), torch.int64, "cpu"),
                BufferSpec("prompt", (n, PROMPT_BYTES), torch.uint8, "cpu"),
                BufferSpec("prompt_len", (n, 1), torch.int64, "cpu"),
                BufferSpec("active", (n,), torch.int64, "cpu", Role.IO),
                BufferSpec("chunk", (n, spec.chunk_length, spec.action_dim), torch.float32, "cpu", Role.IO),
                BufferSpec("noise", (n, spec.chunk_length, spec.action_dim), torch.float32, "cpu", Role.SCRATCH)]

    def bind(self, buffers) -> None:
        super().bind(buffers)
        self.buffers["rng"].copy_(torch.tensor([self.template.seed, 0]).expand(self.n, 2))


class InferPolicyRows(ObjectRows):
    """N slots of one `InferPolicy` whose object batches (`InferPolicy.batched`)."""

    def __init__(self, template: InferPolicy, n: int) -> None:
        super().__init__(template, n, _Rows(template, n), InferPolicySlot, batch_method="infer_batch", method="infer",
                         what="policy")
        self._index = torch.arange(self.spec.chunk_length * self.spec.action_dim)
        self._noise_kw = accepts_noise(self._call)
        if not self._noise_kw and not template.deterministic:
            raise ValueError(f"{type(self.obj).__name__}.{self._method} takes no `noise` keyword: give it one (each "
                             "row's sampling starts from its row), or declare the policy deterministic")

    def _prompt(self, i: int) -> str | None:
        return read_prompt({"prompt": self.buffers["prompt"][i], "prompt_len": self.buffers["prompt_len"][i]})

    def act_rows(self, active: Sequence[int]) -> torch.Tensor:
        """One call over all N rows; the chunks `(N, T, A)` of the `active` rows are valid (and checked)."""
        b = self.buffers
        set_active(b["active"], active)
        normal_rows_(b["rng"], b["noise"].view(self.rows, -1), self._index, b["active"])
        obs = self.batch(self.template._names.get(PROMPT_KEY, PROMPT_KEY), [self._prompt(i) for i in range(self.rows)])
        with calling(self.obj, self._method):
            if self._noise_kw:
                answer = self._call(obs, noise=b["noise"].numpy().copy())
            else:
                answer = self._call(obs)
        chunks = answer_chunks(answer, self.obj, tuple(b["chunk"].shape), active)
        b["chunk"].copy_(torch.from_numpy(chunks))
        return b["chunk"]


class InferPolicySlot(RowSlot):
    """Slot i of an `InferPolicyRows`: the rollout protocol's policy, acting through the shared object."""

    def __init__(self, owner: InferPolicyRows, index: int, specs) -> None:
        super().__init__(owner.template.name, owner.buffers, index, specs, owner.template.fingerprint())
        self.owner, self.spec, self.device = owner, owner.spec, owner.device

    def reseed(self, seed: int) -> None:
        self.row("rng").copy_(torch.tensor([[int(seed), 0]]))

    def reset(self, episode_seed: int) -> None:
        self.reseed(episode_seed)
        reset_row = getattr(self.owner.obj, "reset_row", None)
        if callable(reset_row):
            reset_row(self.index)

    def set_language(self, text: str) -> None:
        write_prompt({"prompt": self.rows["prompt"][self.index], "prompt_len": self.rows["prompt_len"][self.index]},
                     text, "an InferPolicy")

    @property
    def prompt(self) -> str | None:
        return read_prompt({"prompt": self.rows["prompt"][self.index], "prompt_len": self.rows["prompt_len"][self.index]})

    def load_observation(self, obs) -> None:
        require_keys(obs, self.spec.observation_keys, "policy")
        names = self.owner.template._names
        self.owner._obs[self.index] = {names.get(k, k): gather(obs, k) for k in self.spec.observation_keys}

    def act(self) -> torch.Tensor:
        return self.owner.act_rows([self.index])[self.index]
