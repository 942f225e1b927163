"""The checkpoints shipped with the package: data beside the code (`capsule_rollout/checkpoints/policy` and
`critic`, the tabletop example's flow policy and value critic), named on a command line as `checkpoints/policy`.

`shipped_path` finds them from any directory, and keeps paths written before they moved, or by another install,
working: `experiments/checkpoints/policy` (their place before the package was grouped by concept), and a run's
`rollout.json` that names another install's copy (`/elsewhere/capsule_rollout/experiments/checkpoints/policy`).
Standard library only, so any layer may import it."""

from __future__ import annotations

import re
from pathlib import Path

SHIPPED = Path(__file__).resolve().parent / "checkpoints"
NAMES = ("policy", "critic")
# a shipped checkpoint as a path names it: project-relative, or any install's absolute copy, at either place
_RELATIVE = re.compile(r"^(?:\./)?(?:capsule_rollout/)?(?:experiments/)?checkpoints/(policy|critic)/?$")
_ABSOLUTE = re.compile(r"^/.*/capsule_rollout/(?:experiments/)?checkpoints/(policy|critic)/?$")


def shipped_path(path: str) -> str:
    """`path` as given when it exists; else, when it names a shipped checkpoint (`checkpoints/policy`,
    `experiments/checkpoints/critic`, or an absolute path ending in `capsule_rollout/.../checkpoints/policy`),
    this install's copy; else `path` unchanged (the caller says what is missing)."""
    if not path or Path(path).exists():
        return path
    found = (_ABSOLUTE if Path(path).is_absolute() else _RELATIVE).match(path)
    return path if found is None else str(SHIPPED / found.group(1))
