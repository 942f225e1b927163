"""Bringing your own policy and critic: what a host is built from, whoever made it.

A policy source (`HostSpec.policy`, `--policy`) is a checkpoint directory (the project's flow policy, or a
`TorchPolicy` checkpoint) or an import path `package.module:factory`, called with no arguments in every
process that builds a host (on each Ray actor too) and returning one of:
- a rollout-protocol policy (`policies.rollout_policy.RolloutPolicy`: a capsule component), used as it is;
- an object with `infer(obs) -> chunk` (openpi's shape), wrapped by `policies.infer_policy.InferPolicy`;
- a torch module `module(inputs, noise) -> chunk`, wrapped by `policies.torch_policy.TorchPolicy`.
A critic source (`HostSpec.critic`, `--critic`) likewise: a value-critic checkpoint, or a factory returning a
rollout-protocol critic or an object with `value(obs) -> float` (`critics.infer_critic.InferCritic`).

`as_rollout_policy(obj, env)` / `as_rollout_critic(obj, env)` do the wrapping in-process, sized from the env:
the action dimension from its action space, the observation keys from its observation spec (or the
object's own `observation_keys`), the chunk length from `chunk_length=` or the object's `chunk_length` /
`action_horizon` (an `infer` without a `noise` keyword is asked once, on a zero observation, when neither
is given).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from capsule_rollout.critics.infer_critic import InferCritic
from capsule_rollout.critics.rollout_critic import CriticSpec, RolloutCritic
from capsule_rollout.envs.rollout_env import RolloutEnv, action_bounds
from capsule_rollout.import_path import resolve
from capsule_rollout.policies.infer_policy import InferPolicy, accepts_noise
from capsule_rollout.policies.rollout_policy import PolicySpec, RolloutPolicy
from capsule_rollout.policies.torch_policy import TorchPolicy, is_torch_policy

FLOW, TORCH, FACTORY = "flow", "torch", "factory"


def source_kind(source: str) -> str:
    """`factory` for an import path, else the checkpoint's kind (`torch` or `flow`)."""
    if not Path(source).is_dir() and ":" in source and not source.startswith(("/", ".", "~")):
        return FACTORY
    return TORCH if is_torch_policy(source) else FLOW


def make_from_factory(source: str, what: str) -> Any:
    """Call the factory an import path names (no arguments); its errors name the source."""
    factory = resolve(source, what)
    if not callable(factory):
        raise TypeError(f"{what} {source!r} names a {type(factory).__name__}, not a factory to call")
    try:
        return factory()
    except Exception as exc:
        raise RuntimeError(f"{what} factory {source!r} raised {type(exc).__name__}: {exc}") from exc


def _keys(obj: Any, env: RolloutEnv, observation_keys) -> tuple[str, ...]:
    keys = tuple(observation_keys or getattr(obj, "observation_keys", None) or env.observation_spec.arrays)
    missing = [k for k in keys if k not in env.observation_spec.arrays]
    if missing:
        raise ValueError(f"{type(obj).__name__} reads observation key(s) {missing}; the env gives "
                         f"{sorted(env.observation_spec.arrays)}")
    return keys


def _probe_chunk_length(obj: Any, env: RolloutEnv, keys: tuple[str, ...]) -> int:
    arrays = env.observation_spec.arrays
    answer = obj.infer({k: np.zeros(arrays[k].shape, arrays[k].dtype) for k in keys})
    chunk = np.asarray(answer.get("actions") if isinstance(answer, dict) else answer)
    if chunk.ndim == 3 and chunk.shape[0] == 1:
        chunk = chunk[0]
    if chunk.ndim != 2:
        raise ValueError(f"{type(obj).__name__}.infer answered shape {chunk.shape}; a chunk is (T, action_dim)")
    return int(chunk.shape[0])


def as_rollout_policy(obj: Any, env: RolloutEnv, *, chunk_length: int | None = None,
                      observation_keys: tuple[str, ...] | None = None, deterministic: bool | None = None,
                      device: str = "cpu", seed: int = 0) -> RolloutPolicy:
    """`obj` as a rollout-protocol policy for `env` (see the module docstring); a rollout policy as it is."""
    if isinstance(obj, RolloutPolicy):
        return obj
    action_dim = action_bounds(env)[0].shape[0]
    keys = _keys(obj, env, observation_keys)
    length = chunk_length or getattr(obj, "chunk_length", None) or getattr(obj, "action_horizon", None)
    if isinstance(obj, torch.nn.Module):
        if not length:
            raise ValueError(f"{type(obj).__name__} is a torch module: give chunk_length (or a `chunk_length` "
                             "attribute) so the host can size the chunk")
        arrays = env.observation_spec.arrays
        shapes = {k: (tuple(arrays[k].shape), np.dtype(arrays[k].dtype).name) for k in keys}
        return TorchPolicy(obj, PolicySpec(int(length), action_dim, keys), shapes, device=device, seed=seed)
    if callable(getattr(obj, "infer", None)):
        declared = deterministic if deterministic is not None else bool(getattr(obj, "deterministic", False))
        if not length:
            if accepts_noise(obj.infer):
                raise ValueError(f"{type(obj).__name__}.infer takes noise, so its chunk length cannot be probed: "
                                 "give chunk_length (or a `chunk_length` / `action_horizon` attribute)")
            length = _probe_chunk_length(obj, env, keys)
        return InferPolicy(obj, PolicySpec(int(length), action_dim, keys), deterministic=declared, seed=seed)
    raise TypeError(f"{type(obj).__name__} is not a policy this project can run: give a rollout-protocol policy, "
                    "an object with infer(obs) -> action chunk, or a torch module")


def as_rollout_critic(obj: Any, env: RolloutEnv, *, observation_keys: tuple[str, ...] | None = None) -> RolloutCritic:
    """`obj` as a rollout-protocol critic for `env`; a rollout critic as it is."""
    if isinstance(obj, RolloutCritic):
        return obj
    if callable(getattr(obj, "value", None)):
        return InferCritic(obj, CriticSpec(_keys(obj, env, observation_keys)))
    raise TypeError(f"{type(obj).__name__} is not a critic this project can run: give a rollout-protocol critic or "
                    "an object with value(obs) -> float")
