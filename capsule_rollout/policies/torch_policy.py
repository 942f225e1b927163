"""`TorchPolicy`: any torch module `obs -> action chunk` as a rollout-protocol policy (component "policy").

A user's network runs on the Ray actors without a runtime of its own:

    module(inputs: dict[str, Tensor], noise: Tensor) -> Tensor   # (1, T, A) or (T, A)

`inputs` holds each observation key the policy reads, with a batch dimension of 1
(`state` `(1, D)` float32, `image_<camera>` `(1, H, W, 3)` uint8), in static
buffers the wrapper fills; `noise` is `(1, T, A)` standard normals drawn by the
counter-based generator (`common/counter_rng.py`) whose (seed, counter) is the
wrapper's only committed state, so a capsule reproduces the noise exactly (a
deterministic module just ignores it). Buffers: `state` = rng; `io` = one slot
per observation key and the output chunk; `scratch` = the noise.

A module that takes a batch of any size (its rows independent of each other) says so with `batches=True` (or a
`batches = True` attribute, or `save_torch_policy(..., batches=True)`): a host of N slots then calls it once over
N rows (`batched(n)`, `TorchPolicyRows`); otherwise each slot gets an instance of its own, called at batch 1.

Checkpoints (`save_torch_policy` / `load_torch_policy`) are the project's usual
safetensors + JSON directories, with the module's class named by import path
(`package.module:Class`) and its constructor's JSON kwargs: no pickle.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from capsule_rollout.capsules import BufferComponent, BufferSpec, Role
from capsule_rollout.capsules.fingerprint import module_sha256
from capsule_rollout.import_path import resolve
from capsule_rollout.models.counter_rng import normal_
from capsule_rollout.policies.rollout_policy import PolicySpec
from capsule_rollout.user_code import ContractError, calling

KIND = "torch_policy"


class TorchPolicy(BufferComponent):
    def __init__(self, module: torch.nn.Module, spec: PolicySpec, shapes: Mapping[str, tuple[tuple[int, ...], str]],
                 *, device: str = "cpu", seed: int = 0, name: str = "policy", batches: bool | None = None) -> None:
        """`shapes`: key -> (shape without batch, dtype name) of every observation key in `spec`. `batches`: the
        module takes any batch size (None: its own `batches` attribute, else False)."""
        super().__init__()
        missing = [k for k in spec.observation_keys if k not in shapes]
        if missing:
            raise ValueError(f"shapes lacks {missing}: give the shape and dtype of every key the policy reads")
        self.name, self.spec, self.device, self.seed = name, spec, torch.device(device), int(seed)
        self.module = module.to(self.device).eval()
        self.batches = bool(getattr(module, "batches", False) if batches is None else batches)
        self.shapes = {k: (tuple(shapes[k][0]), str(shapes[k][1])) for k in spec.observation_keys}
        self._index = torch.arange(spec.chunk_length * spec.action_dim, device=self.device)
        self._fingerprint = {"kind": KIND, "module": f"{type(module).__module__}:{type(module).__qualname__}",
                             "weights_sha256": module_sha256(self.module),
                             "chunk": f"{spec.chunk_length}x{spec.action_dim}"}

    def buffer_specs(self) -> list[BufferSpec]:
        dev = str(self.device)
        specs = [BufferSpec("rng", (2,), torch.int64, dev, doc="noise generator (seed, counter)"),
                 BufferSpec("chunk", (self.spec.chunk_length, self.spec.action_dim), torch.float32, dev, Role.IO),
                 BufferSpec("noise", (1, self.spec.chunk_length, self.spec.action_dim), torch.float32, dev,
                            Role.SCRATCH)]
        specs += [BufferSpec(f"in_{k}", (1, *shape), dtype, dev, Role.IO) for k, (shape, dtype) in self.shapes.items()]
        return specs

    def bind(self, buffers: Mapping[str, torch.Tensor]) -> None:
        super().bind(buffers)
        self.buffers["rng"].copy_(torch.tensor([self.seed, 0]))
        self._inputs = {k: self.buffers[f"in_{k}"] for k in self.shapes}

    def fingerprint(self) -> Mapping[str, str]:
        return self._fingerprint

    def reset(self, episode_seed: int) -> None:
        self.buffers["rng"].copy_(torch.tensor([int(episode_seed), 0]))

    def batched(self, n: int):
        """This policy for a host of `n` slots, one module call over `n` rows (only for a module that `batches`)."""
        if not self.batches:
            raise ValueError(f"{self._fingerprint['module']} is called at batch 1 (batches=False); a host of slots "
                             "gives each slot an instance of its own")
        from capsule_rollout.policies.torch_policy_rows import TorchPolicyRows

        return TorchPolicyRows(self, n)

    def load_observation(self, obs: Mapping[str, np.ndarray | torch.Tensor]) -> None:
        """Check every key's shape and dtype, then copy them into the input slots (nothing on failure)."""
        for key, value in check_inputs(self._inputs, obs).items():
            self._inputs[key].copy_(value)

    def act(self) -> torch.Tensor:
        """The next chunk `(T, A)` for the loaded observation (a view of the output buffer)."""
        b = self.buffers
        normal_(b["rng"], b["noise"], self._index)
        with torch.no_grad(), calling(self.module, "forward"):
            out = self.module(self._inputs, b["noise"])
        b["chunk"].copy_(module_chunk(out, self.module, tuple(b["chunk"].shape)))
        return b["chunk"]


def module_chunk(out, module, shape: tuple[int, ...]) -> torch.Tensor:
    """A module's answer checked: a tensor of `shape` (`(T, A)`, a leading batch of 1 allowed) of floats;
    ValueError naming the module otherwise."""
    name = f"{type(module).__name__}.forward"
    if not torch.is_tensor(out):
        raise ContractError(f"{name} returned {type(out).__name__}: return the chunk as a tensor {shape}")
    if not out.is_floating_point():
        raise ContractError(f"{name} returned a {out.dtype} tensor: return float actions {shape}")
    if out.numel() != int(np.prod(shape)):
        raise ContractError(f"{name} returned a tensor of shape {tuple(out.shape)}; this policy acts with {shape} "
                         "(chunk_length x action_dim)")
    return out.reshape(shape)


def check_inputs(slots: Mapping[str, torch.Tensor], obs: Mapping[str, np.ndarray | torch.Tensor]) -> dict:
    """Every key's value checked against its input slot `(1, ...)` (shape and dtype, finite): nothing copied."""
    checked = {}
    for key, slot in slots.items():
        if key not in obs:
            raise ValueError(f"observation lacks {key!r}; the policy reads {list(slots)}")
        value = torch.as_tensor(np.asarray(obs[key]) if not torch.is_tensor(obs[key]) else obs[key])
        if value.dim() == slot.dim() - 1:
            value = value[None]
        if tuple(value.shape) != tuple(slot.shape) or (value.dtype == torch.uint8) != (slot.dtype == torch.uint8):
            raise ValueError(f"{key}: expected {tuple(slot.shape[1:])} {slot.dtype}, got {tuple(value.shape)} "
                             f"{value.dtype}")
        if value.dtype.is_floating_point and not torch.isfinite(value).all():
            raise ValueError(f"{key} has non-finite values; refusing to act on it")
        checked[key] = value
    return checked


def save_torch_policy(directory: str | Path, module: torch.nn.Module, *, factory: str, kwargs: dict,
                      spec: PolicySpec, shapes: Mapping[str, tuple[tuple[int, ...], str]], step: int = 0,
                      info: dict | None = None, batches: bool = False) -> Path:
    """A checkpoint `load_torch_policy` rebuilds: `factory` (`package.module:Class`) called with `kwargs`.
    `batches`: the module takes any batch size (slots then call it once over all their rows)."""
    from capsule_rollout.models.checkpoint import save_checkpoint

    config = {"factory": factory, "kwargs": kwargs, "chunk_length": spec.chunk_length, "action_dim": spec.action_dim,
              "observation_keys": list(spec.observation_keys),
              "shapes": {k: [list(s), d] for k, (s, d) in shapes.items()}, **({"batches": True} if batches else {})}
    return save_checkpoint(directory, kind=KIND, model=module, config=config, step=step, info=info)


def is_torch_policy(directory: str | Path) -> bool:
    import json

    from capsule_rollout.models.checkpoint import META_FILE

    path = Path(directory) / META_FILE
    return path.exists() and json.loads(path.read_text()).get("kind") == KIND


def load_torch_policy(directory: str | Path, *, device: str = "cpu", seed: int = 0) -> TorchPolicy:
    from capsule_rollout.models.checkpoint import Checkpoint

    ckpt = Checkpoint(directory, kind=KIND)
    config = ckpt.config
    cls = resolve(config["factory"], f"{directory}: module factory")
    module = cls(**config["kwargs"])
    ckpt.load_model(module)
    spec = PolicySpec(config["chunk_length"], config["action_dim"], tuple(config["observation_keys"]))
    shapes = {k: (tuple(s), d) for k, (s, d) in config["shapes"].items()}
    return TorchPolicy(module, spec, shapes, device=device, seed=seed, batches=bool(config.get("batches", False)))
