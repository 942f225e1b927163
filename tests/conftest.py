"""Test environment: Triton's CPU interpreter without a GPU, headless rendering, no Ray telemetry."""

from __future__ import annotations

import os

# MUJOCO_GL is left to envs.gl_backend (the same path users take).
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Capsules are signed with the user's key (capsules.signing_key): the tests use one of their own, not a file in
# the home directory (tests/capsules/test_signing_key.py checks the default file in a temporary one).
os.environ.setdefault("CAPSULE_ROLLOUT_KEY", "tests-capsule-key-0123456789abcdef")

import torch  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:  # before any @triton.jit runs (module import time)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "project", deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "project"))

DEVICES = ["cpu", "cuda"] if HAS_CUDA else ["cpu"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray session shared by the tests that need one (starting Ray takes seconds)."""
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", include_dashboard=False, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()
