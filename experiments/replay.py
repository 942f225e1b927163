"""replay: re-run a recorded episode from its initial capsule and check it bit for bit.

The host is rebuilt from the run's `rollout.json` (same checkpoints, same host
config); the episode's initial capsule is loaded from disk and restored (a capsule
whose fingerprint does not match the rebuilt host, e.g. other weights, is refused
with the differing keys); the episode is played again and its actions, proposed
actions, values, states and images are compared with the recording.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from capsules import load_capsule
from commands.configs import ReplayConfig
from commands.result import ExperimentResult
from experiments.console import make_console
from rollout import episode_schema as S
from rollout.host_factory import MIXED, build_host, capsule_path, read_spec
from rollout.rollout_host import capsule_key
from rollout.sharded_reader import open_episode_reader
from rollout.sharded_store import parse_store_root

COMPARED = (S.ACTION, S.POLICY_ACTION, S.VALUE, S.STATE, S.REWARD, S.SUBTASK_ID)


def run(config: ReplayConfig) -> ExperimentResult:
    console = make_console()
    if not config.episode:
        raise ValueError("--episode is required: an episode id in the store (e.g. pick_place-s1000000)")
    store = parse_store_root(config.store)
    reader = open_episode_reader(store)
    ids = reader.episode_ids
    if config.episode not in ids:
        raise ValueError(f"episode {config.episode!r} is not in {store}; it has {len(ids)} episodes, "
                         f"e.g. {ids[:3]}")
    recorded = reader.episode(ids.index(config.episode))
    spec = dataclasses.replace(read_spec(store.parent), crash=(), capsule_dir="")
    meta = recorded.meta
    if spec.family == MIXED:  # a mixed-family run: the episode's own family
        spec = dataclasses.replace(spec, family=meta.task)
    path = capsule_path(config.capsules or store.parent / "capsules", meta.task, meta.seed)
    if not path.exists():
        raise FileNotFoundError(f"initial capsule {path} not found (sim_rollout saves one per seed)")
    capsule = load_capsule(path)
    host = build_host(spec)
    try:
        host.store.put(capsule_key(meta.task, meta.seed), capsule, pin=True)
        result = host.run_episode(meta.seed, episode_id=meta.episode_id, attempt=meta.attempt, repeat=meta.repeat)
    finally:
        host.close()
    replayed = result.episode
    checks: dict[str, bool] = {"length": replayed.meta.length == meta.length,
                               "stop_reason": replayed.meta.stop_reason == meta.stop_reason,
                               "initial_capsule": capsule.meta.capsule_id == meta.initial_capsule_id}
    keys = [*COMPARED, *[k for k in recorded.image_keys if k in replayed.steps]]
    for key in keys:
        a, b = recorded.steps[key], replayed.steps[key]
        checks[key] = a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    exact = all(checks.values())
    console.print(f"replay {meta.episode_id} (seed {meta.seed}, {meta.length} steps, {meta.stop_reason}): "
                  + ("[green]bit-identical[/green]" if exact else
                     "[red]DIFFERS[/red] in " + ", ".join(k for k, ok in checks.items() if not ok)))
    return ExperimentResult({"episode": meta.episode_id, "exact": exact, "checks": checks,
                             "reset_kind": result.reset_kind}, exit_code=0 if exact else 1)
