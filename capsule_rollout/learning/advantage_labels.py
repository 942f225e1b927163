"""RECAP advantage labels over a store, and the sidecar file they live in beside it.

The critic (a `StoreCritic`; the example's is `tabletop.critic_labels.StoreValues`) is evaluated on every
recorded step; N-step advantages, per-task thresholds and indicators come from `critics.advantage`. The store
itself is never written: the labels go to `<store>.advantage.npz`, with the episode ids they belong to, so
training can check they match.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from capsule_rollout.critics.advantage import AdvantageLabels, label_episodes
from capsule_rollout.learning.policy_data import load_training_arrays
from capsule_rollout.stores.sharded_store import parse_store_root

SIDECAR_VERSION = 1


def sidecar_path(store: str | os.PathLike) -> Path:
    """`<store>.advantage.npz` beside the store (a zarr store or a sharded store root; a path or file:// URL)."""
    store = parse_store_root(store)
    return store.with_name(store.name.removesuffix(".zarr") + ".advantage.npz")


class StoreCritic(Protocol):
    """A critic that values a store's recorded steps (what `label_store` labels with): the cameras and
    tokenizer its inputs need (for `learning.policy_data.load_training_arrays`), V(o_t) for every step of
    those arrays, and a digest of its weights (written into the sidecar); `privileged`, when it says True, that it
    reads the steps' privileged state too (optional: False)."""

    cameras: tuple[str, ...]
    tokenizer: Any  # encode_batch(texts) -> int array

    def store_values(self, data: dict) -> np.ndarray: ...

    def weights_sha256(self) -> str: ...


@dataclass(frozen=True)
class LabelledStore:
    sidecar: Path
    labels: AdvantageLabels
    values: np.ndarray  # V(o_t) for every step
    episodes: int


def label_store(critic: StoreCritic, store: str, *, n: int, max_steps: int, positive_fraction: float,
                out: str | os.PathLike | None = None, critic_name: str = "") -> LabelledStore:
    """Label every step of `store` with `critic` and write the sidecar (atomically)."""
    data = load_training_arrays(store, critic.cameras, critic.tokenizer, privileged=getattr(critic, "privileged", False))
    values = np.asarray(critic.store_values(data), np.float32)
    ends = data["episode_ends"]
    starts = np.concatenate([[0], ends[:-1]])
    metas = data["metas"]
    cut = lambda a: [a[lo:hi] for lo, hi in zip(starts, ends)]  # noqa: E731
    labels = label_episodes(rewards=cut(data["rewards"]), values=cut(values), success=[m.success for m in metas],
                            tasks=[m.task for m in metas], interventions=cut(data["intervention"]),
                            n=n, max_steps=max_steps, positive_fraction=positive_fraction)
    meta = {"source": "critic", "store": str(store), "critic": critic_name,
            "critic_weights_sha256": critic.weights_sha256(), "n": n, "max_steps": max_steps,
            "positive_fraction": positive_fraction, "thresholds": labels.thresholds,
            "realised_positive_fraction": labels.positive_fraction}
    path = write_sidecar(store, advantage=labels.advantage, indicator=labels.indicator, values=values,
                         episode_ids=[m.episode_id for m in metas], meta=meta, out=out)
    return LabelledStore(path, labels, values, len(metas))


def write_sidecar(store: str, *, advantage: np.ndarray, indicator: np.ndarray, values: np.ndarray,
                  episode_ids: list[str], meta: dict, out: str | os.PathLike | None = None) -> Path:
    """Write labels of every step of `store` (episodes in `episode_ids` order) as its sidecar, atomically.
    `indicator` 0: a step without a label (trained unconditioned)."""
    if not (len(advantage) == len(indicator) == len(values)):
        raise ValueError("advantage, indicator and values need one entry per step")
    path = Path(out) if out else sidecar_path(store)
    save_npz(path, {"advantage": np.asarray(advantage, np.float32), "indicator": np.asarray(indicator, np.int64),
                    "value": np.asarray(values, np.float32), "episode_ids": np.array(episode_ids)},
             {"version": SIDECAR_VERSION, **meta})
    return path


def save_npz(path: Path, arrays: dict[str, np.ndarray], meta: dict) -> None:
    """Arrays and a JSON `meta` (with its "version") in one .npz, written to a temp file and renamed."""
    tmp = path.with_name(f".{path.name}.tmp.npz")
    np.savez(tmp, **arrays, meta=np.array(json.dumps(meta)))
    os.replace(tmp, path)


def load_npz(path: str | os.PathLike, *, version: int, what: str, make: str) -> tuple[dict[str, np.ndarray], dict]:
    """(arrays, meta) of a file `save_npz` wrote; a clear error when it is missing (saying how to `make` it)
    or of another version than this code reads."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{what} {path} not found; {make}")
    with np.load(path, allow_pickle=False) as f:
        meta = json.loads(str(f["meta"]))
        if meta.get("version") != version:
            raise ValueError(f"{path}: {what} version {meta.get('version')}, this code reads {version}: move it "
                             f"aside and make it again ({make})")
        return {k: f[k] for k in f.files if k != "meta"}, meta


def load_sidecar(path: str | os.PathLike, episode_ids: list[str]) -> np.ndarray:
    """The indicators of a sidecar, checked against the store's episode ids (same episodes, same order)."""
    arrays, _ = load_npz(path, version=SIDECAR_VERSION, what="advantage sidecar",
                         make="make it with `label_advantages --data STORE`")
    ids = [str(i) for i in arrays["episode_ids"]]
    if ids != list(episode_ids):
        raise ValueError(f"{path} labels {len(ids)} episodes that are not the store's {len(episode_ids)} "
                         "(the store changed since labelling?): run label_advantages again")
    return arrays["indicator"].astype(np.int64)
