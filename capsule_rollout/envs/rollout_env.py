"""The env side of the rollout protocol: what `RolloutHost` needs from an env.

An env is a capsule component (its committed state lives in arena buffers, so a
restore reproduces what follows bit for bit) with the gymnasium `reset(seed)` /
`step(action)` API, a bounded `action_space` (the host clips every action to it),
and a declared observation: a dict holding `state` (a float vector) and one
`image_<camera>` `(H, W, 3) uint8` per camera, plus anything else the env likes.
`observe()` gives the observation of the committed state (after a restore, the
one the env would have returned there). A robot is an env too: `restorable =
False` means every reset is physical and nothing of the env is captured.

Optional parts have defaults a host can rely on: an env without subtasks gives
`subtask_texts = ()` (the host then uses a planner that only publishes the
instruction), and an env without an instruction gives "".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from capsule_rollout.capsules import CapsuleComponent

IMAGE_PREFIX = "image_"
STATE_KEY = "state"


def image_key(camera: str) -> str:
    """The observation key of a camera's image."""
    return f"{IMAGE_PREFIX}{camera}"


@dataclass(frozen=True)
class ArraySpec:
    """Shape and dtype of one observation array (no batch dimension)."""

    shape: tuple[int, ...]
    dtype: np.dtype

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype))


@dataclass(frozen=True)
class ObservationSpec:
    """What an env's observations hold: `arrays` by key (`state` and `image_<camera>` among them)."""

    arrays: Mapping[str, ArraySpec] = field(default_factory=dict)
    cameras: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        problems = []
        state = self.arrays.get(STATE_KEY)
        if state is None or len(state.shape) != 1 or state.dtype.kind != "f":
            problems.append(f"'{STATE_KEY}' must be a 1-d float array, got {state}")
        for camera in self.cameras:
            spec = self.arrays.get(image_key(camera))
            if spec is None or len(spec.shape) != 3 or spec.shape[2] != 3 or spec.dtype != np.uint8:
                problems.append(f"camera {camera!r} needs '{image_key(camera)}' as (H, W, 3) uint8, got {spec}")
        if problems:
            raise ValueError("observation spec: " + "; ".join(problems))

    @classmethod
    def of(cls, *, state_dim: int, cameras: tuple[str, ...] = (), image_size: tuple[int, int] | int = 64,
           **extra: ArraySpec) -> ObservationSpec:
        """The usual shape: a float32 state vector and square (or (H, W)) uint8 images per camera."""
        h, w = (image_size, image_size) if isinstance(image_size, int) else image_size
        arrays = {STATE_KEY: ArraySpec((state_dim,), np.float32),
                  **{image_key(c): ArraySpec((h, w, 3), np.uint8) for c in cameras}, **extra}
        return cls(arrays, tuple(cameras))

    @property
    def state_dim(self) -> int:
        return self.arrays[STATE_KEY].shape[0]

    def check(self, obs: Mapping[str, Any], who: str = "env") -> None:
        """Raise ValueError naming every key of `obs` that does not fit the spec."""
        problems = []
        for key, spec in self.arrays.items():
            value = obs.get(key)
            if value is None:
                problems.append(f"missing '{key}'")
                continue
            arr = np.asarray(value)
            if arr.shape != spec.shape or arr.dtype != spec.dtype:
                problems.append(f"'{key}' is {arr.dtype}{list(arr.shape)}, declared {spec.dtype}{list(spec.shape)}")
        if problems:
            raise ValueError(f"{who} observation does not match its observation_spec: " + "; ".join(problems))


@runtime_checkable
class RolloutEnv(CapsuleComponent, Protocol):
    """What a `RolloutHost` drives. `TabletopEnv` and `RobotEnv` implement it."""

    action_space: Any
    """A gymnasium `Box` with finite bounds: actions are clipped to `[low, high]` before `step`."""
    observation_spec: ObservationSpec
    max_steps: int
    """The episode limit in control steps."""
    restorable: bool
    """False for a robot: a reset is physical and the env's state is never captured."""

    @property
    def steps(self) -> int:
        """Control steps since the episode's reset."""
        ...

    @property
    def task(self) -> str:
        """The task id (a family name, a suite's env id): with the seed it names an initial state."""
        ...

    @property
    def instruction(self) -> str:
        """The episode's language instruction ("" when the env has none)."""
        ...

    @property
    def subtask_texts(self) -> tuple[str, ...]:
        """The episode's subtasks in order (empty when the env has none)."""
        ...

    @property
    def subtask_index(self) -> int:
        """The current subtask (an index into `subtask_texts`)."""
        ...

    def reset(self, *, seed: int | None = None) -> tuple[dict, dict]: ...

    def step(self, action: np.ndarray) -> tuple[dict, float, bool, bool, dict]: ...

    def observe(self) -> dict:
        """The observation of the committed state (what `reset`/`step` returned there)."""
        ...

    def success(self, info: Mapping[str, Any]) -> bool:
        """Whether the step that returned `info` completed the task."""
        ...

    def close(self) -> None: ...


def action_bounds(env: RolloutEnv) -> tuple[np.ndarray, np.ndarray]:
    """The env's action bounds as float32 arrays; refuses unbounded or non-vector spaces."""
    space = env.action_space
    low, high = getattr(space, "low", None), getattr(space, "high", None)
    if low is None or high is None or np.ndim(low) != 1:
        raise ValueError(f"the env's action_space must be a 1-d Box, got {space!r}")
    low, high = np.asarray(low, np.float32), np.asarray(high, np.float32)
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high)) and np.all(low <= high)):
        raise ValueError(f"the env's action bounds must be finite with low <= high, got {low} .. {high}")
    return low, high
