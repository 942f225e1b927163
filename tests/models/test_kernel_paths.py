"""Batch invariance under every kernel path torch can be forced to on this machine: the default, AVX2 and the
scalar code of ATen (`ATEN_CPU_CAPABILITY`), oneDNN held to AVX2 (`ONEDNN_MAX_CPU_ISA`), MKL held to AVX2
(`MKL_ENABLE_INSTRUCTIONS`). Under each, the shipped policy and critic give every row of 8, in one call, what a
batch of one gives, and the exact sums give the same bits on every path."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PATHS = {
    "default": {},
    "aten-avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "aten-scalar": {"ATEN_CPU_CAPABILITY": "default"},
    "onednn-avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2"},
    "mkl-avx2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"},
}


def _probe(extra: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA",
                                                             "MKL_ENABLE_INSTRUCTIONS")}
    out = subprocess.run([sys.executable, "-m", "tests.models.kernel_path_probe"], cwd=ROOT, env={**env, **extra},
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def probes() -> dict[str, dict]:
    return {name: _probe(extra) for name, extra in PATHS.items()}


def test_the_rows_agree_in_one_call_under_every_kernel_path(probes):
    assert probes["aten-avx2"]["capability"] == "AVX2" and probes["aten-scalar"]["capability"] == "DEFAULT"
    for name, probe in probes.items():
        assert probe["rows_agree"] and probe["one_call"], (name, probe)


def test_the_exact_sums_are_the_same_bits_on_every_kernel_path(probes):
    assert len({probe["sums"] for probe in probes.values()}) == 1, probes
