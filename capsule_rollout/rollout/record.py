"""Recording rollouts and replaying them, as library calls: what `sim_rollout` and `replay` do, for a script.

    result = record_rollouts("runs/mine", env="my_lab.envs:make_env", policy="my_lab.policy:make_policy",
                             seeds=range(4), repeats=2, actors=2)
    replay_episode("runs/mine", result.episode_ids[0]).exact   # True: bit for bit

A run directory holds `episodes.zarr` (every episode, recorded once), `capsules/` (each seed's initial
capsule), and `rollout.json` (the `RunSpec` the episodes were played with, which `replay_episode` rebuilds
the host from). The first rollout of a seed is a cold reset that makes the seed's initial capsule; every
repeat is a restore of it. An episode played by a policy that cannot be captured (a policy server: the capsule's
fingerprint says `capturable: no`) replays its recorded actions: the env, critic and host from the initial
capsule, the policy's chunks read from the recording, and the same comparisons.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from capsule_rollout.capsules import CapsuleError, CapsuleSignatureError, Trust, key_source, load_capsule, signing_key
from capsule_rollout.envs.describe import describe_env
from capsule_rollout.import_path import OBJECTS, object_source, register_objects, resolve
from capsule_rollout.policies.remote_policy import RecordedChunks, RemotePolicy
from capsule_rollout.rollout.deadlines import DeadlineSettings
from capsule_rollout.rollout.host_config import episode_id, file_safe
from capsule_rollout.rollout.host_factory import (
    RunSpec,
    build_host,
    build_slots,
    check_same_run,
    describe_early,
    env_for_task,
    parse_observers,
    read_spec,
    resolve_acting,
    resolve_spec,
    write_spec,
)
from capsule_rollout.rollout.preflight_checks import Preflight, preflight
from capsule_rollout.rollout.process_state import kept_process_state
from capsule_rollout.rollout.ray_rollout import init_ray, run_rollouts, shutdown_ray, summarize_run
from capsule_rollout.rollout.rollout_actor import ActorReport, WorkItem
from capsule_rollout.rollout.rollout_host import HostConfig, capsule_key
from capsule_rollout.rollout.run_capsules import capsule_path
from capsule_rollout.rollout.run_options import Acting, Episodes, Faults, Placement, Recording, as_group
from capsule_rollout.rollout.run_trust import check_label, replay_spec, signed_spec
from capsule_rollout.rollout.slots.check import check_slots as check_slots_of
from capsule_rollout.rollout.slots.check import require_slots
from capsule_rollout.rollout.sources import Loaded
from capsule_rollout.stores import episode_schema as S
from capsule_rollout.stores.env_description import EnvDescription, write_env_description
from capsule_rollout.stores.sharded_reader import open_episode_reader
from capsule_rollout.stores.sharded_store import open_recorder, recorded_outcomes
from capsule_rollout.user_code import UserCodeError, join

_SAFE_ID = re.compile(r"[A-Za-z0-9._-]*")
STORE = "episodes.zarr"
CAPSULES = "capsules"
COMPARED = (S.ACTION, S.POLICY_ACTION, S.VALUE, S.STATE, S.REWARD, S.SUBTASK_ID)


def episode_id_of(task: str, seed: int, *, legacy: bool = False) -> str:
    """A seed's episode id: file-system-safe (`host_config.episode_id`); `legacy`: the task as it is, as runs
    recorded before named their episodes (`OpenedRun.legacy_ids`)."""
    return f"{task}-s{seed:07d}" if legacy else episode_id(task, seed)


@dataclass
class OpenedRun:
    """A run directory opened for recording (`open_run`)."""

    spec: RunSpec  # what the episodes are played with (its `n_exec` resolved by the preflight)
    store: Path
    done: dict  # episode id -> success, of the episodes already recorded (a resumed run)
    recorder: object
    checked: Preflight  # what the preflight found

    @property
    def legacy_ids(self) -> bool:
        """Whether the store holds episodes named as before ids were made file-system-safe (`episode_id_of(...,
        legacy=True)`): a resumed run goes on naming them so, and walks past what it recorded."""
        return any(not _SAFE_ID.fullmatch(i) for i in self.done)


def open_run(out: Path, spec: RunSpec, shards: bool = False, *, first: WorkItem | None = None,
             n_exec_given: bool = True) -> OpenedRun:
    """Check `spec`, run the preflight on the first item's seed (`rollout.preflight`: the env, policy and critic
    built here and probed once; `PreflightError` says what is wrong), then open the run under `out`. A run
    directory made with other settings is refused; the same settings resume it. `rollout.json` is written only
    once all of that passed, so a refused run leaves nothing that refuses the corrected one."""
    spec = resolve_spec(spec)  # as resolved by the caller (`run_spec`), else here
    checked = preflight(spec, seed=first.seed if first else 0, task=first.task if first else "",
                        n_exec_given=n_exec_given)
    spec = checked.spec
    out.mkdir(parents=True, exist_ok=True)
    check_same_run(out, spec)
    store = out / STORE
    done = recorded_outcomes(store)
    recorder = open_recorder(store, shards)
    write_env_description(store, EnvDescription(env=spec.env, **checked.env))
    write_spec(out, spec)
    return OpenedRun(spec, store, done, recorder, checked)


def keep_env_description(store: str | Path, env, env_id: str) -> Path:
    """Keep what `env` says of itself (`envs.describe_env`: control rate, dimension names, cameras) with the store
    its episodes go to (`stores.env_description`), for what reads the store later (`export_lerobot`)."""
    return write_env_description(store, EnvDescription(env=env_id, **describe_env(env)))


@dataclass
class RecordResult:
    out: Path
    store: Path
    reports: list[ActorReport]
    summary: dict = field(default_factory=dict)

    @property
    def episode_ids(self) -> list[str]:
        return [r.episode.meta.episode_id for r in self.reports if r.episode is not None]


FIRST_SEED = 1_000_000
"""Where a run's seeds start unless told (the command line's `--seeds.first`: the held-out block)."""


def record_rollouts(
    out: str | Path,
    *,
    env: str | Callable,
    policy: str | Callable,
    critic: str | Callable = "",
    seeds: Iterable[int] | int = 8,
    repeats: int = 1,
    actors: int = 2,
    acting: Acting | Mapping[str, Any] = Acting(),
    episodes: Episodes | Mapping[str, Any] = Episodes(),
    recording: Recording | Mapping[str, Any] = Recording(),
    placement: Placement | Mapping[str, Any] = Placement(),
    faults: Faults | Mapping[str, Any] = Faults(),
    check_slots: bool = False,
    on_report: Callable | None = None,
) -> RecordResult:
    """`sim_rollout` as a library call, option for option: each of the command's options is a field of one of
    the groups (`rollout.run_options`: `acting`, `episodes`, `recording`, `placement`, `faults`), each given as
    the group or a dict of its fields (`placement={"slots": 4}`).

    Play `env` (a registered id `suite:task`, `gymnasium:<a registered id>`, or a factory `package.module:make_env`,
    with keyword arguments `package.module:make_env={"size": 3}`: `import_path.with_kwargs`) with `policy` (a
    checkpoint, a factory, or a policy server's `ws://` address; `rollout.sources`) and optional `critic`: each
    a source string, or the factory or class itself (any callable Ray can ship: one a script defines; the run's
    `rollout.json` names it `__objects__:<name>`, and a replay is given it again: `replay_episode(named=)`), on
    `actors` Ray actors (0: in this process), every episode recorded once under `out`. `seeds`: the seeds, or how
    many from `FIRST_SEED` (as the command line's `--seeds.count`); `repeats`: rollouts of each seed, each reset by
    a restore of its initial capsule. `on_report(report, stats)`: called for each
    episode's report as it comes back. `check_slots`: before the run, play the first seed at 1 slot and in the last
    of `placement.slots` and put what was found in the summary's `slot_check` (`rollout.slots.check`).

    Before any actor starts, the env, policy and critic are built here once and probed (`rollout.preflight`:
    `PreflightError`, a ValueError naming the object, for what cannot work); `acting.n_exec` unset is what the checkpoint
    records, the chunk length for a factory's policy. Raises `RunError` when any episode ended in an error (the
    ones played are kept). The caller's process is left as it was found (torch's threads, the environment)."""
    groups = {name: as_group(group, given, name) for name, group, given in (
        ("acting", Acting, acting), ("episodes", Episodes, episodes), ("recording", Recording, recording),
        ("placement", Placement, placement), ("faults", Faults, faults))}
    options = {k: v for group in groups.values() for k, v in dataclasses.asdict(group).items()}
    with kept_process_state():  # the caller's torch threads and environment, as they were
        return _record(out, env=env, policy=policy, critic=critic, seeds=seeds, repeats=repeats, actors=actors,
                       check_slots=check_slots, on_report=on_report, **options)


def as_sources(given: dict[str, Any]) -> tuple[dict[str, str], tuple[tuple[str, Any], ...]]:
    """The sources of `given` (role -> a source string, or a factory or class handed over in Python), and the
    (source, object) pairs of those handed over (`import_path.object_source`), for `RunSpec.objects`."""
    sources, objects = {}, []
    for role, value in given.items():
        if isinstance(value, str):
            sources[role] = value
        elif callable(value):
            sources[role] = object_source(value)
            objects.append((sources[role], value))
        else:
            raise TypeError(f"{role}: give a source string or a factory (a callable), got {type(value).__name__}")
    return sources, tuple(objects)


def run_spec(out: Path, *, env: str, policy: str, critic: str = "", n_exec: int | None = None,
             noise_scale: float | None = None, advantage: str = "checkpoint", beta: float | None = None,
             max_steps: int | None = None, value_threshold: float | None = None, value_patience: int = 3,
             cameras: Sequence[str] | None = None, image_size: int | None = None, observers: Sequence[str] = (),
             lanes: str = "auto", gpus_per_actor: float = 0.0, cpus_per_actor: float = 1.0, pin_cores: bool = False,
             pin_seeds: Sequence[int] = (), capsule_budget_mb: float | None = None, slots: int = 1,
             env_threads: int = 1, batch_invariant: bool = True, objects: Sequence[tuple[str, Any]] = ()) -> RunSpec:
    """The `RunSpec` a recorded run under `out` plays (what `sim_rollout` and `record_rollouts` build alike),
    resolved here, once (`resolve_spec`): how the policy acts from the checkpoint's record unless given
    (`resolve_acting`), each source checked and described. `objects`: those handed over in Python
    (`RunSpec.objects`)."""
    policy = absolute_source(policy)
    described = describe_early(policy)  # once: how it acts, and its resolution
    n_exec_resolved, noise = resolve_acting(policy, n_exec, noise_scale, described=described)
    return resolve_spec(RunSpec(
        env=env, policy=policy, critic=absolute_source(critic) if critic else "", advantage=advantage, beta=beta,
        noise_scale=noise,
        host=HostConfig(n_exec=n_exec_resolved, value_threshold=value_threshold, value_patience=value_patience,
                        pin_seeds=tuple(int(s) for s in pin_seeds), lanes=lanes, max_steps=max_steps),
        device="cuda" if gpus_per_actor > 0 else "cpu", threads=max(1, int(cpus_per_actor)),
        capsule_dir=str((Path(out) / CAPSULES).resolve()), capsule_budget_mb=capsule_budget_mb,
        observers=parse_observers(observers), pin_cores=pin_cores, slots=slots, env_threads=env_threads,
        cameras=None if cameras is None else tuple(cameras), image_size=image_size, batch_invariant=batch_invariant,
        objects=tuple(objects)), described=described)


def _record(out, *, seeds, repeats, attempts, actors, shards, episodes_per_call, cpus_per_actor, gpus_per_actor,
            max_restarts, episode_timeout_s, first_call_s, deadline_floor_s, check_slots, on_report,
            **spec_options) -> RecordResult:
    out = Path(out).resolve()
    if check_slots:
        require_slots(spec_options["slots"], "slots")
    sources, objects = as_sources({k: spec_options.pop(k) for k in ("env", "policy", "critic")})
    spec = run_spec(out, gpus_per_actor=gpus_per_actor, cpus_per_actor=cpus_per_actor, objects=objects, **sources,
                    **spec_options)
    if attempts > 1 and spec.noise_scale == 0:
        raise ValueError("attempts: at noise scale 0 every retry plays the failed episode again; give noise_scale > 0")
    seeds = list(range(FIRST_SEED, FIRST_SEED + seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]
    env = spec.env
    opened = open_run(out, spec, shards, first=WorkItem("", seeds[0]) if seeds else None,
                      n_exec_given=spec_options["n_exec"] is not None)
    spec, store, done, recorder = opened.spec, opened.store, opened.done, opened.recorder
    for warning in opened.checked.warnings:  # what the preflight found that would make the run say nothing useful
        warnings.warn(warning, RuntimeWarning, stacklevel=3)
    items = [WorkItem(episode_id_of(env, s, legacy=opened.legacy_ids), s) for s in seeds]
    found = check_slots_of(spec, spec.slots, seed=seeds[0]) if check_slots and seeds else None
    where = init_ray() if actors else "in-process"
    try:
        reports, stats = run_rollouts(
            spec, items, actors=actors, recorder=recorder, repeats=repeats, attempts=attempts, done=done,
            cpus_per_actor=cpus_per_actor, gpus_per_actor=gpus_per_actor, max_restarts=max_restarts,
            episode_timeout_s=episode_timeout_s, on_report=on_report, episodes_per_call=episodes_per_call,
            deadlines=DeadlineSettings(floor_s=deadline_floor_s, first_call_s=first_call_s))
    finally:
        recorder.close()
        if actors:
            shutdown_ray(where)
    summary = summarize_run(reports, stats)
    if found is not None:
        summary["slot_check"] = found.summary()
    result = RecordResult(out, store, reports, summary)
    raise_if_errors(result, stats)
    return result


class RunError(RuntimeError):
    """Episodes of a run ended in errors (lost, or recorded with stop reason `error`), or the run gave up: the
    message says how many and the first error's line, with the user's own frames under it (`traceback`); its
    `__cause__` is that error. `result` holds the rest, recorded."""

    def __init__(self, message: str, result: RecordResult, traceback: str = "") -> None:
        super().__init__(join(message, traceback))
        self.result, self.traceback = result, traceback


def raise_if_errors(result: RecordResult, stats) -> None:
    """Raise `RunError` when any of the run's episodes ended in an error, or the run gave up."""
    errored = [r for r in result.reports if r.errored]
    if stats.gave_up:
        raise RunError(f"the run gave up: {stats.gave_up}", result, stats.gave_up_traceback) from UserCodeError(
            stats.gave_up, stats.gave_up_traceback)
    if errored:
        first = errored[0]
        where = first.item.episode_id if first.item else "?"
        raise RunError(f"{len(errored)} of {len(result.reports)} episodes ended in errors; the first ({where}): "
                       f"{first.error}", result, first.traceback) from UserCodeError(first.error, first.traceback)


def absolute_source(source: str) -> str:
    """A checkpoint directory as an absolute path (actors may run elsewhere); an import path as it is."""
    return str(Path(source).resolve()) if source and Path(source).is_dir() else source


@dataclass
class ReplayReport:
    episode_id: str
    exact: bool
    checks: dict[str, bool]
    reset_kind: str
    seed: int
    length: int
    stop_reason: str
    mode: str = "policy"
    """`policy`: the policy acted again; `recorded_actions`: it could not be captured (a policy server), so its
    recorded chunks were played into the env."""


@dataclass
class ReplayInputs:
    """What a replay needs, read and checked before anything is built (`prepare_replay`)."""

    spec: RunSpec
    recorded: object  # the recorded Episode
    capsule: object  # its initial Capsule


def replay_episode(run: str | Path, episode_id: str, capsules: str | Path | None = None, *,
                   trust: bool | str | Trust = False, slots: int | None = None,
                   named: dict[str, Any] | None = None) -> ReplayReport:
    """Re-run a recorded episode from its initial capsule on a host rebuilt from the host spec signed in it, and
    compare actions, proposed actions, values, states, rewards, subtasks and images with the recording. `run`:
    the run directory or its store (`<run>/episodes.zarr`). The capsule must be signed with this user's key
    (`capsules.signing_key`) unless `trust` (`prepare_replay`). `slots`: a host of that many slots (None: the
    run's); `named`: env, policy or critic sources the user gives over the run's (a source string, or the factory
    or class itself: a run recorded with objects is replayed with them given again)."""
    return play_replay(prepare_replay(run, episode_id, capsules, trust=trust, slots=slots, named=named))


def prepare_replay(run: str | Path, episode_id: str, capsules: str | Path | None = None, *,
                   trust: bool | str | Trust = False, slots: int | None = None,
                   named: dict[str, Any] | None = None) -> ReplayInputs:
    """Read and check a replay's inputs: the store, the episode, the run's spec, the initial capsule (ValueError
    or FileNotFoundError naming what is missing or refused). The capsule is read only when signed with this
    user's key, or with `trust` (a capsule from elsewhere the user vouches for: True or "data" restores it as data
    only and calls no code its run names; "code" trusts it as code, as powerful as pickle: `capsules.trust`). It
    is taken only for the episode's task and seed, and the host is built from the spec signed in it
    (`rollout.run_trust`). `slots`: replay on that many (None: the run's)."""
    level = Trust.OWN if trust is False else Trust.DATA if trust is True else Trust.parse(trust)
    if slots is not None and slots < 1:
        raise ValueError(f"--slots: a host has at least one slot, got {slots}")
    if not episode_id:
        raise ValueError("give the episode to replay: an episode id in the store (e.g. pick_place-s1000000)")
    store = Path(run) / STORE if (Path(run) / STORE).exists() else Path(run)
    reader = open_episode_reader(store)
    ids = reader.episode_ids
    if episode_id not in ids and file_safe(episode_id) in ids:
        episode_id = file_safe(episode_id)  # the task as the user wrote it (`so101:SO101PickCube-v0-s1000001`)
    if episode_id not in ids:
        raise ValueError(f"episode {episode_id!r} is not in {store}; it has {len(ids)} episodes, e.g. {ids[:3]}")
    recorded = reader.episode(ids.index(episode_id))
    meta = recorded.meta
    path = capsule_path(capsules or store.parent / CAPSULES, meta.task, meta.seed)
    if not path.exists():
        raise FileNotFoundError(f"initial capsule {path} not found (a recorded run saves one per seed)")
    try:
        capsule = load_capsule(path, key=signing_key() if level is Trust.OWN else None, trust=level)
    except CapsuleSignatureError as exc:
        raise ValueError(f"{exc}. Capsules are signed with this user's key ({key_source()}); if you trust where "
                         "this one came from, replay it with --trust (as data) or --trust-code (as code)") from None
    except CapsuleError as exc:
        raise ValueError(str(exc)) from None
    check_label(capsule, capsule_key(meta.task, meta.seed), path)
    named, objects = as_sources({k: v for k, v in (named or {}).items() if v})
    spec = replay_spec(read_spec(store.parent), signed_spec(capsule, path), level, named=named, source=path)
    spec = dataclasses.replace(spec, objects=objects)
    register_objects(objects)
    for role in ("env", "policy", "critic"):  # objects a run was handed in Python: given again, or said so here
        if getattr(spec, role).startswith(f"{OBJECTS}:"):
            resolve(getattr(spec, role).partition("=")[0], role)
    spec = dataclasses.replace(spec, capsule_dir="", **({} if slots is None else {"slots": slots}))
    spec = dataclasses.replace(spec, env=env_for_task(spec.env, meta.task))  # a `suite:*` run: the episode's task
    return ReplayInputs(spec, recorded, capsule)


def play_replay(inputs: ReplayInputs) -> ReplayReport:
    """Play the prepared episode again and compare it with the recording."""
    spec, recorded, capsule = inputs.spec, inputs.recorded, inputs.capsule
    meta = recorded.meta
    remote = uncapturable_policy(capsule)
    make = None if remote is None else lambda: _recorded_policy(remote)
    # slots: as the run played unless the replay asks for others (`prepare_replay`)
    host = build_slots(spec, policy=make) if spec.slots > 1 else build_host(spec, policy=make)
    if remote is not None:  # each slot's policy answers the recording's chunk at its env's step
        for h in getattr(host, "hosts", [host]):
            h.policy.source = RecordedChunks(recorded.steps[S.POLICY_ACTION], lambda h=h: h.env.steps,
                                             h.policy.spec.chunk_length, meta.stop_reason)
    try:
        host.store.put(capsule_key(meta.task, meta.seed), capsule, pin=True)
        result = host.run_episode(meta.seed, episode_id=meta.episode_id, attempt=meta.attempt, repeat=meta.repeat)
    finally:
        host.close()
    if result.episode is None:  # it failed before its first step: say why, not a missing attribute
        raise RuntimeError(f"replaying {meta.episode_id} failed before its first step: {result.error}")
    replayed = result.episode
    checks: dict[str, bool] = {"length": replayed.meta.length == meta.length,
                               "stop_reason": replayed.meta.stop_reason == meta.stop_reason,
                               "initial_capsule": capsule.meta.capsule_id == meta.initial_capsule_id}
    for key in [*COMPARED, *[k for k in recorded.image_keys if k in replayed.steps]]:
        a, b = recorded.steps[key], replayed.steps[key]
        checks[key] = a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    return ReplayReport(meta.episode_id, all(checks.values()), checks, result.reset_kind, meta.seed, meta.length,
                        meta.stop_reason, "policy" if remote is None else "recorded_actions")


def uncapturable_policy(capsule) -> dict[str, str] | None:
    """The policy's fingerprint (its `policy/*` keys, prefix removed) when the capsule says it cannot be
    captured (a `RemotePolicy`); None otherwise."""
    fingerprint = capsule.meta.fingerprint
    if not str(fingerprint.get("policy/capturable", "")).startswith("no"):
        return None
    return {k.removeprefix("policy/"): v for k, v in fingerprint.items() if k.startswith("policy/")}


def _recorded_policy(fingerprint: dict[str, str]) -> Loaded:
    """A `RemotePolicy` as the capsule describes it, its chunks from the recording (set once the host is built)."""
    policy = RemotePolicy.from_fingerprint(fingerprint, RecordedChunks(np.zeros((0, 1), np.float32), lambda: 0, 1, ""))
    cameras = tuple(k.removeprefix("image_") for k in policy.spec.observation_keys if k.startswith("image_"))
    return Loaded(policy, cameras, policy.image_size)
