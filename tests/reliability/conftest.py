"""The reliability suite's tallies: each test adds its counts; the run prints them as one table.

`RELIABILITY_REPORT=path.json` also writes them to a file (docs/BENCHMARKS.md's reliability table).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict

import pytest

_TALLIES: dict[str, dict[str, float]] = defaultdict(dict)


class Report:
    """Adds to one section's counts (`add`) or keeps a maximum (`peak`)."""

    def add(self, section: str, **counts: float) -> None:
        for key, value in counts.items():
            _TALLIES[section][key] = _TALLIES[section].get(key, 0) + value

    def peak(self, section: str, **values: float) -> None:
        for key, value in values.items():
            _TALLIES[section][key] = max(_TALLIES[section].get(key, value), value)


@pytest.fixture(scope="session")
def report() -> Report:
    return Report()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _TALLIES:
        return
    terminalreporter.section("reliability tallies")
    for section, counts in sorted(_TALLIES.items()):
        terminalreporter.write_line(f"{section}: " + ", ".join(f"{k} {v:g}" for k, v in counts.items()))
    path = os.environ.get("RELIABILITY_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(_TALLIES, f, indent=2, sort_keys=True)
