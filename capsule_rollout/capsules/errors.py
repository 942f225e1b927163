"""Domain errors of the capsule mechanism; each message says what to change."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata


class CapsuleError(Exception):
    """Base class of every error raised by `capsules`."""


class SpecError(CapsuleError, ValueError):
    """A buffer spec or a component registration is invalid."""


MISSING = "<missing>"
"""What a `Mismatch` says for the side that lacks the entry."""


@dataclass(frozen=True)
class Mismatch:
    """One difference between a capsule and the arena it is meant for."""

    kind: str  # "fingerprint", "spec" or "component" (a component's own `check_restore`)
    key: str
    capsule: str
    arena: str

    def __str__(self) -> str:
        if self.kind == "component":
            return f"component {self.key!r} refused the capsule: {self.capsule}"
        return f"{self.kind} {self.key!r}: capsule has {self.capsule}, arena has {self.arena}{self._install_hint()}"

    def _install_hint(self) -> str:
        """Where a fingerprint entry is an installed package's version (`env/mujoco`), how to get the capsule's."""
        if self.kind != "fingerprint":
            return ""
        package = self.key.rsplit("/", 1)[-1]
        try:
            installed = metadata.version(package)
        except (metadata.PackageNotFoundError, ValueError):
            return ""
        if installed != self.arena or self.capsule in ("", MISSING):
            return ""
        return f" (the capsule was made with {package} {self.capsule}: `pip install {package}=={self.capsule}` restores it)"


class CapsuleMismatchError(CapsuleError):
    """A capsule does not belong to this arena (specs or fingerprint differ, or a component refused it)."""

    def __init__(self, label: str, mismatches: list[Mismatch]):
        self.mismatches = list(mismatches)
        lines = "\n".join(f"  - {m}" for m in self.mismatches)
        super().__init__(
            f"capsule {label!r} cannot be restored into this arena; "
            f"{len(self.mismatches)} difference(s):\n{lines}\n"
            "Restore a capsule taken from components with the same buffer specs, "
            "weights and code version, or take a new snapshot."
        )


class CapsuleAlignmentError(CapsuleError):
    """A snapshot was asked for at a step that is not a committed boundary."""


class CapsuleFormatError(CapsuleError):
    """A serialized capsule is truncated, malformed or of another format version."""


class CapsuleSignatureError(CapsuleError):
    """A capsule file asked to be verified with a key is unsigned, or signed with another key, or changed
    since it was signed."""


class CapsuleIntegrityError(CapsuleError):
    """A capsule's bytes do not match the digests recorded when it was taken."""

    def __init__(self, source: str, bad_keys: list[str]):
        self.bad_keys = list(bad_keys)
        super().__init__(
            f"capsule {source}: digest mismatch in {len(bad_keys)} buffer(s): "
            f"{', '.join(bad_keys)}. Their bytes differ from the snapshot's (a damaged file, or memory "
            "written after the snapshot); take a new snapshot instead."
        )


class CapsuleNotFoundError(CapsuleError, KeyError):
    """A capsule store has no entry under the requested key."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else "capsule not found"


class StoreBudgetError(CapsuleError):
    """Pinned capsules do not fit the device-tier budget of a capsule store."""
