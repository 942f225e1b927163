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


# Test tiers (Makefile: `make test-unit`, then `make test-integration`; `make test` runs both). A test is in the
# integration tier when it is marked `ray` or lives in one of these places (the command line, benchmarks, the
# examples, training and learning loops, the shipped models under every kernel path): it starts Ray, trains a
# model or runs the shipped models in fresh processes. Everything else is the unit tier, which
# runs in parallel (pytest-xdist) and in which starting Ray is an error naming this list (`_unit_tier_starts_no_ray`).
INTEGRATION = ("tests/cli/", "tests/benchmarks/", "tests/learning/", "tests/test_examples.py",
               "tests/reliability/test_ray_driver_faults.py", "tests/reliability/test_store_damage.py",
               "tests/critics/test_value_critic.py", "tests/rollout/test_slot_check.py", "tests/rollout/test_slots.py",
               "tests/rollout/test_preflight.py", "tests/rollout/test_record.py", "tests/rollout/test_served_sources.py",
               "tests/rollout/test_infer_rows.py", "tests/rollout/test_remote_policy.py", "tests/test_import_path.py",
               "tests/models/test_kernel_paths.py")
SERIAL = ("tests/rollout/test_ray_driver.py", "tests/reliability/test_ray_driver_faults.py",
          "tests/cli/test_sim_rollout.py")
"""Integration tests that time hangs against deadlines of a second or two: run after the others, alone (marked
`serial`), so that no test beside them stretches a step past its deadline."""
UNIT_TIER = os.environ.get("CAPSULE_ROLLOUT_TEST_TIER") == "unit"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)
        where = os.path.relpath(str(item.path), ROOT).replace(os.sep, "/")
        if "ray" in item.keywords or where.startswith(INTEGRATION):
            item.add_marker(pytest.mark.integration)
        if where.startswith(SERIAL):
            item.add_marker(pytest.mark.serial)


@pytest.fixture(autouse=True)
def _unit_tier_starts_no_ray(monkeypatch):
    """In the unit tier, a test that starts Ray fails with the line that says where it belongs."""
    if UNIT_TIER:
        ray = pytest.importorskip("ray")

        def refuse(*args, **kwargs):
            raise RuntimeError("this test starts Ray: it belongs to the integration tier (mark it `ray`, or add its "
                               "module to INTEGRATION in tests/conftest.py)")

        monkeypatch.setattr(ray, "init", refuse)
    yield


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
