"""Where a run keeps its seeds' initial capsules (`<capsule_dir>/<task>/s<seed>.capsule`, signed, with the host
spec they were played with), for `replay` and for an actor that restores a seed another actor made."""

from __future__ import annotations

import json
import os
from pathlib import Path

from capsule_rollout.capsules import save_capsule, signing_key
from capsule_rollout.rollout.host_config import file_safe
from capsule_rollout.rollout.host_factory import RunSpec
from capsule_rollout.rollout.rollout_host import RolloutHost, capsule_key


def capsule_path(capsule_dir: str | os.PathLike, task: str, seed: int) -> Path:
    """Where a seed's initial capsule is saved: `<dir>/<task, file-system-safe>/s<seed>.capsule`; a run saved
    before names were made safe keeps its file (`<dir>/<task>/s<seed>.capsule`), read there."""
    path = Path(capsule_dir) / file_safe(task) / f"s{seed:07d}.capsule"
    legacy = Path(capsule_dir) / f"{capsule_key(task, seed)}.capsule"
    return legacy if not path.exists() and legacy != path and legacy.exists() else path


def save_initial_capsule(host: RolloutHost, spec: RunSpec, seed: int, capsule=None, *,
                         key: bytes | None = None) -> Path | None:
    """Write the seed's initial capsule under `spec.capsule_dir` once (atomic; kept for replay), signed with
    `key` (`capsules.signing_key()` when None). `capsule`: the episode's (`EpisodeResult.initial_capsule`; None:
    the host's current one)."""
    if not spec.capsule_dir or not getattr(host.env, "restorable", True):
        return None
    path = capsule_path(spec.capsule_dir, host.task, seed)
    if capsule is None:
        capsule = host.initial_capsule  # the store may have dropped it already (a budget)
    if not path.exists() and capsule is not None and capsule.meta.label == capsule_key(host.task, seed):
        path.parent.mkdir(parents=True, exist_ok=True)
        save_capsule(capsule, path, annotations={"host_spec": json.dumps(spec.to_json())},
                     key=key if key is not None else signing_key())
    return path
