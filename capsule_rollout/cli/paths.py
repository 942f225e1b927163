"""Paths given on the command line, resolved the way users expect."""

from __future__ import annotations

from pathlib import Path

from capsule_rollout.shipped import shipped_path

PROJECT = Path(__file__).resolve().parent.parent


def resolve_input(path: str) -> str:
    """`path` as given if it exists; else a shipped checkpoint's copy (`checkpoints/policy`, and the places
    written before: `shipped.shipped_path`), or for another project-relative path the project's copy (so entry
    points work from any directory, e.g. under `ray job submit`); else `path` unchanged."""
    path = shipped_path(path)
    if Path(path).exists() or Path(path).is_absolute():
        return path
    candidate = PROJECT / path
    return str(candidate) if candidate.exists() else path
