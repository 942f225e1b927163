"""Paths given on the command line, resolved the way users expect."""

from __future__ import annotations

from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent


def resolve_input(path: str) -> str:
    """`path` as given if it exists; else, for a project-relative path such as the
    shipped `experiments/checkpoints/policy`, the project's copy (so entry points
    work from any directory, e.g. under `ray job submit`); else `path` unchanged."""
    if Path(path).exists() or Path(path).is_absolute():
        return path
    candidate = PROJECT / path
    return str(candidate) if candidate.exists() else path
