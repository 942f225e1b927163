"""`InferPolicy`: any object with `infer(obs) -> action chunk` (openpi's `BasePolicy` shape) as a rollout policy.

    policy.infer(obs: dict[str, np.ndarray | str], *, noise: np.ndarray) -> dict | np.ndarray

`obs` holds each observation key the policy reads, as the env gives it (no batch dimension: `state` `(D,)`
float32, `image_<camera>` `(H, W, 3)` uint8, the env's own observation `observation` or its leaves
`observation.<key>` with their shapes and dtypes; `observation` of a Dict env is its nested dict), and `prompt`,
the current subtask's (or instruction's) text when the host has handed one over. An object with a `key_map`
({the name it reads: env key or `prompt`}) gets those keys under its own names. The answer is the chunk `(T, A)`,
either as it is or under `actions` in a dict (openpi answers `{"actions": ...}`).

What a capsule holds for it: the counter-based noise generator's (seed, counter) and the prompt. `noise`,
`(T, A)` standard normals drawn from that generator each call, is what makes a sampling policy restorable:
a flow or diffusion policy that starts its chunk from `noise` (openpi's `Policy.infer(obs, noise=...)` does)
replays bit for bit after a restore. An `infer` without a `noise` keyword has randomness the wrapper cannot
see, so it is refused unless declared `deterministic=True` (the same obs always gives the same chunk).
State the object keeps across calls (an observation history, an action queue, a chunk broker) is capsule state
with nothing declared (`policies.object_state`: its object graph, weights taken by reference; or its own
`get_state()` / `set_state(state)`), so a restore, a fork or a replay resumes with the same history; an object
that says `stateless = True` is not walked. `reset()` of the object, when it has one, is called at every
episode start.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from capsule_rollout.capsules import BufferComponent, BufferSpec, Role
from capsule_rollout.models.counter_rng import normal_
from capsule_rollout.models.inputs import gather, key_names, require_keys
from capsule_rollout.models.prompt_buffer import prompt_specs, read_prompt, write_prompt
from capsule_rollout.policies.object_state import ObjectState
from capsule_rollout.policies.rollout_policy import PolicySpec
from capsule_rollout.user_code import ContractError, calling

KIND = "infer_policy"
PROMPT_KEY = "prompt"


def accepts_noise(infer) -> bool:
    """Whether `infer` takes a `noise` keyword (or any keyword)."""
    try:
        params = inspect.signature(infer).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: assume not
        return False
    return any(p.name == "noise" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) or p.kind == p.VAR_KEYWORD
               for p in params)


def answer_chunk(answer: Any, obj: Any, method: str = "infer") -> np.ndarray:
    """The chunk in an `infer` answer (the array, or a dict's `actions`), float32, a leading batch of 1 dropped."""
    chunk = answer.get("actions") if isinstance(answer, Mapping) else answer
    if chunk is None:
        raise ContractError(f"{type(obj).__name__}.{method} answered a dict without `actions` (keys {sorted(answer)})")
    chunk = np.asarray(chunk, dtype=np.float32)
    return chunk[0] if chunk.ndim == 3 and chunk.shape[0] == 1 else chunk


def answer_chunks(answer: Any, obj: Any, shape: tuple[int, ...], rows: Sequence[int] | None = None) -> np.ndarray:
    """The chunks of an answer, checked: `shape` (`(T, A)`, or `(N, T, A)` for a batch) and finite in `rows` (all
    when None); ValueError naming the object and method otherwise, so a bad action never reaches an env."""
    method = "infer_batch" if len(shape) == 3 and callable(getattr(obj, "infer_batch", None)) else "infer"
    raw = answer.get("actions") if isinstance(answer, Mapping) else answer
    if raw is None:
        raise ContractError(f"{type(obj).__name__}.{method} answered a dict without `actions` (keys {sorted(answer)})")
    chunks = np.asarray(raw.detach().cpu() if isinstance(raw, torch.Tensor) else raw)
    if chunks.dtype.kind not in "fiu":
        raise ContractError(f"{type(obj).__name__}.{method} answered {type(raw).__name__} of dtype {chunks.dtype}: "
                         f"answer float actions {shape}")
    chunks = chunks.astype(np.float32, copy=False)
    if len(shape) == 2 and chunks.ndim == 3 and chunks.shape[0] == 1:
        chunks = chunks[0]
    if chunks.shape != shape:
        raise ContractError(f"{type(obj).__name__}.{method} answered a chunk of shape {chunks.shape}; this policy acts "
                         f"with {shape} ({'slots x ' if len(shape) == 3 else ''}chunk_length x action_dim)")
    checked = chunks if rows is None else chunks[list(rows)]
    if not np.isfinite(checked).all():
        raise ContractError(f"{type(obj).__name__}.{method} answered non-finite actions (NaN or infinity): refused "
                         "before they reach the env")
    return chunks


class InferPolicy(BufferComponent):
    """Wraps `obj.infer` (see the module docstring). `observation_keys`: what `infer` gets from the env's
    observation; `chunk_length` x `action_dim`: the chunk it answers (checked on every call)."""

    def __init__(self, obj: Any, spec: PolicySpec, *, deterministic: bool = False, seed: int = 0,
                 name: str = "policy") -> None:
        super().__init__()
        infer = getattr(obj, "infer", None)
        if not callable(infer):
            raise TypeError(f"{type(obj).__name__} has no infer(obs) method: an InferPolicy wraps an object whose "
                            "infer(obs) answers an action chunk")
        self._noise_kw = accepts_noise(infer)
        if not self._noise_kw and not deterministic:
            raise ValueError(
                f"{type(obj).__name__}.infer takes no `noise` keyword, so whatever randomness it uses is not in the "
                "capsule and a restore would not replay it: give infer a `noise` keyword and start sampling from it "
                "(openpi's Policy.infer(obs, noise=...) does), or declare deterministic=True if the same "
                "observation always gives the same chunk")
        self.obj, self.spec, self.name, self.seed = obj, spec, name, int(seed)
        self.device = torch.device("cpu")
        self.deterministic = deterministic
        self._obs: dict[str, Any] = {}
        self._names = key_names(obj)
        self._index = torch.arange(spec.chunk_length * spec.action_dim)
        # what the object keeps across calls, as capsule state (none for an object that batches or says it is
        # stateless: a batching object keeps no episode state, `infer_policy_rows`)
        stateless = getattr(obj, "stateless", False) is True or self.batches
        self._state = None if stateless else ObjectState(obj, type(obj).__name__)
        self._fingerprint = {"kind": KIND, "object": f"{type(obj).__module__}:{type(obj).__qualname__}",
                             "chunk": f"{spec.chunk_length}x{spec.action_dim}",
                             "reads": ",".join(spec.observation_keys), "noise": "keyword" if self._noise_kw else "none",
                             **(self._state.fingerprint() if self._state is not None else {"state": "none"})}

    def buffer_specs(self) -> list[BufferSpec]:
        T, A = self.spec.chunk_length, self.spec.action_dim
        return [BufferSpec("rng", (2,), torch.int64, "cpu", doc="noise generator (seed, counter)"),
                *prompt_specs(),
                *(self._state.buffer_specs() if self._state is not None else ()),
                BufferSpec("chunk", (T, A), torch.float32, "cpu", Role.IO),
                BufferSpec("noise", (T, A), torch.float32, "cpu", Role.SCRATCH)]

    def before_snapshot(self) -> None:
        if self._state is not None:
            self._state.snapshot_into(self.buffers)

    def check_restore(self, view: Mapping[str, torch.Tensor]) -> None:
        if self._state is not None:
            self._state.check(view)

    def after_restore(self) -> None:
        if self._state is not None:
            self._state.restore_from(self.buffers)

    def bind(self, buffers: Mapping[str, torch.Tensor]) -> None:
        super().bind(buffers)
        self.buffers["rng"].copy_(torch.tensor([self.seed, 0]))

    def fingerprint(self) -> Mapping[str, str]:
        return self._fingerprint

    def reset(self, episode_seed: int) -> None:
        self.reseed(episode_seed)
        reset = getattr(self.obj, "reset", None)
        if callable(reset):
            reset()

    def reseed(self, seed: int) -> None:
        """New noise (a branch's), the state the object keeps left as it is."""
        self.buffers["rng"].copy_(torch.tensor([int(seed), 0]))

    def set_language(self, text: str) -> None:
        write_prompt(self.buffers, text, "an InferPolicy")

    @property
    def prompt(self) -> str | None:
        return read_prompt(self.buffers)

    def load_observation(self, obs: Mapping[str, Any]) -> None:
        require_keys(obs, self.spec.observation_keys, "policy")
        self._obs = {self._names.get(k, k): gather(obs, k) for k in self.spec.observation_keys}

    def act(self) -> torch.Tensor:
        """The next chunk `(T, A)`: `infer` on the loaded observation (and prompt), with this call's noise."""
        b = self.buffers
        obs = dict(self._obs)
        prompt = self.prompt
        if prompt is not None:
            obs[self._names.get(PROMPT_KEY, PROMPT_KEY)] = prompt
        normal_(b["rng"], b["noise"], self._index)
        with calling(self.obj, "infer"):
            answer = self.obj.infer(obs, noise=b["noise"].numpy().copy()) if self._noise_kw else self.obj.infer(obs)
        b["chunk"].copy_(torch.from_numpy(answer_chunks(answer, self.obj, tuple(b["chunk"].shape))))
        return b["chunk"]

    @property
    def takes_noise(self) -> bool:
        return self._noise_kw

    @property
    def batches(self) -> bool:
        """Whether one object can serve a host's every slot (`infer_policy_rows.batches`)."""
        from capsule_rollout.policies.infer_policy_rows import batches

        return batches(self.obj)

    def batched(self, n: int):
        """This policy for a host of n slots: one call of the object over n rows (`InferPolicyRows`)."""
        from capsule_rollout.policies.infer_policy_rows import InferPolicyRows

        return InferPolicyRows(self, n)
