"""Building a `RolloutHost` from a `HostSpec` (plain Python; used by the Ray actors, replay, evaluation).

A `HostSpec` is everything a rollout process needs, as plain data (sent to each
actor, written next to a run as `rollout.json` for `replay`): which env, which
policy and critic checkpoints, how the policy is conditioned (a RECAP checkpoint
acts with the indicator and guidance weight it records, unless overridden), the
host's config, the capsule store's budget, a simulated operator, and observers
named by import path (`"package.module:factory"`, called as `factory(**kwargs)`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from capsule_rollout.capsules import CapsuleStore, save_capsule
from capsule_rollout.critics.critic_runtime import CriticRuntime
from capsule_rollout.critics.value_critic import load_critic
from capsule_rollout.envs.rollout_env import RolloutEnv
from capsule_rollout.envs.tabletop_env import TabletopEnv
from capsule_rollout.import_path import resolve
from capsule_rollout.policies.flow_policy import Conditioning, load_policy, resolve_conditioning
from capsule_rollout.policies.policy_runtime import PolicyRuntime, check_noise_scale
from capsule_rollout.policies.torch_policy import load_torch_policy
from capsule_rollout.rollout.observer import EpisodeObserver
from capsule_rollout.rollout.plug_in import (
    FACTORY,
    FLOW,
    TORCH,
    as_rollout_critic,
    as_rollout_policy,
    make_from_factory,
    source_kind,
)
from capsule_rollout.rollout.rollout_host import HostConfig, RolloutHost, capsule_key

ADVANTAGE_CHOICES = ("checkpoint", "none", "positive")
SPEC_FILE = "rollout.json"
"""Written next to a run's store: the spec its episodes were played with (read back by `replay`)."""
MIXED = "all"  # HostSpec.family of a mixed-family run: each work item names its family
ACTING_INFO = "acting"
"""Checkpoint info key: how a policy is deployed, `{"n_exec": int, "noise_scale": float}` (either may be absent;
`export_checkpoint --n_exec --noise_scale`); what the commands' `--act.*` options default to for it."""
DEFAULT_N_EXEC = HostConfig().n_exec


def recorded_acting(policy: str) -> dict:
    """The `ACTING_INFO` a policy checkpoint records ({} if none, or if `policy` is not a checkpoint: the
    commands that then need it say what is missing, from `check_spec` / `build_host`)."""
    from capsule_rollout.models.checkpoint import META_FILE, Checkpoint

    if not (Path(policy) / META_FILE).is_file():
        return {}
    return dict(Checkpoint(policy).meta.get("info", {}).get(ACTING_INFO) or {})


def resolve_acting(policy: str, n_exec: int | None = None, noise_scale: float | None = None) -> tuple[int, float]:
    """How to act: (actions of each chunk executed, scale of the policy noise); each as given, else what the
    policy checkpoint records, else `DEFAULT_N_EXEC` and 1."""
    recorded = recorded_acting(policy)
    return (n_exec if n_exec is not None else int(recorded.get("n_exec", DEFAULT_N_EXEC)),
            noise_scale if noise_scale is not None else float(recorded.get("noise_scale", 1.0)))


@dataclass(frozen=True)
class HostSpec:
    """Everything a rollout process needs to build its host (sent to each actor)."""

    family: str = "pick_place"
    """The tabletop task family (when `env` is empty); "all": a mixed-family run, where each work item names its
    family and an actor keeps one host per family."""
    env: str = ""
    """A registered env id (`metaworld:pick-place-v3`) or import path (`package.module:factory`) played instead of
    the tabletop family (`envs.suites.make_env`)."""
    policy: str = "experiments/checkpoints/policy"
    """A flow-policy checkpoint, or a `TorchPolicy` one (`policies.torch_policy`: any torch module)."""
    critic: str = "experiments/checkpoints/critic"
    """Critic checkpoint; empty: no critic (values recorded as NaN, no low-value stop)."""
    host: HostConfig = field(default_factory=HostConfig)
    advantage: str = "checkpoint"
    """RECAP indicator: `checkpoint` (what the checkpoint records; none for a BC policy), `none`, `positive`."""
    beta: float | None = None
    """Guidance weight: with `checkpoint`, overrides the recorded one; else None means no guidance."""
    noise_scale: float = 1.0
    """Scale of the policy's chunk noise (`PolicyRuntime`; a sampling temperature): 1 samples the learned
    distribution, 0 plays one chunk per observation."""
    device: str = "cpu"
    threads: int = 1
    """torch threads per host (one per actor when actors share the cores)."""
    pin_cores: bool = False
    """Pin actor i's process to CPU core i (mod the core count): one core per host, lanes included."""
    capsule_dir: str = ""
    """Where each episode's initial capsule is saved (for `replay`, and for another actor to restore
    it instead of a cold reset); empty: not saved."""
    capsule_budget_mb: float | None = None
    """Memory budget of each host's capsule store (None: unbounded). Past it, the least recently used
    unpinned capsules are dropped from memory (those saved in `capsule_dir` are read back from there)."""
    takeover: tuple[float, int] = ()
    """(threshold, steps): a simulated operator takes over with the scripted expert for `steps` control
    steps when the chunk's value is below `threshold` (sim RECAP); empty: none."""
    observers: tuple[tuple[str, str], ...] = ()
    """(import path `module:factory`, JSON kwargs) of episode observers built in each process."""

    def __post_init__(self) -> None:
        if self.advantage not in ADVANTAGE_CHOICES:
            raise ValueError(f"advantage must be one of {ADVANTAGE_CHOICES}, got {self.advantage!r}")
        check_noise_scale(self.noise_scale)
        if self.capsule_budget_mb is not None and not self.capsule_budget_mb >= 0:
            raise ValueError(f"capsule_budget_mb must be >= 0 or None, got {self.capsule_budget_mb}")
        if self.family == MIXED and self.env:
            raise ValueError(f"family {MIXED!r} mixes the tabletop families; it cannot go with env {self.env!r}")
        if self.takeover and (len(self.takeover) != 2 or int(self.takeover[1]) < 1):
            raise ValueError(f"takeover is (threshold, steps >= 1), got {self.takeover}")

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> HostSpec:
        data = dict(data)
        data.pop("crash", None)  # written by earlier versions (a test hook, always empty in a run's file)
        host = data.pop("host", {})
        host = HostConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in host.items()})
        observers = tuple(tuple(o) for o in data.pop("observers", ()))
        return cls(host=host, observers=observers,
                   **{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})

    def conditioning(self) -> Conditioning:
        if source_kind(self.policy) != FLOW:  # only the flow policy takes RECAP conditioning (check_spec refuses any)
            return Conditioning()
        return resolve_conditioning(self.policy, self.advantage, self.beta)


def write_spec(directory: str | os.PathLike, spec: HostSpec) -> Path:
    """Save `spec` as the run's `rollout.json`."""
    path = Path(directory) / SPEC_FILE
    path.write_text(json.dumps(spec.to_json(), indent=2) + "\n")
    return path


def read_spec(directory: str | os.PathLike) -> HostSpec:
    path = Path(directory) / SPEC_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: replay needs the host spec that sim_rollout writes")
    return HostSpec.from_json(json.loads(path.read_text()))


def check_same_run(out: Path, spec: HostSpec) -> None:
    """A resumed run must play as the recorded one did: refuse an --out made with other settings."""
    try:
        recorded = read_spec(out).to_json()
    except FileNotFoundError:
        return
    now = spec.to_json()
    # they do not change what is played (observers watch the episodes)
    free = {"threads", "pin_cores", "capsule_budget_mb", "observers"}
    differ = sorted(k for k in now if k not in free and recorded.get(k) != now[k])
    if differ:
        raise ValueError(f"{out} holds a run made with other settings ({', '.join(differ)} differ; see "
                         f"{out / 'rollout.json'}): use another --out, or the same settings to resume it")


def check_spec(spec: HostSpec) -> None:
    """Fail fast (before any process starts) on checkpoints that are missing or do not fit together."""
    from capsule_rollout.critics.value_critic import KIND as CRITIC_KIND
    from capsule_rollout.critics.value_critic import CriticConfig
    from capsule_rollout.models.checkpoint import Checkpoint
    from capsule_rollout.policies.flow_policy import KIND as POLICY_KIND
    from capsule_rollout.policies.flow_policy import FlowPolicyConfig
    from capsule_rollout.policies.torch_policy import KIND as TORCH_POLICY_KIND

    if not spec.policy:
        raise ValueError("no policy: give a checkpoint directory or a factory's import path (--policy)")
    kinds = {what: source_kind(path) for what, path in (("policy", spec.policy), ("critic", spec.critic)) if path}
    for what, path in (("policy", spec.policy), ("critic", spec.critic)):
        if not path:
            continue
        if kinds[what] == FACTORY:
            resolve(path, what)  # a factory that cannot be imported fails here, before any process starts
        elif not Path(path).is_dir():
            raise FileNotFoundError(f"{what} checkpoint {path!r} not found: give a checkpoint directory (train_{what} "
                                    f"makes one) or a factory's import path `package.module:make_{what}`")
    if spec.env:
        from capsule_rollout.envs.suites import parse_env_id

        suite, _ = parse_env_id(spec.env)
        if suite is not None:
            suite.load()  # a missing or incompatible suite fails here, before any process starts
    if spec.host.value_threshold is not None and not spec.critic:
        raise ValueError("--value_threshold needs a critic (--critic)")
    if spec.takeover and not spec.critic:
        raise ValueError("value-triggered takeovers need a critic")
    for path, kwargs in spec.observers:
        _resolve(path)
        json.loads(kwargs or "{}")
    if kinds["policy"] != FLOW:
        if spec.advantage == "positive" or spec.beta is not None:
            raise ValueError(f"RECAP conditioning (--advantage, --beta) is the flow policy's; {spec.policy!r} takes "
                             "none: leave them unset")
        if spec.noise_scale != 1.0:
            raise ValueError(f"noise_scale {spec.noise_scale} applies to the flow policy; {spec.policy!r} gets its noise "
                             "as drawn: leave the noise scale unset (--act.noise_scale, export_checkpoint --noise_scale)")
        if kinds["policy"] == TORCH:
            chunk = Checkpoint(spec.policy, kind=TORCH_POLICY_KIND).config["chunk_length"]
            if spec.host.n_exec > chunk:
                raise ValueError(f"--n_exec {spec.host.n_exec} exceeds the policy's chunk length ({chunk})")
        return  # a factory's chunk length is known once it is built: the host checks --n_exec then
    policy = FlowPolicyConfig.from_json(Checkpoint(spec.policy, kind=POLICY_KIND).config["model"])
    if spec.critic and kinds["critic"] != FACTORY:
        critic = CriticConfig.from_json(Checkpoint(spec.critic, kind=CRITIC_KIND).config["model"])
        if policy.image_size != critic.image_size:
            raise ValueError(f"policy images are {policy.image_size}px, critic images "
                             f"{critic.image_size}px: use checkpoints trained on the same images")
    if spec.host.n_exec > policy.chunk_length:
        raise ValueError(f"--n_exec {spec.host.n_exec} exceeds the policy's chunk length ({policy.chunk_length})")
    spec.conditioning()  # refuses a --beta the checkpoint cannot take


def _resolve(path: str):
    return resolve(path, "observer")


def parse_observers(items) -> tuple[tuple[str, str], ...]:
    """`package.module:factory` or `package.module:factory={JSON kwargs}` (the command line's form) as
    `HostSpec.observers` entries; malformed JSON is refused naming the item."""
    parsed = []
    for item in items:
        path, _, kwargs = item.partition("=")
        try:
            if not isinstance(json.loads(kwargs or "{}"), dict):
                raise ValueError("not an object")
        except ValueError as exc:
            raise ValueError(f"observer {item!r}: the kwargs after '=' must be a JSON object ({exc})") from None
        parsed.append((path, kwargs))
    return tuple(parsed)


def make_observers(spec: HostSpec) -> list[EpisodeObserver]:
    return [_resolve(path)(**json.loads(kwargs or "{}")) for path, kwargs in spec.observers]


def build_host(spec: HostSpec, *, recorder=None, observers: list[EpisodeObserver] | None = None,
               env: RolloutEnv | None = None, operator=None, teleop=None) -> RolloutHost:
    """The host a spec describes. `observers`: instead of the spec's (e.g. objects built in-process);
    `env`: instead of the spec's tabletop family (a `RobotEnv`, a third-party env); `operator`, `teleop`:
    see `RolloutHost`."""
    if spec.family == MIXED and env is None:
        raise ValueError("a mixed-family spec (family 'all') builds one host per family: "
                         "pass dataclasses.replace(spec, family=<the family>)")
    if spec.threads:
        torch.set_num_threads(spec.threads)
    check_spec(spec)
    parts = _load_parts(spec)
    if env is None:
        env = _make_env(spec, parts.cameras, parts.image_size)
    policy = as_rollout_policy(parts.policy, env, device=spec.device)
    critic = as_rollout_critic(parts.critic, env) if parts.critic is not None else None
    host = RolloutHost(env=env, policy=policy, critic=critic, config=spec.host, recorder=recorder, operator=operator,
                       teleop=teleop, store=CapsuleStore(device_bytes=None if spec.capsule_budget_mb is None
                                                         else int(spec.capsule_budget_mb * 2**20), host_bytes=0),
                       observers=make_observers(spec) if observers is None else observers)
    if parts.conditioning is not None:
        policy.set_conditioning(parts.conditioning.indicator, parts.conditioning.beta)
    if spec.takeover:
        from capsule_rollout.envs.scripted_expert import ScriptedExpert
        from capsule_rollout.rollout.value_takeover import ValueTakeover

        host.teleop = ScriptedExpert(env).act
        host.operator = ValueTakeover(float(spec.takeover[0]), int(spec.takeover[1])).bind(host)
    return host


@dataclass
class _Parts:
    """What a spec's policy and critic sources load to, before the env is known."""

    policy: object
    critic: object | None
    cameras: tuple[str, ...] | None  # what the env must render (None: its default camera)
    image_size: int
    conditioning: Conditioning | None  # a flow policy's RECAP conditioning, set once the host is built


def _load_parts(spec: HostSpec) -> _Parts:
    cameras: list[str] = []
    sizes: set[int] = set()
    conditioning = None
    kind = source_kind(spec.policy)
    if kind == FACTORY:
        policy = make_from_factory(spec.policy, "policy")
    elif kind == TORCH:
        policy = load_torch_policy(spec.policy, device=spec.device)
        for key in policy.spec.observation_keys:
            if key.startswith("image_"):
                cameras.append(key.removeprefix("image_"))
                sizes.add(policy.shapes[key][0][0])
    else:
        conditioning = spec.conditioning()
        flow = load_policy(spec.policy, spec.device)
        policy = PolicyRuntime(flow, device=spec.device, guidance=conditioning.beta is not None,
                               noise_scale=spec.noise_scale)
        cameras += flow.config.cameras
        sizes.add(flow.config.image_size)
    critic = None
    if spec.critic and source_kind(spec.critic) == FACTORY:
        critic = make_from_factory(spec.critic, "critic")
    elif spec.critic:
        value = load_critic(spec.critic, spec.device)
        critic = CriticRuntime(value, device=spec.device)
        cameras += value.config.cameras
        sizes.add(value.config.image_size)
    if len(sizes) > 1:
        raise ValueError(f"the policy and critic read images of {sorted(sizes)} px: use ones made for the same images")
    return _Parts(policy, critic, tuple(dict.fromkeys(cameras)) or None, sizes.pop() if sizes else 64, conditioning)


def _make_env(spec: HostSpec, cameras: tuple[str, ...] | None, image_size: int) -> RolloutEnv:
    """The spec's env: a suite env (`spec.env`; cameras None: its default one) or the tabletop family."""
    if spec.env:
        from capsule_rollout.envs.suites import make_env

        return make_env(spec.env, cameras=cameras or None, image_size=image_size)
    return TabletopEnv(spec.family, cameras=cameras or ("front",), image_size=image_size)


def capsule_path(capsule_dir: str | os.PathLike, task: str, seed: int) -> Path:
    return Path(capsule_dir) / f"{capsule_key(task, seed)}.capsule"


def save_initial_capsule(host: RolloutHost, spec: HostSpec, seed: int) -> Path | None:
    """Write the seed's initial capsule under `spec.capsule_dir` once (atomic; kept for replay)."""
    if not spec.capsule_dir or not getattr(host.env, "restorable", True):
        return None
    path = capsule_path(spec.capsule_dir, host.task, seed)
    capsule = host.initial_capsule  # the store may have dropped it already (a budget)
    if not path.exists() and capsule is not None and capsule.meta.label == capsule_key(host.task, seed):
        path.parent.mkdir(parents=True, exist_ok=True)
        save_capsule(capsule, path, annotations={"host_spec": json.dumps(spec.to_json())})
    return path
