"""Every benchmark module runs from `make bench` (or, for the GPU ones, from `make gpu-check`'s script), and every
one that `make bench` runs writes its section of the docs."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED = {"__init__", "__main__", "harness", "report", "timing"}


def _recipe(target: str) -> str:
    """The lines of `target`'s recipe in the Makefile."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(rf"{target}:", line))
    recipe = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        recipe.append(line)
    return "\n".join(recipe)


def test_every_benchmark_runs_from_make_bench_or_the_gpu_check():
    bench = _recipe("bench")
    gpu = (ROOT / "benchmarks" / "gpu_check.py").read_text()
    modules = {p.stem for p in (ROOT / "benchmarks").glob("*.py")} - SHARED
    run = {m for m in modules if f"-m benchmarks.{m} " in bench}
    by_gpu_check = {m for m in modules if f'"benchmarks.{m}"' in gpu} | {"gpu_check"}
    assert modules - run - by_gpu_check == set(), "a benchmark neither `make bench` nor `make gpu-check` runs"
    assert "gpu_check" in _recipe("gpu-check")


def test_each_benchmark_make_bench_runs_writes_its_section_and_its_summary():
    for line in _recipe("bench").splitlines():
        m = re.search(r"-m benchmarks\.(\w+) ", line)
        if m:
            assert "--docs $(BENCH_DOCS)" in line and "--json runs/bench/" in line, line
