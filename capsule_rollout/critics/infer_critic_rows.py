"""`InferCritic` for a host of N slots: one `value` object serves every slot, one call over N rows.

An object batches when it has `value_batch(obs)` or says `batches = True` (its `value` then takes the same
batched argument):

    critic.value_batch(obs: dict[str, np.ndarray | list]) -> np.ndarray  # (N,) values

`obs[key]` is `(N, ...)` (row i: slot i's last observation), `step` `(N,)` int64 and `prompt` a list of N texts
(None for a slot without one). Values of the rows that asked must be finite. Each slot is a `models.rows.RowSlot`
with the one-row critic's state buffers (the prompt), so its capsules are one-slot capsules.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from capsule_rollout.capsules import BufferComponent, BufferSpec, Role
from capsule_rollout.critics.infer_critic import InferCritic
from capsule_rollout.models.inputs import gather, require_keys
from capsule_rollout.models.prompt_buffer import PROMPT_BYTES, read_prompt, write_prompt
from capsule_rollout.models.rows import ObjectRows, RowSlot
from capsule_rollout.user_code import ContractError, calling


def batches(obj: Any) -> bool:
    """Whether `obj` values N rows in one call (`value_batch`, or `batches = True`)."""
    return callable(getattr(obj, "value_batch", None)) or getattr(obj, "batches", False) is True


class _Rows(BufferComponent):
    def __init__(self, template: InferCritic, n: int) -> None:
        super().__init__()
        self.name, self.n = template.name, n

    def buffer_specs(self) -> list[BufferSpec]:
        n = self.n
        return [BufferSpec("prompt", (n, PROMPT_BYTES), torch.uint8, "cpu"),
                BufferSpec("prompt_len", (n, 1), torch.int64, "cpu"),
                BufferSpec("value", (n,), torch.float32, "cpu", Role.IO)]


class InferCriticRows(ObjectRows):
    """N slots of one `InferCritic` whose object batches (`InferCritic.batched`)."""

    def __init__(self, template: InferCritic, n: int) -> None:
        super().__init__(template, n, _Rows(template, n), InferCriticSlot, batch_method="value_batch", method="value",
                         what="critic")

    def evaluate_rows(self, active: Sequence[int]) -> torch.Tensor:
        """One call over all N rows; the values `(N,)` of the `active` rows are valid (and checked)."""
        obs = self.batch(self.template._names.get("prompt", "prompt"), [slot.prompt for slot in self.slots])
        with calling(self.obj, self._method):
            answer = self._call(obs)
        name = f"{type(self.obj).__name__}.{self._method}"
        values = np.asarray(answer.detach().cpu() if isinstance(answer, torch.Tensor) else answer)
        if values.dtype.kind not in "fiu" or values.shape != (self.rows,):
            raise ContractError(f"{name} returned {type(answer).__name__} {values.dtype}{values.shape}: return one "
                             f"number per row, ({self.rows},)")
        values = values.astype(np.float32)
        if not np.isfinite(values[list(active)]).all():
            raise ContractError(f"{name} answered a non-finite value (NaN or infinity)")
        self.buffers["value"].copy_(torch.from_numpy(values))
        return self.buffers["value"]


class InferCriticSlot(RowSlot):
    """Slot i of an `InferCriticRows`: the rollout protocol's critic, valuing through the shared object."""

    def __init__(self, owner: InferCriticRows, index: int, specs) -> None:
        super().__init__(owner.template.name, owner.buffers, index, specs, owner.template.fingerprint())
        self.owner, self.spec, self.device = owner, owner.spec, owner.device

    def _prompt_buffers(self) -> dict[str, torch.Tensor]:
        return {"prompt": self.rows["prompt"][self.index], "prompt_len": self.rows["prompt_len"][self.index]}

    def set_language(self, text: str) -> None:
        write_prompt(self._prompt_buffers(), text, "an InferCritic")

    @property
    def prompt(self) -> str | None:
        return read_prompt(self._prompt_buffers())

    def load_observation(self, obs, step: int) -> None:
        require_keys(obs, self.spec.observation_keys, "critic")
        names = self.owner.template._names
        row = {names.get(k, k): gather(obs, k) for k in self.spec.observation_keys}
        row["step"] = np.int64(step)
        self.owner._obs[self.index] = row

    def evaluate(self) -> torch.Tensor:
        return self.owner.evaluate_rows([self.index])[self.index: self.index + 1]
