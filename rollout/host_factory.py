"""Building a `RolloutHost` from checkpoints (plain Python; used by the Ray actor, replay and benchmarks)."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from capsules import CapsuleStore, save_capsule
from critics.critic_runtime import CriticRuntime
from critics.value_critic import load_critic
from envs.tabletop_env import TabletopEnv
from policies.flow_policy import load_policy
from policies.policy_runtime import PolicyRuntime
from rollout.rollout_host import HostConfig, RolloutHost, capsule_key


@dataclass(frozen=True)
class HostSpec:
    """Everything a rollout process needs to build its host (sent to each actor)."""

    family: str = "pick_place"
    policy: str = "experiments/checkpoints/policy"
    critic: str = "experiments/checkpoints/critic"
    host: HostConfig = field(default_factory=HostConfig)
    device: str = "cpu"
    threads: int = 1
    """torch threads per host (one per actor when actors share the cores)."""
    pin_cores: bool = False
    """Pin actor i's process to CPU core i (mod the core count): one core per host, lanes included."""
    capsule_dir: str = ""
    """Where each episode's initial capsule is saved (for `replay`); empty: not saved."""
    crash: tuple[str, int, str] = ()
    """Fault injection for tests: (episode_id, step, marker file): the process exits at that
    step of that episode once (the marker records that it happened)."""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> HostSpec:
        data = dict(data)
        host = data.pop("host", {})
        host = HostConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in host.items()})
        return cls(host=host, **{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def check_spec(spec: HostSpec) -> None:
    """Fail fast (before any process starts) on checkpoints that are missing or do not fit together."""
    from critics.value_critic import KIND as CRITIC_KIND
    from critics.value_critic import CriticConfig
    from policies.common.checkpoint import Checkpoint
    from policies.flow_policy import KIND as POLICY_KIND
    from policies.flow_policy import FlowPolicyConfig

    for what, path in (("policy", spec.policy), ("critic", spec.critic)):
        if not Path(path).is_dir():
            raise FileNotFoundError(f"{what} checkpoint {path!r} not found; train one (train_{what}) or pass its directory")
    policy = FlowPolicyConfig.from_json(Checkpoint(spec.policy, kind=POLICY_KIND).config["model"])
    critic = CriticConfig.from_json(Checkpoint(spec.critic, kind=CRITIC_KIND).config["model"])
    if policy.image_size != critic.image_size:
        raise ValueError(f"policy images are {policy.image_size}px, critic images "
                         f"{critic.image_size}px: use checkpoints trained on the same images")
    if spec.host.n_exec > policy.horizon:
        raise ValueError(f"--n_exec {spec.host.n_exec} exceeds the policy's chunk length ({policy.horizon})")


def build_host(spec: HostSpec, *, recorder=None) -> RolloutHost:
    if spec.threads:
        torch.set_num_threads(spec.threads)
    check_spec(spec)
    policy = load_policy(spec.policy, spec.device)
    critic = load_critic(spec.critic, spec.device)
    cameras = tuple(dict.fromkeys((*policy.config.cameras, *critic.config.cameras)))
    env = TabletopEnv(spec.family, cameras=cameras, image_size=policy.config.image_size)
    host = RolloutHost(env=env, policy=PolicyRuntime(policy, device=spec.device),
                       critic=CriticRuntime(critic, device=spec.device), config=spec.host,
                       store=CapsuleStore(), recorder=recorder)
    if spec.crash:
        _arm_crash(host, *spec.crash)
    return host


def capsule_path(capsule_dir: str | os.PathLike, family: str, seed: int) -> Path:
    return Path(capsule_dir) / f"{capsule_key(family, seed)}.capsule"


def save_initial_capsule(host: RolloutHost, spec: HostSpec, seed: int) -> Path | None:
    """Write the seed's initial capsule under `spec.capsule_dir` once (atomic; kept for replay)."""
    if not spec.capsule_dir:
        return None
    path = capsule_path(spec.capsule_dir, host.family, seed)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        save_capsule(host.store.get(capsule_key(host.family, seed)), path,
                     annotations={"host_spec": json.dumps(spec.to_json())})
    return path


def _arm_crash(host: RolloutHost, episode_id: str, step: int, marker: str) -> None:
    """Exit the process at `step` of `episode_id`, once (see HostSpec.crash)."""
    inner = host.safety_check
    original = host.run_episode

    def check(obs, action):
        if host.env.steps == step and current[0] == episode_id and not Path(marker).exists():
            Path(marker).write_text("crashed\n")
            os._exit(1)
        if inner is not None:
            inner(obs, action)

    current = [""]

    def run_episode(seed, *, episode_id=None):
        current[0] = episode_id or ""
        return original(seed, episode_id=episode_id)

    host.safety_check = check
    host.run_episode = run_episode
