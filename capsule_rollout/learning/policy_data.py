"""Training arrays from a store of episodes (a zarr store or a sharded one): per-step language tokens and value targets."""

from __future__ import annotations

import numpy as np

from capsule_rollout.critics.returns import ACTOR_DEMONSTRATOR, ACTOR_POLICY
from capsule_rollout.stores import episode_schema as S
from capsule_rollout.stores.sharded_reader import open_episode_reader


def training_order(episode_ids: list[str]) -> list[int]:
    """The order training reads a store's episodes in: by episode id. A store holds them in the order they
    were recorded, which on Ray is the order the actors returned them (a matter of timing): training in that
    order would make the same episodes train a different model from one run to the next."""
    return sorted(range(len(episode_ids)), key=lambda i: episode_ids[i])


def load_training_arrays(path: str, cameras: tuple[str, ...], tokenizer, privileged: bool = False) -> dict:
    """Images, states, actions, per-step subtask tokens and episode steps, episode ends and metadata of a store,
    its episodes in `training_order`. `tokenizer`: the model's, with `encode_batch(texts) -> int array`.
    `privileged`: the steps' `privileged` states too (a critic that reads the sim's state)."""
    reader = open_episode_reader(path)
    if not len(reader):
        raise ValueError(f"{path} holds no complete episode; collect some with `collect_demos` first")
    missing = [c for c in cameras if f"{S.IMAGE_PREFIX}{c}" not in reader.keys]
    if missing:
        raise ValueError(f"{path} has no images of camera(s) {missing}; it has {reader.keys}")
    keys = [S.STATE, S.ACTION, S.POLICY_ACTION, S.SUBTASK_ID, S.REWARD, S.INTERVENTION]
    keys += [f"{S.IMAGE_PREFIX}{c}" for c in cameras]
    if privileged:
        if S.PRIVILEGED not in reader.keys:
            raise ValueError(f"{path} records no privileged state (the env's `{S.PRIVILEGED}` observation), which a "
                             "privileged critic reads: record the episodes with today's code (a new --out), or train a "
                             "critic without it")
        keys.append(S.PRIVILEGED)
    arrays = reader.load(keys)
    metas = [reader.meta(i) for i in range(len(reader))]
    order = training_order([m.episode_id for m in metas])
    lengths = (reader.ends - reader.starts)[order]
    if order != list(range(len(metas))):
        rows = np.concatenate([np.arange(reader.starts[i], reader.ends[i]) for i in order])
        arrays = {k: v[rows] for k, v in arrays.items()}
        metas = [metas[i] for i in order]
    ends = np.cumsum(lengths).astype(np.int64)
    starts = ends - lengths
    text_ids = np.zeros(reader.n_steps, np.int64)
    texts_seen: dict[str, int] = {}
    for i, meta in enumerate(metas):
        lo, hi = int(starts[i]), int(ends[i])
        texts = meta.subtask_texts or [meta.instruction]
        ids = np.clip(arrays[S.SUBTASK_ID][lo:hi], 0, len(texts) - 1)
        index = np.array([texts_seen.setdefault(t, len(texts_seen)) for t in texts], np.int64)
        text_ids[lo:hi] = index[ids]
    tokens = tokenizer.encode_batch(list(texts_seen))[text_ids]  # each distinct text encoded once
    return {
        "images": {c: arrays[f"{S.IMAGE_PREFIX}{c}"] for c in cameras},
        "states": arrays[S.STATE],
        **({"privileged": arrays[S.PRIVILEGED]} if privileged else {}),
        "actions": arrays[S.ACTION],
        "policy_actions": arrays[S.POLICY_ACTION],
        "rewards": arrays[S.REWARD],
        "subtask_ids": arrays[S.SUBTASK_ID],
        "intervention": arrays[S.INTERVENTION],
        "tokens": tokens,
        "texts": list(texts_seen),  # every distinct subtask text, in order of first appearance
        "text_ids": text_ids,  # per step: its subtask text's index in "texts"
        "episode_steps": episode_steps(ends),
        "episode_ends": ends,
        "metas": metas,
        "actors": np.repeat([episode_actor(m) for m in metas], lengths).astype(np.int64),
    }


def episode_actor(meta) -> int:
    """Who acted in a recorded episode: the policy (`ACTOR_POLICY`: a RolloutHost recorded it, from its
    initial capsule, operator takeovers included) or a demonstrator (`ACTOR_DEMONSTRATOR`: `collect_demos`
    and other recorders that restore no capsule)."""
    return ACTOR_POLICY if meta.initial_capsule_id else ACTOR_DEMONSTRATOR


def episode_steps(ends: np.ndarray) -> np.ndarray:
    """Control steps since each step's episode started (0, 1, ... per episode), from the episode ends."""
    ends = np.asarray(ends, np.int64)
    if len(ends) == 0:
        return np.zeros(0, np.int64)
    starts = np.concatenate([[0], ends[:-1]])
    return np.arange(int(ends[-1]), dtype=np.int64) - np.repeat(starts, ends - starts)


def action_labels(data: dict, labels: str) -> np.ndarray:
    """Training targets: executed actions, or the recorded intent where there is one."""
    if labels == "action":
        return data["actions"]
    if labels != "intended":
        raise ValueError(f"labels must be 'action' or 'intended', got {labels!r}")
    intended = data["policy_actions"]
    have = np.isfinite(intended).all(axis=1)
    if not have.any():
        raise ValueError("--labels intended, but the store records no policy_action; collect with this version")
    return np.where(have[:, None], intended, data["actions"])
