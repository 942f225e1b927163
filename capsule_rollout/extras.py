"""The optional extras (`pyproject.toml`'s `[project.optional-dependencies]`) and how to install one, said the
way that works where the user stands: a wheel user installs `capsule-rollout[extra]` from the index, a checkout
user `-e ".[extra]"`. Standard library only: every layer names its extras here."""

from __future__ import annotations

DISTRIBUTION = "capsule-rollout"


class MissingExtraError(ImportError):
    """An optional dependency is missing; the message gives the command that installs it (one line)."""


def install_command(extra: str) -> str:
    """`pip install "capsule-rollout[extra]"` (a checkout: `pip install -e ".[extra]"`)."""
    return f'pip install "{DISTRIBUTION}[{extra}]" (in a checkout: pip install -e ".[{extra}]")'
