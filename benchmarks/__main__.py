"""`python -m benchmarks`: the benchmarks, each with what it measures (the first line of its docstring)."""

from __future__ import annotations

import ast
from pathlib import Path

HERE = Path(__file__).parent
SHARED = {"__init__", "__main__", "harness", "report", "timing"}  # what the benchmarks are made with


def listing() -> str:
    lines = ["usage: python -m benchmarks.NAME [--field value ...] [--json PATH] [--docs docs/BENCHMARKS.md]",
             "(from the repository's root; `python -m benchmarks.NAME --help` lists a benchmark's options)", "",
             "benchmarks:"]
    for path in sorted(HERE.glob("*.py")):
        if path.stem not in SHARED:
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            lines.append(f"  {path.stem:<16} {' '.join(doc.split(chr(10) * 2)[0].split())}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(listing())
