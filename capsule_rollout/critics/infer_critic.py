"""`InferCritic`: any object with `value(obs) -> float` as a rollout critic.

    critic.value(obs: dict[str, np.ndarray | str | int]) -> float

`obs` holds each observation key the critic reads (as the env gives it, no batch dimension; `observation` of a
Dict env is its nested dict), `step` (control steps so far in the episode: values depend on the time left) and
`prompt` when the host has handed a text over; a `key_map` renames them, as for an `InferPolicy`. The critic must
be a function of that: the capsule holds only the prompt.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from capsule_rollout.capsules import BufferComponent, BufferSpec, Role
from capsule_rollout.critics.rollout_critic import CriticSpec
from capsule_rollout.models.inputs import gather, key_names, require_keys
from capsule_rollout.models.prompt_buffer import prompt_specs, read_prompt, write_prompt
from capsule_rollout.user_code import ContractError, calling

KIND = "infer_critic"


def answer_value(answer: Any, obj: Any, method: str = "value") -> float:
    """A `value` answer checked: one real, finite number (a Python or numpy number, a 0-d array or tensor);
    ValueError naming the object and method otherwise ("DistanceCritic.value returned ndarray (1,): return a
    float")."""
    name = f"{type(obj).__name__}.{method}"
    if isinstance(answer, (bool, np.bool_)) or not isinstance(answer, (int, float, np.number, np.ndarray,
                                                                        torch.Tensor)):
        raise ContractError(f"{name} returned {type(answer).__name__}: return a float")
    if isinstance(answer, (np.ndarray, torch.Tensor)):
        shape = tuple(answer.shape)
        if shape != () or (answer.dtype.kind if isinstance(answer, np.ndarray) else
                           "f" if answer.is_floating_point() else "i") not in "fiu":
            raise ContractError(f"{name} returned {type(answer).__name__} {shape if shape else answer.dtype}: "
                             "return a float")
    value = float(answer)
    if not np.isfinite(value):
        raise ContractError(f"{name} returned {value}: return a finite float")
    return value


class InferCritic(BufferComponent):
    def __init__(self, obj: Any, spec: CriticSpec, *, name: str = "critic") -> None:
        super().__init__()
        if not callable(getattr(obj, "value", None)):
            raise TypeError(f"{type(obj).__name__} has no value(obs) method: an InferCritic wraps an object whose "
                            "value(obs) answers a number")
        self.obj, self.spec, self.name = obj, spec, name
        self.device = torch.device("cpu")
        self._obs: dict[str, Any] = {}
        self._names = key_names(obj)
        self._fingerprint = {"kind": KIND, "object": f"{type(obj).__module__}:{type(obj).__qualname__}",
                             "reads": ",".join(spec.observation_keys)}

    def buffer_specs(self) -> list[BufferSpec]:
        return [*prompt_specs(), BufferSpec("value", (1,), torch.float32, "cpu", Role.IO)]

    def fingerprint(self) -> Mapping[str, str]:
        return self._fingerprint

    def set_language(self, text: str) -> None:
        write_prompt(self.buffers, text, "an InferCritic")

    def load_observation(self, obs: Mapping[str, Any], step: int) -> None:
        require_keys(obs, self.spec.observation_keys, "critic")
        self._obs = {self._names.get(k, k): gather(obs, k) for k in self.spec.observation_keys}
        self._obs["step"] = int(step)
        prompt = read_prompt(self.buffers)
        if prompt is not None:
            self._obs[self._names.get("prompt", "prompt")] = prompt

    def evaluate(self) -> torch.Tensor:
        with calling(self.obj, "value"):
            answer = self.obj.value(dict(self._obs))
        self.buffers["value"].fill_(answer_value(answer, self.obj))
        return self.buffers["value"]

    @property
    def batches(self) -> bool:
        """Whether one object can serve a host's every slot (`infer_critic_rows.batches`)."""
        from capsule_rollout.critics.infer_critic_rows import batches

        return batches(self.obj)

    def batched(self, n: int):
        """This critic for a host of n slots: one call of the object over n rows (`InferCriticRows`)."""
        from capsule_rollout.critics.infer_critic_rows import InferCriticRows

        return InferCriticRows(self, n)
