"""The console experiments print to (wide enough for tables when piped to a log)."""

from __future__ import annotations

import sys

from rich.console import Console


def make_console() -> Console:
    return Console(width=None if sys.stdout.isatty() else 150)
