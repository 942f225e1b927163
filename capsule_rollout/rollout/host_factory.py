"""Building a `RolloutHost` from a `RunSpec` (plain Python; used by the Ray actors, replay, evaluation).

A `RunSpec` is everything a rollout process needs, as plain data (sent to each
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from capsule_rollout.capsules import Arena, CapsuleStore
from capsule_rollout.envs.rollout_env import ArraySpec, RolloutEnv
from capsule_rollout.import_path import register_objects, resolve, split_kwargs
from capsule_rollout.models.runtime import SUMS, batch_invariance
from capsule_rollout.policies.conditioning import Conditioning, check_noise_scale, resolve_conditioning
from capsule_rollout.policies.rollout_policy import RolloutPolicy
from capsule_rollout.rollout.observer import EpisodeObserver
from capsule_rollout.rollout.rollout_host import HostConfig, RolloutHost
from capsule_rollout.rollout.sources import (
    ACTING_INFO,
    FACTORY,
    REMOTE,
    Described,
    Loaded,
    as_rollout_critic,
    as_rollout_policy,
    describe_remote,
    describe_source,
    load_source,
    source_kind,
)
from capsule_rollout.shipped import shipped_path

ADVANTAGE_CHOICES = ("checkpoint", "none", "positive")
SPEC_FILE = "rollout.json"
"""Written next to a run's store: the spec its episodes were played with (read back by `replay`)."""
ANY_TASK = "*"
"""`suite:*` as `RunSpec.env`: a run over several of the suite's tasks, each work item naming its own
(`WorkItem.task`); an actor keeps one host per task."""
DEFAULT_N_EXEC = HostConfig().n_exec
DEFAULT_IMAGE_SIZE = 64
MAX_IMAGE_SIZE = 1024


def recorded_acting(policy: str) -> dict:
    """The `ACTING_INFO` a policy checkpoint records ({} if none, or if `policy` is not a checkpoint: the
    commands that then need it say what is missing, from `check_spec` / `build_host`)."""
    from capsule_rollout.models.checkpoint import META_FILE, Checkpoint

    if source_kind(policy) == REMOTE:  # a policy server: the receding horizon it announces, if any
        return {k: v for k, v in (describe_remote(policy).metadata.get(ACTING_INFO) or {}).items() if k == "n_exec"}
    if not (Path(policy) / META_FILE).is_file():
        return {}
    return dict(Checkpoint(policy).meta.get("info", {}).get(ACTING_INFO) or {})


def resolve_acting(policy: str, n_exec: int | None = None, noise_scale: float | None = None, *,
                   described: Described | None = None) -> tuple[int, float]:
    """How to act: (actions of each chunk executed, scale of the policy noise); each as given, else what the
    policy checkpoint records (or, for a checkpoint of another format, what its loader describes: a LeRobot
    policy acts one action per chunk; a policy server, what it announces), else `DEFAULT_N_EXEC` and 1.
    `described`: the policy as already described (`describe_early`), so that it is not described again."""
    if described is None:
        recorded = recorded_acting(policy)
        if n_exec is None and "n_exec" not in recorded:
            n_exec = _described_n_exec(policy)
    else:
        recorded = {} if source_kind(policy) == REMOTE else recorded_acting(policy)
        if n_exec is None and "n_exec" not in recorded:
            n_exec = described.n_exec
    return (n_exec if n_exec is not None else int(recorded.get("n_exec", DEFAULT_N_EXEC)),
            noise_scale if noise_scale is not None else float(recorded.get("noise_scale", 1.0)))


def describe_early(policy: str) -> Described | None:
    """The policy described once where a command starts, for how it acts and for its resolution (`run_spec`);
    None for a factory, or a source that cannot be described here (its resolution then says why)."""
    if source_kind(policy) == FACTORY:
        return None
    try:
        return describe_source(policy)
    except (FileNotFoundError, ValueError, OSError):
        return None


def _described_n_exec(policy: str) -> int | None:
    """The `n_exec` a checkpoint without `checkpoint.json` describes (None: none, or not such a checkpoint; a
    source that cannot be described is reported where it is checked, by `check_spec`)."""
    from capsule_rollout.models.checkpoint import META_FILE

    if source_kind(policy) == FACTORY or not Path(policy).is_dir() or (Path(policy) / META_FILE).is_file():
        return None
    try:
        return describe_source(policy).n_exec
    except (FileNotFoundError, ValueError):
        return None


@dataclass(frozen=True)
class RunSpec:
    """What a run plays, the one spec of a run: the env, policy and critic sources, how the policy acts, how each
    episode is played (`host`: a `HostConfig`), and where and how the hosts run (slots, device, threads, capsules).
    Everything a rollout process needs to build its host, as plain data: sent to each actor, written to the run's
    `rollout.json` and signed into each seed's initial capsule."""

    env: str = ""
    """The env (`envs.suites.make_env`): a registered id `suite:task` (`gymnasium:Pusher-v5`, the example's
    `tabletop:pick_place`), `suite:*` (several of the suite's tasks, each work item naming its own), or a
    factory's import path `package.module:make_env`; empty only where the host is handed its env (a robot)."""
    policy: str = ""
    """A checkpoint directory (loaded by its kind's loader: the example's flow policy, a `TorchPolicy`...) or a
    factory's import path `package.module:make_policy` (`rollout.sources`)."""
    critic: str = ""
    """A critic checkpoint or factory import path; empty: no critic (values recorded as NaN, no low-value stop)."""
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
    slots: int = 1
    """Env slots per host (`rollout.slots.host`): episodes played side by side in one process, their policy and
    critic calls batched. Part of the run's identity: the project's policy and critic play the same episodes at
    any N (batch-invariant runtimes), a user's may round by batch size (`rollout.slots.check`)."""
    env_threads: int = 1
    """Threads that step a host's slots between batched calls (slot i on thread i mod W): slots step in parallel
    where the env releases the GIL (MuJoCo). Does not change what is played."""
    batch_invariant: bool = True
    """The project's policy and critic runtimes batch-invariant (`models.runtime`: a row gets what a batch of one
    gives it, so an episode is the same at any slot count); False: the network over the batch as it is (a host of
    one slot about 1.3x faster with the shipped policy, episodes that change with `slots`). Part of what is
    played; a run recorded before this setting existed played as False."""
    sums: str = "exact"
    """How the batch-invariant runtimes sum (`models.runtime.SUMS`): "exact"; "padded" is how runs recorded before
    exact sums played (a `rollout.json` without this setting), so that they resume and replay as they played."""
    cameras: tuple[str, ...] | None = None
    """Cameras the env renders (and episodes record), by the env's names (a camera the MuJoCo model defines
    too); () for none; None: what the policy and critic read (the env's default camera for a part that does
    not say). Those the policy and critic read must be among them."""
    image_size: int | None = None
    """Side of the rendered images in pixels; None: what the policy and critic were made for, else 64."""
    objects: tuple[tuple[str, Any], ...] = field(default=(), compare=False, repr=False)
    """(source, object) of each source handed over in Python (`import_path.object_source`: a factory or class a
    script defined, `record_rollouts(env=make_env)`): they travel with the spec to every process that builds a host
    (Ray ships them), never into `rollout.json`."""
    resolved: Resolved | None = field(default=None, compare=False, repr=False)
    """What the sources are, found once where a command starts (`resolve_spec`) and carried down with the spec to
    every process that builds a host from it; never into `rollout.json`."""

    def __post_init__(self) -> None:
        if self.cameras is not None and any(not isinstance(c, str) or not c for c in self.cameras):
            raise ValueError(f"cameras are the env's camera names, got {self.cameras!r}")
        if self.image_size is not None and not 8 <= self.image_size <= MAX_IMAGE_SIZE:
            raise ValueError(f"image_size must be within 8..{MAX_IMAGE_SIZE} pixels, got {self.image_size}")
        if self.advantage not in ADVANTAGE_CHOICES:
            raise ValueError(f"advantage must be one of {ADVANTAGE_CHOICES}, got {self.advantage!r}")
        check_noise_scale(self.noise_scale)
        if self.capsule_budget_mb is not None and not self.capsule_budget_mb >= 0:
            raise ValueError(f"capsule_budget_mb must be >= 0 or None, got {self.capsule_budget_mb}")
        if self.sums not in SUMS:
            raise ValueError(f"sums is one of {SUMS}, got {self.sums!r}")
        if self.slots < 1 or self.env_threads < 1:
            raise ValueError(f"slots and env_threads must be >= 1, got {self.slots}, {self.env_threads}")
        if self.takeover and (len(self.takeover) != 2 or int(self.takeover[1]) < 1):
            raise ValueError(f"takeover is (threshold, steps >= 1), got {self.takeover}")

    def to_json(self) -> dict:
        data = dataclasses.asdict(dataclasses.replace(self, objects=(), resolved=None))
        data.pop("objects")  # objects are not data: the sources name them
        data.pop("resolved")  # found again from the sources wherever the file is read
        return data

    @classmethod
    def from_json(cls, data: dict) -> RunSpec:
        data = dict(data)
        data.pop("crash", None)  # written by earlier versions (a test hook, always empty in a run's file)
        data.setdefault("batch_invariant", False)  # written before batch-invariant runtimes: the batch as it was
        data.setdefault("sums", "padded")  # written before exact sums: rows padded as they were
        family = data.pop("family", None)  # earlier versions: a tabletop family ("all": every one) when no env
        if family and not data.get("env"):
            data["env"] = f"tabletop:{ANY_TASK if family == 'all' else family}"
        for source in ("policy", "critic"):  # the shipped checkpoints as another install, or an earlier one, named them
            data[source] = shipped_path(data.get(source) or "")
        host = data.pop("host", {})
        host = HostConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in host.items()})
        observers = tuple(tuple(o) for o in data.pop("observers", ()))
        return cls(host=host, observers=observers,
                   **{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})

    def conditioning(self) -> Conditioning:
        """How the policy acts (a checkpoint that takes RECAP conditioning: what it records, unless overridden;
        any other policy: none, and check_spec refuses any asked for)."""
        return resolve_spec(self).resolved.conditioning


def _conditioning(spec: RunSpec, described: Described | None) -> Conditioning:
    if described is None or not described.takes_conditioning:
        return Conditioning()
    return resolve_conditioning(spec.policy, spec.advantage, spec.beta)


def write_spec(directory: str | os.PathLike, spec: RunSpec) -> Path:
    """Save `spec` as the run's `rollout.json`."""
    path = Path(directory) / SPEC_FILE
    path.write_text(json.dumps(spec.to_json(), indent=2) + "\n")
    return path


def read_spec(directory: str | os.PathLike) -> RunSpec:
    path = Path(directory) / SPEC_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: replay needs the host spec that sim_rollout writes")
    return RunSpec.from_json(json.loads(path.read_text()))


def check_same_run(out: Path, spec: RunSpec) -> None:
    """A resumed run must play as the recorded one did: refuse an --out made with other settings."""
    try:
        recorded = read_spec(out).to_json()
    except FileNotFoundError:
        return
    now = spec.to_json()
    # they do not change what is played (observers watch the episodes; the lanes only run the same calls at once;
    # the capsules' directory is the run's own, wherever the run directory was moved or copied)
    free = {"threads", "pin_cores", "capsule_budget_mb", "observers", "env_threads", "capsule_dir"}
    played = lambda data, k: ({f: v for f, v in data[k].items() if f != "lanes"}  # noqa: E731
                              if k == "host" and isinstance(data.get(k), dict) else data.get(k))
    differ = sorted(k for k in now if k not in free and played(recorded, k) != played(now, k))
    if differ:
        raise ValueError(f"{out} holds a run made with other settings ({', '.join(differ)} differ; see "
                         f"{out / 'rollout.json'}): use another --out, or the same settings to resume it")


@dataclass(frozen=True)
class Resolved:
    """A spec's sources as `resolve_spec` found them: each checked, the policy and critic described (None: a
    factory, known once built; or a policy given otherwise), the policy's RECAP conditioning read. `of`: what
    they were found for (`_resolution_key`); a spec whose sources changed since is resolved again."""

    of: tuple
    policy: Described | None
    critic: Described | None
    conditioning: Conditioning
    policy_checked: bool


def _resolution_key(spec: RunSpec) -> tuple:
    """What a resolution depends on: the sources and how the policy is asked to act; of the env, its suite (a
    run over `suite:*` builds a host per task from one resolution) or its factory."""
    suite, _, _ = spec.env.partition(":")
    env = suite if suite and "." not in suite and "/" not in suite else spec.env
    return (env, spec.policy, spec.critic, spec.advantage, spec.beta, spec.noise_scale, spec.host.value_threshold,
            spec.takeover, spec.observers)


def resolve_spec(spec: RunSpec, *, policy_given: bool = False, described: Described | None = None) -> RunSpec:
    """`spec` with its sources resolved (`RunSpec.resolved`), once: a command resolves its spec at the top, and
    every host built from it below (the preflight's, each actor's) takes the resolution as it is. Fails fast
    (before any process starts) on sources that are missing or do not fit together. `policy_given`: the host gets
    its policy object otherwise (a replay's recorded chunks): the spec's policy source is not checked. `described`:
    the policy as the command already described it (`describe_early`)."""
    key = _resolution_key(spec)
    known = spec.resolved
    if known is not None and known.of == key and (known.policy_checked or policy_given):
        _check_n_exec(spec, known.policy)  # the one thing a preflight may set after the resolution
        return spec
    register_objects(spec.objects)  # the objects its sources name, resolvable here
    policy, critic, conditioning = _resolve_sources(spec, policy_given=policy_given, described=described)
    return dataclasses.replace(spec, resolved=Resolved(key, policy, critic, conditioning, not policy_given))


def check_spec(spec: RunSpec, *, policy_given: bool = False) -> Conditioning:
    """`resolve_spec`'s checks; returns how the policy acts (`RunSpec.conditioning`)."""
    return resolve_spec(spec, policy_given=policy_given).resolved.conditioning


def _check_n_exec(spec: RunSpec, policy: Described | None) -> None:
    if policy is not None and policy.chunk_length and spec.host.n_exec > policy.chunk_length:
        raise ValueError(f"--n_exec {spec.host.n_exec} exceeds the policy's chunk length ({policy.chunk_length})")


def _resolve_sources(spec: RunSpec, *, policy_given: bool, described: Described | None = None,
                     ) -> tuple[Described | None, Described | None, Conditioning]:
    """Check and describe each source of `spec` (`resolve_spec`)."""
    if not spec.policy:
        raise ValueError("no policy: give a checkpoint directory or a factory's import path (--policy)")
    for what, path in (("policy", "" if policy_given else spec.policy), ("critic", spec.critic)):
        if not path:
            continue
        if source_kind(path) == REMOTE:
            if what != "policy":
                raise ValueError(f"{path!r} is a policy server; a critic is a checkpoint or a factory's import path")
        elif source_kind(path) == FACTORY:
            resolve(split_kwargs(path, what)[0], what)  # one that cannot be imported fails here, before any process
        elif not Path(path).is_dir():
            raise FileNotFoundError(f"{what} checkpoint {path!r} not found: give a checkpoint directory (train_{what} "
                                    f"makes one) or a factory's import path `package.module:make_{what}`")
    if spec.env:
        from capsule_rollout.envs.suites import parse_env_id

        suite, _ = parse_env_id(spec.env)
        if suite is not None:
            suite.load()  # a missing or incompatible suite fails here, before any process starts
        else:
            resolve(split_kwargs(spec.env, "env")[0], "env")  # so does a factory's module that fails to import
    if spec.host.value_threshold is not None and not spec.critic:
        raise ValueError("--value_threshold needs a critic (--critic)")
    if spec.takeover and not spec.critic:
        raise ValueError("value-triggered takeovers need a critic")
    for path, kwargs in spec.observers:
        _resolve(path)
        json.loads(kwargs or "{}")
    policy = None if policy_given else described if described is not None else describe_source(spec.policy)
    critic = describe_source(spec.critic) if spec.critic else None
    if policy is None or not policy.takes_conditioning:
        if spec.advantage == "positive" or spec.beta is not None:
            raise ValueError(f"RECAP conditioning (--advantage, --beta): {spec.policy!r} takes none; leave them unset")
    if (policy is None or not policy.takes_noise_scale) and spec.noise_scale != 1.0:
        raise ValueError(f"noise_scale {spec.noise_scale}: {spec.policy!r} gets its noise as drawn; leave the noise "
                         "scale unset (--act.noise_scale, export_checkpoint --noise_scale)")
    _check_n_exec(spec, policy)
    sizes = {d.image_size for d in (policy, critic) if d is not None and d.image_size}
    if len(sizes) > 1:
        raise ValueError(f"the policy and critic read images of {sorted(sizes)} px: use checkpoints trained on the "
                         "same images")
    return policy, critic, _conditioning(spec, policy)  # refuses a --beta the checkpoint cannot take


def _resolve(path: str):
    return resolve(path, "observer")


def parse_observers(items) -> tuple[tuple[str, str], ...]:
    """`package.module:factory` or `package.module:factory={JSON kwargs}` (the command line's form) as
    `RunSpec.observers` entries; malformed JSON is refused naming the item."""
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


def make_observers(spec: RunSpec) -> list[EpisodeObserver]:
    return [_resolve(path)(**json.loads(kwargs or "{}")) for path, kwargs in spec.observers]


def build_host(spec: RunSpec, *, recorder=None, observers: list[EpisodeObserver] | None = None,
               env: RolloutEnv | None = None, operator=None, teleop=None,
               policy: Callable[[], Loaded] | None = None) -> RolloutHost:
    """The host a spec describes. `observers`: instead of the spec's (e.g. objects built in-process);
    `env`: instead of the spec's (a `RobotEnv`, an env made in this process); `operator`, `teleop`:
    see `RolloutHost`; `policy`: makes the policy instead of the spec's source (a replay's recorded chunks)."""
    parts = _prepare(spec, env_given=env is not None, policy=policy)
    if env is None:
        env = _make_env(spec, parts.cameras, parts.image_size)
    policy = as_rollout_policy(parts.policy, env, device=spec.device)
    critic = as_rollout_critic(parts.critic, env) if parts.critic is not None else None
    host = RolloutHost(env=env, policy=policy, critic=critic, config=spec.host, recorder=recorder, operator=operator,
                       teleop=teleop, store=_store(spec), observers=make_observers(spec) if observers is None else observers)
    return _equip(host, spec, parts)


@dataclass
class BuiltPolicy:
    """A spec's policy alone, in an arena of its own, its RECAP conditioning set (`build_policy`)."""

    policy: RolloutPolicy
    arena: Arena
    arrays: dict[str, ArraySpec]  # each observation key it reads: shape and dtype, as the spec's env gives it
    conditioning: Conditioning  # how it acts (what `check_spec` resolved)


def build_policy(spec: RunSpec) -> BuiltPolicy:
    """The policy a spec describes without a host (what `serve_policy` serves): loaded and adapted as a host
    would (sized from the spec's env, made once to read its spaces and closed), its conditioning set."""
    parts = _prepare(spec)
    env = _make_env(spec, parts.cameras, parts.image_size)
    try:
        policy = as_rollout_policy(parts.policy, env, device=spec.device)
        arrays = {k: env.observation_spec.arrays[k] for k in policy.spec.observation_keys}
    finally:
        env.close()
    arena = Arena([policy]).allocate()
    if parts.conditioning is not None:
        policy.set_conditioning(parts.conditioning.indicator, parts.conditioning.beta)
    return BuiltPolicy(policy, arena, arrays, parts.checked)


def _store(spec: RunSpec) -> CapsuleStore:
    return CapsuleStore(device_bytes=None if spec.capsule_budget_mb is None else int(spec.capsule_budget_mb * 2**20),
                        host_bytes=0)


def _prepare(spec: RunSpec, *, env_given: bool = False, policy: Callable[[], Loaded] | None = None) -> _Parts:
    """What every host of `spec` starts from: the checks, torch's threads, the policy and critic loaded
    (`policy`: made by this instead of loaded from the spec's source)."""
    if not env_given and is_multi_task(spec.env):
        raise ValueError(f"a spec over several tasks ({spec.env!r}) builds one host per task: pass "
                         "dataclasses.replace(spec, env=env_for_task(spec.env, <the task>))")
    if spec.threads:
        torch.set_num_threads(spec.threads)
    register_objects(spec.objects)  # the objects its sources name, resolvable here (an actor's process too)
    spec = resolve_spec(spec, policy_given=policy is not None)  # as resolved above it, where it was
    return _load_parts(spec, spec.resolved.conditioning, policy)


def build_slots(spec: RunSpec, *, recorder=None, policy: Callable[[], Loaded] | None = None, task: str = ""):
    """The `SlotHost` of `spec.slots` slots a spec describes: an env per slot, the policy and critic as rows (one
    batched runtime when they batch, else an instance per slot), one capsule store, the spec's observers per
    slot. `policy`: as `build_host`'s (called once per instance). A spec over several tasks (`suite:*`): the slots
    start on `task` and play any task of the suite (`episode_job(..., task=)`), each slot's host for a task made
    when it first plays it, over the same rows (one policy and critic for every task)."""
    from capsule_rollout.rollout.slots.host import LoopRows, SlotHost, rows_of

    multi = is_multi_task(spec.env)
    if multi and not task:
        raise ValueError(f"a spec over several tasks ({spec.env!r}): give the task its slots start on (task=)")
    first = dataclasses.replace(spec, env=env_for_task(spec.env, task)) if multi else spec
    parts = _prepare(first, policy=policy)
    n = spec.slots
    envs = [_make_env(first, parts.cameras, parts.image_size) for _ in range(n)]
    as_policy = lambda part: as_rollout_policy(part, envs[0], device=spec.device)  # noqa: E731
    as_critic = lambda part: as_rollout_critic(part, envs[0])  # noqa: E731
    # a part that does not batch: another instance per slot, loaded from its source again (that part alone)
    load = policy if policy is not None else lambda: _load_policy(first, parts.checked)
    policy = rows_of(as_policy(parts.policy), n, lambda: as_policy(load().part))
    critic = None if parts.critic is None else rows_of(as_critic(parts.critic), n,
                                                       lambda: as_critic(_load_critic(first).part))
    lanes = None
    if critic is not None:
        from capsule_rollout.policies.execution_context import TwoLaneContext

        lanes = TwoLaneContext(policy.slot(0).device)
    store = _store(spec)

    def slot_host(i: int, env: RolloutEnv, mine=None, my_critic=None) -> RolloutHost:
        host = RolloutHost(env=env, policy=mine or policy.slot(i), critic=my_critic or (
            None if critic is None else critic.slot(i)), config=spec.host, recorder=recorder, store=store,
            observers=make_observers(spec), lanes=lanes)
        return _equip(host, spec, parts)

    def make_slot(i: int, other: str) -> RolloutHost:
        """Slot i's host for task `other`: over row i (rows of an instance per slot: an instance of its own)."""
        env = _make_env(dataclasses.replace(spec, env=env_for_task(spec.env, other)), parts.cameras, parts.image_size)
        mine = as_policy(load().part) if isinstance(policy, LoopRows) else None
        my_critic = as_critic(_load_critic(first).part) if isinstance(critic, LoopRows) else None
        return slot_host(i, env, mine, my_critic)

    return SlotHost([slot_host(i, envs[i]) for i in range(n)], policy, critic, lanes, env_threads=spec.env_threads,
                    make_slot=make_slot if multi else None, task=task if multi else "")


def _equip(host: RolloutHost, spec: RunSpec, parts: _Parts) -> RolloutHost:
    """The spec's conditioning and simulated operator on a built host."""
    env = host.env
    if parts.conditioning is not None:
        host.policy.set_conditioning(parts.conditioning.indicator, parts.conditioning.beta)
    if spec.takeover:
        from capsule_rollout.envs.suites import expert_for
        from capsule_rollout.rollout.value_takeover import ValueTakeover

        host.teleop = expert_for(env)
        if host.teleop is None:
            raise ValueError(f"value-triggered takeovers need a scripted expert for {env.task!r}; its suite has none")
        host.operator = ValueTakeover(float(spec.takeover[0]), int(spec.takeover[1])).bind(host)
    return host


@dataclass
class _Parts:
    """What a spec's policy and critic sources load to, before the env is known."""

    policy: object
    critic: object | None
    cameras: tuple[str, ...] | None  # what the env must render (None: its default camera; (): none)
    image_size: int
    conditioning: Conditioning | None  # a flow policy's RECAP conditioning, set once the host is built
    checked: Conditioning  # what `check_spec` resolved: how the policy source is loaded


def _load_policy(spec: RunSpec, conditioning: Conditioning) -> Loaded:
    return load_source(spec.policy, "policy", device=spec.device, conditioning=conditioning,
                       noise_scale=spec.noise_scale)


def _load_critic(spec: RunSpec) -> Loaded:
    return load_source(spec.critic, "critic", device=spec.device, conditioning=Conditioning(), noise_scale=1.0)


def _load_parts(spec: RunSpec, conditioning: Conditioning, make_policy: Callable[[], Loaded] | None = None) -> _Parts:
    with batch_invariance(spec.batch_invariant, spec.sums):
        policy = make_policy() if make_policy is not None else _load_policy(spec, conditioning)
        critic = _load_critic(spec) if spec.critic else None
    loaded = [part for part in (policy, critic) if part is not None]
    cameras = tuple(dict.fromkeys(c for part in loaded for c in part.cameras))
    sizes = {part.image_size for part in loaded if part.image_size}
    if len(sizes) > 1:
        raise ValueError(f"the policy and critic read images of {sorted(sizes)} px: use ones made for the same images")
    # no camera when every part says what it reads and none reads an image (the env renders nothing); the env's
    # default camera when a part reads whatever the env gives
    render = cameras if cameras or all(part.declared for part in loaded) else None
    if spec.cameras is not None:  # asked for: rendered (and recorded), the parts' own among them
        missing = [c for c in cameras if c not in spec.cameras]
        if missing:
            raise ValueError(f"the policy or critic reads camera(s) {missing}, which --cameras {list(spec.cameras)} "
                             "leaves out: add them")
        render = tuple(spec.cameras)
    size = sizes.pop() if sizes else None
    if spec.image_size is not None and size is not None and spec.image_size != size:
        raise ValueError(f"--image_size {spec.image_size}: the policy or critic reads images of {size} px; leave it "
                         "unset or give that size")
    return _Parts(policy.part, critic.part if critic else None, render, size or spec.image_size or DEFAULT_IMAGE_SIZE,
                  policy.conditioning, conditioning)


def _make_env(spec: RunSpec, cameras: tuple[str, ...] | None, image_size: int) -> RolloutEnv:
    """The spec's env (a registered id or an import path; cameras None: its default one, (): none)."""
    from capsule_rollout.envs.suites import make_env

    if not spec.env:
        raise ValueError("no env: give a registered id `suite:task` or a factory's import path "
                         "`package.module:make_env` (RunSpec.env, --env)")
    return make_env(spec.env, cameras=cameras, image_size=image_size)


def is_multi_task(env: str) -> bool:
    """Whether `env` is `suite:*`: a run over several of the suite's tasks."""
    return env.endswith(f":{ANY_TASK}")


def env_for_task(env: str, task: str) -> str:
    """The env id of one task of a `suite:*` run (`env` itself otherwise, whatever `task` says)."""
    return f"{env[: -len(ANY_TASK)]}{task}" if is_multi_task(env) and task else env
