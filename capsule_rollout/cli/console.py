"""The console the commands print to (wide enough for tables when piped to a log), and the rows a command prints of
its start-up."""

from __future__ import annotations

import os
import sys

from rich.console import Console


def make_console() -> Console:
    return Console(width=None if sys.stdout.isatty() else 150)


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: `/proc`), else None."""
    try:
        with open("/proc/self/stat") as stat:
            after_name = stat.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as uptime:
            up = float(uptime.read().split()[0])
        return max(0.0, up - int(after_name[19]) / os.sysconf("SC_CLK_TCK"))  # field 22: the start time, in ticks
    except (OSError, ValueError, IndexError):
        return None


def startup_rows(startup: dict) -> list[tuple[str, str]]:
    """The table's rows of a run's start-up (`sim_rollout`'s summary `startup`)."""
    def s(key: str) -> str:
        value = startup.get(key)
        return "-" if value is None else f"{value:.1f} s"

    return [("start-up: before the command (interpreter, imports)", s("before_command_s")),
            ("start-up: inputs checked and preflight / Ray's start", f"{s('preflight_s')} / {s('ray_s')}"),
            ("start-up: to the first actor ready / its first call's episodes back", f"{s('to_actors_ready_s')} / "
                                                                          f"{s('to_first_episode_s')}")]
