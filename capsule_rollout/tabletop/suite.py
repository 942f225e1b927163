"""The tabletop as a suite of the env registry (`tabletop:<family>`, registered by this package's entry point):
what `sim_rollout --family` and every tabletop entry point build through the same registry a user's suite uses."""

from __future__ import annotations

from collections.abc import Sequence

from capsule_rollout.tabletop.tabletop_env import TabletopEnv
from capsule_rollout.tabletop.tasks import FAMILY_NAMES


def check() -> None:
    """Installed with the project: nothing to check."""


def tasks() -> tuple[str, ...]:
    return tuple(FAMILY_NAMES)


def make_rollout_env(task: str, *, cameras: Sequence[str] | None = None, image_size: int = 64,
                     max_steps: int | None = None) -> TabletopEnv:
    """The family's env; `cameras` None: the front camera."""
    return TabletopEnv(task, cameras=tuple(cameras) if cameras is not None else ("front",), image_size=image_size,
                       max_steps=max_steps)
