"""`kept_process_state`: what building and playing a host in this process changes of it (torch's thread count,
the environment variables a renderer or a GPU actor sets), put back as it was found, for a caller that runs
rollouts in its own process (`record_rollouts(actors=0)`, the driver's preflight)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

KEPT_VARIABLES = ("LP_NUM_THREADS", "MUJOCO_EGL_DEVICE_ID", "RAY_USAGE_STATS_ENABLED")
"""Environment variables a run may write (`envs.gl_backend.prepare_first_context`, `RolloutActor`,
`rollout.ray_rollout.init_ray`)."""


@contextmanager
def kept_process_state() -> Iterator[None]:
    """Run the block, then restore torch's thread count and `KEPT_VARIABLES` (set, changed or removed) as they
    were before it."""
    threads = torch.get_num_threads()
    saved = {name: os.environ.get(name) for name in KEPT_VARIABLES}
    try:
        yield
    finally:
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
