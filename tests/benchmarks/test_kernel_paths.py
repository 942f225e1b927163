"""The kernel-paths benchmark runs end to end: two paths, a process each, and an earlier checkout beside this one
(figures are not asserted: shared machines)."""

import json
import shutil
from pathlib import Path

import pytest

from benchmarks.kernel_paths import KernelPathsConfig, main

ROOT = Path(__file__).resolve().parents[2]


def test_bench_kernel_paths_smoke(tmp_path):
    before = tmp_path / "before"  # an earlier tree: here a copy of this package
    shutil.copytree(ROOT / "capsule_rollout", before / "capsule_rollout", ignore=shutil.ignore_patterns("__pycache__"))
    docs, out = tmp_path / "B.md", tmp_path / "b.json"
    docs.write_text("# Benchmarks\n")
    assert main(["--paths", "default", "aten-avx2", "--slots", "2", "--episodes", "2", "--max_steps", "6",
                 "--rounds", "1", "--before", str(before), "--docs", str(docs), "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert set(data["paths"]) == {"default", "aten-avx2"} and all(set(p) == {"now", "before"}
                                                                  for p in data["paths"].values())
    assert data["paths"]["aten-avx2"]["now"]["capability"] == "AVX2"
    for p in data["paths"].values():
        now = p["now"]
        assert set(now["steps_per_s"]) == {"one_drawn", "one_on_demand", "slots_drawn", "slots_on_demand", "one_as_is"}
        assert now["policy_rows_in_one_call"] and now["critic_rows_in_one_call"]
        assert now["slots_record_one_slots_episodes"]
    text = docs.read_text()
    assert "<!-- bench_kernel_paths:begin -->" in text and "aten-avx2 (before)" in text


def test_an_unknown_path_is_named():
    with pytest.raises(ValueError, match="unknown: \\['avx9'\\]"):
        KernelPathsConfig(paths=("default", "avx9"))
