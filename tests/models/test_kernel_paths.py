"""Batch invariance under every kernel path torch can be forced to on this machine: the default, AVX2 and the
scalar code of ATen (`ATEN_CPU_CAPABILITY`), oneDNN held to AVX2 (`ONEDNN_MAX_CPU_ISA`), MKL held to AVX2
(`MKL_ENABLE_INSTRUCTIONS`). Under each, the shipped policy and critic give every row of 8, in one call, what a
batch of one gives, and the exact sums give the same bits on every path; and the row tests
(`tests/policies/test_model_rows.py`) pass under each path, not only the one this machine picks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks.kernel_paths import PATH_VARIABLES, PATHS  # the paths `bench_kernel_paths` measures

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _path_env(extra: dict[str, str]) -> dict[str, str]:
    """This process's environment under one kernel path: what any path sets taken out, then `extra` set."""
    env = {k: v for k, v in os.environ.items() if k not in PATH_VARIABLES and not k.startswith("PYTEST_XDIST")}
    return {**env, **extra}


def _start(extra: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.models.kernel_path_probe"], cwd=ROOT, env=_path_env(extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def probes() -> dict[str, dict]:
    started = {name: _start(extra) for name, extra in PATHS.items()}  # side by side: one process each
    found = {}
    for name, process in started.items():
        out, err = process.communicate(timeout=900)
        assert process.returncode == 0, (name, err[-3000:])
        found[name] = json.loads(out.strip().splitlines()[-1])
    return found


def test_the_rows_agree_in_one_call_under_every_kernel_path(probes):
    assert probes["aten-avx2"]["capability"] == "AVX2" and probes["aten-scalar"]["capability"] == "DEFAULT"
    for name, probe in probes.items():
        assert probe["rows_agree"] and probe["one_call"] and probe["narrow_rows_agree"], (name, probe)


def test_the_exact_sums_are_the_same_bits_on_every_kernel_path(probes):
    assert len({probe["sums"] for probe in probes.values()}) == 1, probes
    # the float32 copy of the weights widened only where ATen's kernels are vectorized (scalar: the widening costs
    # more than it saves), the same bits either way
    assert {name: probe["widens"] for name, probe in probes.items()} == {name: name != "aten-scalar" for name in probes}
    assert all(probe["same_with_copy"] for probe in probes.values()), probes


@pytest.mark.slow
def test_the_row_tests_pass_under_every_kernel_path():
    """The default path runs them in the tier itself; the others here, one pytest process after another (a path's
    variables must be set before torch loads; side by side they oversubscribe the cores several times over)."""
    failed = {}
    for name, extra in PATHS.items():
        if not extra:
            continue
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                               "tests/policies/test_model_rows.py"], cwd=ROOT, env=_path_env(extra),
                              capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            failed[name] = (done.stdout + done.stderr)[-3000:]
    assert not failed, failed
