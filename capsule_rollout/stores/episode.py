"""`Episode` (time-major step arrays + metadata), its validation, and `EpisodeBuilder`."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import numpy as np

from capsule_rollout.stores import episode_schema as S


class EpisodeError(ValueError):
    """An episode does not follow the schema; the message lists every problem."""


@dataclass(frozen=True)
class EpisodeMeta:
    episode_id: str
    seed: int
    task: str
    instruction: str
    success: bool
    stop_reason: str
    length: int
    initial_capsule_id: str = ""
    subtasks: str = ""  # subtask texts joined by episode_schema.SUBTASK_SEPARATOR
    operator_events: str = ""  # one "step:kind[:text]" per line (episode_schema)
    attempt: int = 0  # retry index after a failure (episode_schema)
    repeat: int = 0  # which rollout from the same initial state (episode_schema)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def subtask_texts(self) -> list[str]:
        return self.subtasks.split(S.SUBTASK_SEPARATOR) if self.subtasks else []


@dataclass
class Episode:
    steps: dict[str, np.ndarray]  # time-major, see stores.episode_schema
    meta: EpisodeMeta
    extra: dict = field(default_factory=dict)  # not persisted

    @property
    def length(self) -> int:
        return self.meta.length

    @property
    def image_keys(self) -> list[str]:
        return sorted(k for k in self.steps if k.startswith(S.IMAGE_PREFIX))


def validate_episode(episode: Episode, *, expect_keys: Mapping[str, tuple] | None = None) -> Episode:
    """Check every field against the schema; returns the episode with arrays in schema dtypes.

    `expect_keys` (key -> per-step shape), when given, is what a store already holds:
    the episode must have exactly those keys and shapes.
    """
    problems: list[str] = []
    meta = episode.meta
    steps: dict[str, np.ndarray] = {}
    required = {key for key, rule in S.STEP_FIELDS.items() if not rule.optional}
    missing = sorted(required - set(episode.steps))
    if missing:
        problems.append(f"missing step fields {missing}")
    for key, value in episode.steps.items():
        try:
            rule = S.step_field(key)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        arr = np.asarray(value)
        if rule is S.IMAGE_FIELD and arr.dtype != np.uint8:
            problems.append(f"{key}: images must be uint8 (H, W, 3), got {arr.dtype}")
            continue
        if not np.can_cast(arr.dtype, rule.dtype, casting="same_kind") or (
            rule.dtype.kind in "iub" and arr.dtype.kind == "f"
        ):
            problems.append(f"{key}: dtype {arr.dtype} cannot be stored as {rule.dtype}")
            continue
        if arr.ndim != rule.ndim + 1:
            problems.append(f"{key}: expected {rule.ndim + 1} dims (T{', ...' * rule.ndim}), got shape {arr.shape}")
            continue
        if rule is S.IMAGE_FIELD and arr.shape[-1] != 3:
            problems.append(f"{key}: images must be (T, H, W, 3), got {arr.shape}")
            continue
        arr = arr.astype(rule.dtype, copy=False)
        if rule.dtype.kind == "f" and not rule.nan_allowed and not np.all(np.isfinite(arr)):
            bad = np.argwhere(~np.isfinite(arr.reshape(len(arr), -1)).all(axis=1)).ravel()
            problems.append(f"{key}: non-finite values at steps {bad[:5].tolist()} (NaN/inf not allowed here)")
        steps[key] = arr
    lengths = {k: len(v) for k, v in steps.items()}
    if len(set(lengths.values())) > 1:
        problems.append(f"step fields differ in length: {lengths}")
    length = next(iter(lengths.values()), 0)
    if length < 1:
        problems.append("an episode needs at least one step")
    if meta.length != length and lengths:
        problems.append(f"meta.length is {meta.length} but the step arrays hold {length} steps")
    n_subtasks = len(meta.subtask_texts)
    ids = steps.get(S.SUBTASK_ID)
    if n_subtasks and ids is not None and len(ids) and (ids.min() < 0 or ids.max() >= n_subtasks):
        problems.append(f"subtask_id must index the {n_subtasks} subtasks, got values {ids.min()}..{ids.max()}")
    if S.DONE in steps and length and (not steps[S.DONE][-1] or steps[S.DONE][:-1].any()):
        problems.append("done must be True exactly at the last step")
    if expect_keys is not None:
        got = {k: tuple(v.shape[1:]) for k, v in steps.items()}
        if got != dict(expect_keys):
            diff = sorted(set(got.items()) ^ set(dict(expect_keys).items()))
            problems.append(f"step fields/shapes differ from the store's: {diff}")
    problems += _meta_problems(meta)
    if problems:
        raise EpisodeError(
            f"episode {meta.episode_id!r} is not valid ({len(problems)} problem(s)); nothing was written:\n  - "
            + "\n  - ".join(problems)
        )
    return Episode(steps, meta, episode.extra)


def _fit_events(events: list[str] | tuple[str, ...]) -> str:
    """Events joined one per line, cut to what `operator_events` holds (never an invalid episode)."""
    room = S.EPISODE_FIELDS[S.OPERATOR_EVENTS].itemsize // 4
    lines = [" ".join(str(e).split()) for e in events]  # one event per line, whatever was typed
    text = "\n".join(lines)
    if len(text) <= room:
        return text
    kept: list[str] = []
    for i, line in enumerate(lines):
        note = f"... {len(lines) - i} more events not recorded"
        if len("\n".join([*kept, line, note])) > room:
            return "\n".join([*kept, note])
        kept.append(line)
    return "\n".join(kept)


def _meta_problems(meta: EpisodeMeta) -> list[str]:
    problems = []
    if not meta.episode_id:
        problems.append("episode_id is empty")
    for name, dtype in S.EPISODE_FIELDS.items():
        value = getattr(meta, name)
        if dtype.kind == "U":
            if not isinstance(value, str):
                problems.append(f"{name} must be a str, got {type(value).__name__}")
            elif len(value) > dtype.itemsize // 4:
                problems.append(f"{name} is {len(value)} characters; at most {dtype.itemsize // 4} fit")
    if meta.stop_reason not in S.STOP_REASONS:
        problems.append(f"stop_reason {meta.stop_reason!r} is not one of {S.STOP_REASONS}")
    if meta.success and meta.stop_reason != "success" and meta.stop_reason != "operator_end":
        problems.append(f"success=True needs stop_reason 'success' or 'operator_end', got {meta.stop_reason!r}")
    return problems


class EpisodeBuilder:
    """Accumulates steps (cheap per step: it runs in the control loop) and produces a validated `Episode`.

    Each `add` checks that step's shapes against the first step and that fields where
    NaN is not allowed are finite, so a bad step is refused at once (nothing of it is kept).
    """

    _SCALARS = (S.VALUE, S.REWARD, S.INTERVENTION, S.SUBTASK_ID, S.TIMESTAMP)

    def __init__(self) -> None:
        self._arrays: dict[str, list[np.ndarray]] = {S.STATE: [], S.ACTION: [], S.POLICY_ACTION: []}
        self._images: dict[str, list[np.ndarray]] = {}
        self._scalars: dict[str, list] = {k: [] for k in self._SCALARS}
        self._shapes: dict[str, tuple] = {}
        self._nan_action: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self._arrays[S.STATE])

    def add(
        self,
        *,
        images: Mapping[str, np.ndarray],
        state: np.ndarray,
        action: np.ndarray,
        reward: float,
        policy_action: np.ndarray | None = None,
        value: float = float("nan"),
        intervention: bool = False,
        subtask_id: int = 0,
        timestamp: float | None = None,
        privileged: np.ndarray | None = None,
    ) -> None:
        """`privileged`: the env's `privileged` observation where it gives one (every step, or none)."""
        t = len(self)
        st = np.asarray(state, dtype=np.float32)
        act = np.asarray(action, dtype=np.float32)
        if policy_action is None:
            if self._nan_action is None or self._nan_action.shape != act.shape:
                self._nan_action = np.full(act.shape, np.nan, np.float32)
            proposed = self._nan_action
        else:
            proposed = np.asarray(policy_action, dtype=np.float32)
        priv = None if privileged is None else np.asarray(privileged, dtype=np.float32)
        shapes = self._shapes
        if not shapes:
            self._first_step(images, st, act, proposed)
            if priv is not None:
                self._shapes[S.PRIVILEGED] = priv.shape
        else:
            if (priv is None) != (S.PRIVILEGED not in shapes) or (priv is not None and
                                                                   priv.shape != shapes[S.PRIVILEGED]):
                raise EpisodeError(f"privileged at step {t}: {None if priv is None else priv.shape}, earlier "
                                   f"steps had {shapes.get(S.PRIVILEGED)}")
            for key, array, want in ((S.STATE, st, shapes[S.STATE]), (S.ACTION, act, shapes[S.ACTION]),
                                     (S.POLICY_ACTION, proposed, shapes[S.ACTION])):
                if array.shape != want:
                    raise EpisodeError(f"{key} at step {t}: shape {array.shape}, earlier steps had {want}")
            if images.keys() != self._images.keys():
                raise EpisodeError(f"step {t} has image fields {sorted(images)}, earlier steps had "
                                   f"{sorted(self._images)}")
            for camera, image in images.items():
                if image.dtype != np.uint8:
                    raise EpisodeError(f"image {camera!r} at step {t}: uint8 expected, got {image.dtype}")
                if image.shape != shapes[camera]:
                    raise EpisodeError(f"image {camera!r} at step {t}: shape {image.shape}, earlier steps had "
                                       f"{shapes[camera]}")
        for key, array in ((S.STATE, st), (S.ACTION, act), *(((S.PRIVILEGED, priv),) if priv is not None else ())):
            if not np.isfinite(array).all():
                raise EpisodeError(f"{key} at step {t} is not finite ({array.tolist()}); NaN/inf is not allowed there")
        if not math.isfinite(reward):
            raise EpisodeError(f"reward at step {t} is not finite ({reward}); NaN/inf is not allowed there")
        self._arrays[S.STATE].append(st)
        self._arrays[S.ACTION].append(act)
        self._arrays[S.POLICY_ACTION].append(proposed)
        if priv is not None:
            self._arrays.setdefault(S.PRIVILEGED, []).append(priv)
        for camera, image in images.items():
            self._images[camera].append(image)
        sc = self._scalars
        sc[S.VALUE].append(value)
        sc[S.REWARD].append(reward)
        sc[S.INTERVENTION].append(bool(intervention))
        sc[S.SUBTASK_ID].append(int(subtask_id))
        sc[S.TIMESTAMP].append(time.time() if timestamp is None else timestamp)

    def _first_step(self, images: Mapping[str, np.ndarray], st: np.ndarray, act: np.ndarray,
                    proposed: np.ndarray) -> None:
        if proposed.shape != act.shape:
            raise EpisodeError(f"step 0: policy_action {proposed.shape} differs from action {act.shape}")
        shapes = {S.STATE: st.shape, S.ACTION: act.shape}
        for camera, image in images.items():
            img = np.asarray(image)
            if img.dtype != np.uint8:
                raise EpisodeError(f"image {camera!r} at step 0: uint8 expected, got {img.dtype}")
            shapes[camera] = img.shape
        self._shapes = shapes
        self._images = {camera: [] for camera in images}

    def finish(
        self,
        *,
        episode_id: str,
        seed: int,
        task: str,
        instruction: str,
        success: bool,
        stop_reason: str,
        initial_capsule_id: str = "",
        subtasks: list[str] | tuple[str, ...] = (),
        operator_events: list[str] | tuple[str, ...] = (),
        attempt: int = 0,
        repeat: int = 0,
    ) -> Episode:
        """The recorded episode (validated); the builder is empty afterwards.

        `operator_events`: "step:kind[:text]" lines; when they would not fit the
        field, the earliest are kept and the last line says how many were left out.
        """
        if not len(self):
            raise EpisodeError(f"episode {episode_id!r} has no steps")
        steps = {k: np.stack(v) for k, v in self._arrays.items()}
        steps.update({S.IMAGE_PREFIX + camera: np.stack(v) for camera, v in self._images.items()})
        steps.update({k: np.asarray(v, dtype=S.STEP_FIELDS[k].dtype) for k, v in self._scalars.items()})
        done = np.zeros(len(self), dtype=np.bool_)
        done[-1] = True
        steps[S.DONE] = done
        if any(S.SUBTASK_SEPARATOR in text for text in subtasks):
            raise EpisodeError("subtask texts cannot contain a newline")
        meta = EpisodeMeta(episode_id, int(seed), task, instruction, bool(success), stop_reason, len(self),
                           initial_capsule_id, S.SUBTASK_SEPARATOR.join(subtasks), _fit_events(operator_events),
                           int(attempt), int(repeat))
        self.__init__()
        return validate_episode(Episode(steps, meta))
