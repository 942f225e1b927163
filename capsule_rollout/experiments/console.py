"""The console experiments print to (wide enough for tables when piped to a log)."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table


def make_console() -> Console:
    return Console(width=None if sys.stdout.isatty() else 150)


def measure_table(title: str, rows) -> Table:
    """A benchmark's (measure, value, target) rows as a table."""
    table = Table(title=title)
    for col in ("measure", "value", "target"):
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    return table
