"""Bringing your own policy and critic: what a host is built from, whoever made it.

A policy source (`RunSpec.policy`, `--policy`) is a checkpoint directory or an import path
`package.module:factory`. A checkpoint is loaded by the loader registered for its kind (`checkpoint.json`'s
`kind`): `torch_policy` is built in, and so is `lerobot`, a directory LeRobot saved a policy in (its `config.json`
and `model.safetensors`, no `checkpoint.json`: `rollout.lerobot_loader`, LeRobot imported only to load one); a
package adds its own kinds through the entry-point group `capsule_rollout.checkpoints` (`kind =
"package.module:LOADER"`, an object with `describe(path)` and `load(path, role=, device=, conditioning=,
noise_scale=)`), as the tabletop example does for its flow policy and
value critic. A factory is called in every process that builds a host (on each Ray actor too), with the
keyword arguments its source names (`package.module:factory={"size": 3}`, `import_path.with_kwargs`; none
otherwise), and returns one of:
- a rollout-protocol policy (`policies.rollout_policy.RolloutPolicy`: a capsule component), used as it is;
- an object with `infer(obs) -> chunk` (openpi's shape; every member it may carry: `contracts.Policy`, checked by
  `contracts.check_policy`), wrapped by `policies.infer_policy.InferPolicy`;
- a torch module `module(inputs, noise) -> chunk`, wrapped by `policies.torch_policy.TorchPolicy`.
A policy source may also be a policy server's address, `ws://host:port` (`wss://`, `openpi://`): the policy
acts through it (`policies.remote_policy.RemotePolicy`, openpi's websocket protocol), sized from the server's
metadata; it cannot be captured (see that module). A critic source (`RunSpec.critic`, `--critic`) likewise: a
value-critic checkpoint, or a factory returning a rollout-protocol critic or an object with `value(obs) -> float`
(`critics.infer_critic.InferCritic`).

`as_rollout_policy(obj, env)` / `as_rollout_critic(obj, env)` do the wrapping in-process, sized from the env:
the action dimension from its action space, the observation keys from its observation spec (or the
object's own `observation_keys`), the chunk length from `chunk_length=` or the object's `chunk_length` /
`action_horizon` (an `infer` without a `noise` keyword is asked once, on a zero observation, when neither
is given).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from capsule_rollout.contracts import check_critic, check_policy
from capsule_rollout.critics.infer_critic import InferCritic
from capsule_rollout.critics.rollout_critic import CriticSpec, RolloutCritic
from capsule_rollout.envs.rollout_env import RolloutEnv, action_bounds
from capsule_rollout.import_path import resolve, split_kwargs
from capsule_rollout.models.checkpoint import META_FILE, Checkpoint
from capsule_rollout.models.inputs import provides
from capsule_rollout.policies.conditioning import Conditioning
from capsule_rollout.policies.infer_policy import PROMPT_KEY, InferPolicy, accepts_noise, answer_chunk
from capsule_rollout.policies.lerobot_model import is_lerobot_checkpoint
from capsule_rollout.policies.remote_policy import connect_remote_policy
from capsule_rollout.policies.rollout_policy import PolicySpec, RolloutPolicy
from capsule_rollout.policies.torch_policy import KIND as TORCH_POLICY_KIND
from capsule_rollout.policies.torch_policy import TorchPolicy, load_torch_policy
from capsule_rollout.policies.websocket_policy_client import RemotePolicyError, WebsocketPolicyClient, is_remote
from capsule_rollout.user_code import UserCodeError, one_line, user_frames

FACTORY, CHECKPOINT, REMOTE = "factory", "checkpoint", "remote"
LOADERS_GROUP = "capsule_rollout.checkpoints"
ACTING_INFO = "acting"
"""Checkpoint info key: how a policy is deployed, `{"n_exec": int, "noise_scale": float}` (either may be absent;
`export_checkpoint --n_exec --noise_scale`); what the commands' `--act.*` options default to for it. A policy
server announces its `n_exec` under the same key of its metadata."""


def source_kind(source: str) -> str:
    """`remote` for a policy server's address, `factory` for an import path, else `checkpoint` (a directory,
    checked when it is described)."""
    if is_remote(source):
        return REMOTE
    if not Path(source).is_dir() and ":" in source and not source.startswith(("/", ".", "~")):
        return FACTORY
    return CHECKPOINT


@dataclass(frozen=True)
class Described:
    """What a checkpoint says about itself, read without loading its weights (checked before actors start)."""

    chunk_length: int | None = None
    image_size: int | None = None
    takes_conditioning: bool = False  # RECAP conditioning (--advantage, --beta)
    takes_noise_scale: bool = False  # a sampling temperature (--act.noise_scale)
    n_exec: int | None = None  # actions of each chunk executed when neither the command nor the checkpoint says


@dataclass
class Loaded:
    """A loaded part, with what the env must render for it."""

    part: Any
    cameras: tuple[str, ...] = ()
    image_size: int | None = None
    conditioning: Conditioning | None = None  # set on the policy once the host is built
    declared: bool = True  # whether `cameras` is all it reads (a factory's object without `observation_keys`: no)


class CheckpointLoader(Protocol):
    def describe(self, path: str) -> Described: ...

    def load(self, path: str, *, role: str, device: str, conditioning: Conditioning,
             noise_scale: float) -> Loaded: ...


class TorchPolicyLoader:
    """`torch_policy` checkpoints (`policies.torch_policy.save_torch_policy`): any torch module."""

    def describe(self, path: str) -> Described:
        return Described(chunk_length=int(Checkpoint(path, kind=TORCH_POLICY_KIND).config["chunk_length"]))

    def load(self, path: str, *, role: str, device: str, conditioning: Conditioning, noise_scale: float) -> Loaded:
        if role != "policy":
            raise ValueError(f"{path} is a torch_policy checkpoint; it cannot serve as the {role}")
        policy = load_torch_policy(path, device=device)
        images = {k.removeprefix("image_"): policy.shapes[k][0][0] for k in policy.spec.observation_keys
                  if k.startswith("image_")}
        return Loaded(policy, tuple(images), max(images.values()) if images else None)


BUILT_IN_LOADERS: dict[str, CheckpointLoader] = {TORCH_POLICY_KIND: TorchPolicyLoader()}
LEROBOT_KIND = "lerobot"  # a directory LeRobot saved a policy in (`rollout.lerobot_loader`, imported when named)


def checkpoint_kind(path: str) -> str:
    """`checkpoint.json`'s kind; `lerobot` for a LeRobot policy directory."""
    if (Path(path) / META_FILE).is_file():
        return str(Checkpoint(path).meta.get("kind"))
    if is_lerobot_checkpoint(path):
        return LEROBOT_KIND
    raise FileNotFoundError(f"{path} is not a checkpoint (no {META_FILE}, nor LeRobot's config.json and "
                            "model.safetensors): give a checkpoint directory or a factory's import path "
                            "`package.module:factory`")


def loader_for(path: str) -> CheckpointLoader:
    """The loader registered for the checkpoint's kind (built in, or an entry point of `LOADERS_GROUP`)."""
    kind = checkpoint_kind(path)
    if kind in BUILT_IN_LOADERS:
        return BUILT_IN_LOADERS[kind]
    if kind == LEROBOT_KIND:
        from capsule_rollout.rollout.lerobot_loader import LOADER

        return LOADER
    found = {e.name: e for e in entry_points(group=LOADERS_GROUP)}
    if kind not in found:
        known = sorted({*BUILT_IN_LOADERS, LEROBOT_KIND, *found})
        raise ValueError(f"{path} is a {kind!r} checkpoint and no loader is registered for that kind (known: "
                         f"{', '.join(known)}): install the package that provides it (entry-point group "
                         f"{LOADERS_GROUP!r})")
    return found[kind].load()


def describe_source(source: str) -> Described | None:
    """A checkpoint's description, or a policy server's (its metadata, read on connecting); None for a factory
    (known once it is built)."""
    kind = source_kind(source)
    if kind == REMOTE:
        return _described(describe_remote(source))
    return None if kind == FACTORY else loader_for(source).describe(source)


def describe_remote(source: str) -> WebsocketPolicyClient:
    """A policy server's client after reading its metadata, closed again (`client.metadata`); a server that cannot
    be reached is a `ValueError` here, where inputs are checked (before any actor starts)."""
    try:
        client = WebsocketPolicyClient(source)
    except RemotePolicyError as exc:
        raise ValueError(f"{exc}; start it first (serve_policy, or openpi's serve_policy.py)") from None
    client.close()
    return client


def _remote_images(client: WebsocketPolicyClient) -> dict[str, int]:
    """Camera -> image size of the observation a policy server announces (none for a server that does not)."""
    announced = client.metadata.get("observation")
    if not isinstance(announced, dict):
        return {}
    return {e["key"].removeprefix("image_"): int(e["shape"][0]) for e in announced.values()
            if isinstance(e, dict) and str(e.get("key", "")).startswith("image_") and e.get("shape")}


def _described(client: WebsocketPolicyClient) -> Described:
    length = client.metadata.get("action_horizon")
    images = _remote_images(client)
    announced = (client.metadata.get(ACTING_INFO) or {}).get("n_exec")  # the receding horizon it announces, if any
    return Described(chunk_length=length if isinstance(length, int) else client.address.chunk_length,
                     image_size=max(images.values()) if images else None,
                     n_exec=announced if isinstance(announced, int) and not isinstance(announced, bool) else None)


def load_source(source: str, role: str, *, device: str, conditioning: Conditioning, noise_scale: float) -> Loaded:
    """The policy or critic a source names: a factory's object (adapted later, with the env) or a checkpoint's
    part, loaded by its kind's loader."""
    kind = source_kind(source)
    if kind == FACTORY:
        obj = make_from_factory(source, role)
        keys, key_map = getattr(obj, "observation_keys", None), getattr(obj, "key_map", None)
        if keys is None and not key_map:
            return Loaded(obj, declared=False)  # reads whatever the env gives: its default camera too
        read = [*(keys or ()), *(key_map.values() if isinstance(key_map, dict) else ())]
        return Loaded(obj, tuple(dict.fromkeys(str(k).removeprefix("image_") for k in read
                                               if str(k).startswith("image_"))))
    if kind == REMOTE:
        if role != "policy":
            raise ValueError(f"{source!r} is a policy server: it serves a policy, not a {role}")
        client = WebsocketPolicyClient(source)
        images = _remote_images(client)
        announced = isinstance(client.metadata.get("observation"), dict)  # else it may read any camera
        return Loaded(client, tuple(images), max(images.values()) if images else None, declared=announced)
    return loader_for(source).load(source, role=role, device=device, conditioning=conditioning,
                                   noise_scale=noise_scale)


def make_from_factory(source: str, what: str) -> Any:
    """Call the factory an import path names (`package.module:factory`, or with keyword arguments
    `package.module:factory={JSON object}`); its errors name the source."""
    path, kwargs = split_kwargs(source, what)
    factory = resolve(path, what)
    if not callable(factory):
        raise TypeError(f"{what} {source!r} names a {type(factory).__name__}, not a factory to call")
    try:
        return factory(**kwargs)
    except Exception as exc:
        raise UserCodeError(f"{what} factory {source!r} raised {one_line(exc)}", user_frames(exc)) from exc


def _keys(obj: Any, env: RolloutEnv, observation_keys) -> tuple[str, ...]:
    """What `obj` reads of the env's observation: `observation_keys` (given, or the object's own), and the env
    keys its `key_map` names; every key the env gives when it says nothing."""
    mapped = tuple(v for v in (getattr(obj, "key_map", None) or {}).values() if v != PROMPT_KEY)
    declared = observation_keys or getattr(obj, "observation_keys", None)
    keys = tuple(dict.fromkeys((*(declared or ()), *mapped))) if declared or mapped else tuple(
        env.observation_spec.arrays)
    missing = [k for k in keys if not provides(env.observation_spec.arrays, k)]
    if missing:
        raise ValueError(f"{type(obj).__name__} reads observation key(s) {missing}; the env gives "
                         f"{sorted(env.observation_spec.arrays)}")
    return keys


def _probe_chunk_length(obj: Any, env: RolloutEnv, keys: tuple[str, ...]) -> int:
    arrays = env.observation_spec.arrays
    chunk = answer_chunk(obj.infer({k: np.zeros(arrays[k].shape, arrays[k].dtype) for k in keys}), obj)
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
    if isinstance(obj, WebsocketPolicyClient):  # a policy server (load_source connected to it)
        arrays = env.observation_spec.arrays
        return connect_remote_policy(obj.source, action_dim=action_dim, client=obj,
                                     arrays={k: (tuple(a.shape), np.dtype(a.dtype).name) for k, a in arrays.items()})
    if not isinstance(obj, torch.nn.Module):
        check_policy(obj)  # every member a user may give, named in one line when missing or wrong
    keys = _keys(obj, env, observation_keys)
    length = chunk_length or getattr(obj, "chunk_length", None) or getattr(obj, "action_horizon", None)
    if isinstance(obj, torch.nn.Module):
        if not length:
            raise ValueError(f"{type(obj).__name__} is a torch module: give chunk_length (or a `chunk_length` "
                             "attribute) so the host can size the chunk")
        arrays = env.observation_spec.arrays
        shapes = {k: (tuple(arrays[k].shape), np.dtype(arrays[k].dtype).name) for k in keys}
        return TorchPolicy(obj, PolicySpec(int(length), action_dim, keys), shapes, device=device, seed=seed)
    declared = deterministic if deterministic is not None else bool(getattr(obj, "deterministic", False))
    if not length:
        if accepts_noise(obj.infer):
            raise ValueError(f"{type(obj).__name__}.infer takes noise, so its chunk length cannot be probed: "
                             "give chunk_length (or a `chunk_length` / `action_horizon` attribute)")
        length = _probe_chunk_length(obj, env, keys)
    return InferPolicy(obj, PolicySpec(int(length), action_dim, keys), deterministic=declared, seed=seed)


def as_rollout_critic(obj: Any, env: RolloutEnv, *, observation_keys: tuple[str, ...] | None = None) -> RolloutCritic:
    """`obj` as a rollout-protocol critic for `env`; a rollout critic as it is."""
    if isinstance(obj, RolloutCritic):
        return obj
    check_critic(obj)  # every member a user may give, named in one line when missing or wrong
    return InferCritic(obj, CriticSpec(_keys(obj, env, observation_keys)))
