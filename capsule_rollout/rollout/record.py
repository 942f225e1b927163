"""Recording rollouts and replaying them, as library calls: what `sim_rollout` and `replay` do, for a script.

    result = record_rollouts("runs/mine", env="my_lab.envs:make_env", policy="my_lab.policy:make_policy",
                             seeds=range(4), repeats=2, actors=2)
    replay_episode("runs/mine", result.episode_ids[0]).exact   # True: bit for bit

A run directory holds `episodes.zarr` (every episode, recorded once), `capsules/` (each seed's initial
capsule), and `rollout.json` (the `HostSpec` the episodes were played with, which `replay_episode` rebuilds
the host from). The first rollout of a seed is a cold reset that makes the seed's initial capsule; every
repeat is a restore of it. An episode played by a policy that cannot be captured (a policy server: the capsule's
fingerprint says `capturable: no`) replays its recorded actions: the env, critic and host from the initial
capsule, the policy's chunks read from the recording, and the same comparisons.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from capsule_rollout.capsules import CapsuleError, CapsuleSignatureError, key_source, load_capsule, signing_key
from capsule_rollout.policies.remote_policy import RecordedChunks, RemotePolicy
from capsule_rollout.rollout.host_factory import (
    HostSpec,
    build_host,
    build_slots,
    capsule_path,
    check_same_run,
    check_spec,
    env_for_task,
    read_spec,
    write_spec,
)
from capsule_rollout.rollout.plug_in import Loaded
from capsule_rollout.rollout.ray_rollout import init_ray, run_rollouts, shutdown_ray, summarize_run
from capsule_rollout.rollout.rollout_actor import ActorReport, WorkItem
from capsule_rollout.rollout.rollout_host import HostConfig, capsule_key
from capsule_rollout.stores import episode_schema as S
from capsule_rollout.stores.sharded_reader import open_episode_reader
from capsule_rollout.stores.sharded_store import open_recorder, recorded_outcomes

STORE = "episodes.zarr"
CAPSULES = "capsules"
COMPARED = (S.ACTION, S.POLICY_ACTION, S.VALUE, S.STATE, S.REWARD, S.SUBTASK_ID)


def episode_id_of(task: str, seed: int) -> str:
    return f"{task}-s{seed:07d}"


def open_run(out: Path, spec: HostSpec, shards: bool = False):
    """Check `spec` and open the run under `out`: (store path, outcomes already recorded, recorder). A run
    directory made with other settings is refused; the same settings resume it."""
    check_spec(spec)
    out.mkdir(parents=True, exist_ok=True)
    check_same_run(out, spec)
    store = out / STORE
    done = recorded_outcomes(store)
    recorder = open_recorder(store, shards)
    write_spec(out, spec)
    return store, done, recorder


@dataclass
class RecordResult:
    out: Path
    store: Path
    reports: list[ActorReport]
    summary: dict = field(default_factory=dict)

    @property
    def episode_ids(self) -> list[str]:
        return [r.episode.meta.episode_id for r in self.reports if r.episode is not None]


def record_rollouts(out: str | Path, *, env: str, policy: str, critic: str = "", seeds: Iterable[int] = range(4),
                    repeats: int = 1, actors: int = 2, n_exec: int | None = None, slots: int = 1) -> RecordResult:
    """Play `env` (a registered id or `package.module:make_env`) with `policy` (a checkpoint or
    `package.module:make_policy`; see `rollout.plug_in`) and optional `critic` on `actors` Ray actors (0: in
    this process), `repeats` rollouts per seed, every episode recorded once under `out`; `slots` env slots per actor
    (`HostSpec.slots`). Raises `RunError` when any episode failed (the episodes that were played are kept)."""
    out = Path(out).resolve()
    spec = HostSpec(env=env, policy=absolute_source(policy), critic=absolute_source(critic),
                    host=HostConfig(**({"n_exec": n_exec} if n_exec else {})), capsule_dir=str(out / CAPSULES),
                    slots=slots)
    store, done, recorder = open_run(out, spec)
    items = [WorkItem(episode_id_of(env, s), int(s)) for s in seeds]
    where = init_ray() if actors else "in-process"
    try:
        reports, stats = run_rollouts(spec, items, actors=actors, recorder=recorder, repeats=repeats, done=done)
    finally:
        recorder.close()
        if actors:
            shutdown_ray(where)
    result = RecordResult(out, store, reports, summarize_run(reports, stats))
    failed = [r for r in reports if r.episode is None]
    if failed:
        raise RunError(f"{len(failed)} of {len(reports)} episodes failed; the first: {failed[0].error}", result)
    return result


class RunError(RuntimeError):
    """Some episodes of a run failed (the result holds the rest, recorded)."""

    def __init__(self, message: str, result: RecordResult) -> None:
        super().__init__(message)
        self.result = result


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

    spec: HostSpec
    recorded: object  # the recorded Episode
    capsule: object  # its initial Capsule


def replay_episode(run: str | Path, episode_id: str, capsules: str | Path | None = None, *,
                   trust: bool = False) -> ReplayReport:
    """Re-run a recorded episode from its initial capsule on a host rebuilt from the run's `rollout.json`, and
    compare actions, proposed actions, values, states, rewards, subtasks and images with the recording. `run`:
    the run directory or its store (`<run>/episodes.zarr`). The capsule must be signed with this user's key
    (`capsules.signing_key`) unless `trust`."""
    return play_replay(prepare_replay(run, episode_id, capsules, trust=trust))


def prepare_replay(run: str | Path, episode_id: str, capsules: str | Path | None = None, *,
                   trust: bool = False) -> ReplayInputs:
    """Read and check a replay's inputs: the store, the episode, the run's spec, the initial capsule (ValueError
    or FileNotFoundError naming what is missing or refused). The capsule is read only when signed with this
    user's key, or with `trust` (a capsule from elsewhere the user vouches for: it is still read by a reader
    that cannot run code, and restored only past every check)."""
    if not episode_id:
        raise ValueError("give the episode to replay: an episode id in the store (e.g. pick_place-s1000000)")
    store = Path(run) / STORE if (Path(run) / STORE).exists() else Path(run)
    reader = open_episode_reader(store)
    ids = reader.episode_ids
    if episode_id not in ids:
        raise ValueError(f"episode {episode_id!r} is not in {store}; it has {len(ids)} episodes, e.g. {ids[:3]}")
    recorded = reader.episode(ids.index(episode_id))
    spec = dataclasses.replace(read_spec(store.parent), capsule_dir="")
    meta = recorded.meta
    spec = dataclasses.replace(spec, env=env_for_task(spec.env, meta.task))  # a `suite:*` run: the episode's task
    path = capsule_path(capsules or store.parent / CAPSULES, meta.task, meta.seed)
    if not path.exists():
        raise FileNotFoundError(f"initial capsule {path} not found (a recorded run saves one per seed)")
    try:
        capsule = load_capsule(path, key=None if trust else signing_key())
    except CapsuleSignatureError as exc:
        raise ValueError(f"{exc}. Capsules are signed with this user's key ({key_source()}); if you trust where "
                         "this one came from, replay it with --trust") from None
    except CapsuleError as exc:
        raise ValueError(str(exc)) from None
    return ReplayInputs(spec, recorded, capsule)


def play_replay(inputs: ReplayInputs) -> ReplayReport:
    """Play the prepared episode again and compare it with the recording."""
    spec, recorded, capsule = inputs.spec, inputs.recorded, inputs.capsule
    meta = recorded.meta
    remote = uncapturable_policy(capsule)
    make = None if remote is None else lambda: _recorded_policy(remote)
    # slots: as the run played (its rounding)
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
