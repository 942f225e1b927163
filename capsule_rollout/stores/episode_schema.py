"""Episode schema: every per-step and per-episode field, its dtype and rules, in one place.

Per step (time-major arrays, T = episode length):
  image_<camera>  (T, H, W, 3) uint8   one per camera
  state           (T, S) float32       proprio state
  privileged      (T, P) float32       optional: the sim's own state a robot does not sense (an env's
                                       `privileged` observation, e.g. object poses; for critics, never
                                       for the policy); absent where the env gives none
  action          (T, A) float32       the action executed
  policy_action   (T, A) float32       the chunk element the policy proposed (NaN when none ran)
  value           (T,)   float32       critic value (NaN when none ran)
  reward          (T,)   float32
  done            (T,)   bool          True exactly at the last step
  intervention    (T,)   bool          a human (or the expert, in sim) acted
  subtask_id      (T,)   int32
  timestamp       (T,)   float64       unix seconds
Per episode: episode_id, seed, task, instruction, subtasks (the subtask texts,
newline-separated; `subtask_id` indexes them), success, stop_reason, length,
initial_capsule_id, operator_events (what the operator did, one
`step:kind[:text]` per line, e.g. `12:coach:pick up the red block`: a coached
subtask text is recorded only here; empty when nobody acted), attempt (0 for a
seed's first rollout; k for its k-th retry after a failure, from the same initial
capsule with noise of its own), repeat (which of several rollouts from the same
initial state, 0 for the first). Stores written before a field existed read it as
its empty default.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

IMAGE_PREFIX = "image_"
STATE = "state"
PRIVILEGED = "privileged"
ACTION = "action"
POLICY_ACTION = "policy_action"
VALUE = "value"
REWARD = "reward"
DONE = "done"
INTERVENTION = "intervention"
SUBTASK_ID = "subtask_id"
TIMESTAMP = "timestamp"

EPISODE_ID = "episode_id"
SEED = "seed"
TASK = "task"
INSTRUCTION = "instruction"
SUBTASKS = "subtasks"
SUBTASK_SEPARATOR = "\n"
SUCCESS = "success"
STOP_REASON = "stop_reason"
LENGTH = "length"
INITIAL_CAPSULE_ID = "initial_capsule_id"
OPERATOR_EVENTS = "operator_events"
ATTEMPT = "attempt"
REPEAT = "repeat"



class StopReason(str, enum.Enum):
    """Why an episode stopped (recorded as the value string)."""

    SUCCESS = "success"
    OPERATOR_END = "operator_end"  # the operator ended it (success or failure, their call)
    LOW_VALUE = "low_value"  # the critic's value stayed below the threshold
    TIMEOUT = "timeout"  # the step limit
    SAFETY = "safety"  # a safety check, a non-finite action, an e-stop
    ERROR = "error"  # an exception
    ABORTED = "aborted"  # the robot aborted it (e.g. a lost heartbeat)
    TERMINATED = "terminated"  # the env ended it without success (a gymnasium termination, e.g. a fall)


STOP_REASONS = tuple(reason.value for reason in StopReason)


@dataclass(frozen=True)
class StepField:
    """Rules of one per-step field. `ndim` counts the per-step dims (0 = scalar per step)."""

    dtype: np.dtype
    ndim: int
    nan_allowed: bool = False
    optional: bool = False
    """Recorded only where the source gives it (an episode of a store has it or not, like every other)."""


STEP_FIELDS: dict[str, StepField] = {
    STATE: StepField(np.dtype(np.float32), 1),
    PRIVILEGED: StepField(np.dtype(np.float32), 1, optional=True),
    ACTION: StepField(np.dtype(np.float32), 1),
    POLICY_ACTION: StepField(np.dtype(np.float32), 1, nan_allowed=True),
    VALUE: StepField(np.dtype(np.float32), 0, nan_allowed=True),
    REWARD: StepField(np.dtype(np.float32), 0),
    DONE: StepField(np.dtype(np.bool_), 0),
    INTERVENTION: StepField(np.dtype(np.bool_), 0),
    SUBTASK_ID: StepField(np.dtype(np.int32), 0),
    TIMESTAMP: StepField(np.dtype(np.float64), 0),
}
IMAGE_FIELD = StepField(np.dtype(np.uint8), 3)

# Per-episode fields: fixed-width strings (readable by zarr 2 and numpy without pickle). A task id may be
# an import path (`package.module:factory`): 256 characters, and an episode id room for it and its suffixes
# (stores made before held 32 and 64: the recorder refuses what does not fit them, naming the column).
EPISODE_FIELDS: dict[str, np.dtype] = {
    EPISODE_ID: np.dtype("<U320"),
    SEED: np.dtype(np.int64),
    TASK: np.dtype("<U256"),
    INSTRUCTION: np.dtype("<U256"),
    SUBTASKS: np.dtype("<U512"),
    SUCCESS: np.dtype(np.bool_),
    STOP_REASON: np.dtype("<U16"),
    LENGTH: np.dtype(np.int64),
    INITIAL_CAPSULE_ID: np.dtype("<U64"),
    OPERATOR_EVENTS: np.dtype("<U2048"),
    ATTEMPT: np.dtype(np.int64),
    REPEAT: np.dtype(np.int64),
}


def step_field(key: str) -> StepField:
    """Rules for a per-step key (images by prefix); a clear error for unknown keys."""
    if key.startswith(IMAGE_PREFIX) and len(key) > len(IMAGE_PREFIX):
        return IMAGE_FIELD
    try:
        return STEP_FIELDS[key]
    except KeyError:
        raise ValueError(
            f"unknown step field {key!r}; fields are {sorted(STEP_FIELDS)} and image_<camera>"
        ) from None
