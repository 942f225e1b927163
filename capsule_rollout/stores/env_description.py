"""`EnvDescription`: what the env a store's episodes were recorded in says of itself (its control rate, the
names of its state and action dimensions, its cameras and their image size), kept with the store as
`<store>/env.json` so that what reads the store later (`export_lerobot`: the dataset's fps and feature names)
needs no option and no knowledge of the env.

A store is a directory (a zarr store or a sharded store root); the file sits beside its data, and zarr
ignores it. A store that episodes of another env are appended to keeps what both agree on: a field they
disagree on is dropped (unknown), never silently one env's. A store recorded before this file existed has
none (`read_env_description` answers None).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

ENV_FILE = "env.json"
VERSION = 1


@dataclass(frozen=True)
class EnvDescription:
    """What an env says of itself, as plain data."""

    env: str = ""
    """The env id the episodes were played in (`suite:task`, `package.module:factory`)."""
    control_hz: float | None = None
    """Control steps per second (None: the env tells none)."""
    names: Mapping[str, Sequence[str]] = field(default_factory=dict)
    """Names of the dimensions of the episode fields that are vectors (`state`, `action`), where the env tells
    them."""
    cameras: tuple[str, ...] = ()
    """The cameras recorded, by the env's names."""
    image_size: tuple[int, int] | None = None
    """(H, W) of the recorded images (None: none recorded)."""

    def __post_init__(self) -> None:
        if self.control_hz is not None and not (math.isfinite(self.control_hz) and self.control_hz > 0):
            raise ValueError(f"control_hz must be a positive number or None, got {self.control_hz}")
        object.__setattr__(self, "names", {str(k): [str(n) for n in v] for k, v in dict(self.names).items()})
        object.__setattr__(self, "cameras", tuple(str(c) for c in self.cameras))
        if self.image_size is not None:
            object.__setattr__(self, "image_size", tuple(int(s) for s in self.image_size))

    def to_json(self) -> dict:
        return {"version": VERSION, **asdict(self), "cameras": list(self.cameras),
                "image_size": list(self.image_size) if self.image_size else None}

    @classmethod
    def from_json(cls, data: Mapping) -> EnvDescription:
        known = {"env", "control_hz", "names", "cameras", "image_size"}
        return cls(**{k: v for k, v in data.items() if k in known})

    def agreed(self, other: EnvDescription) -> EnvDescription:
        """What this and `other` (episodes of another env in the same store) agree on; the rest unknown."""
        same = lambda name: getattr(self, name) if getattr(self, name) == getattr(other, name) else None  # noqa: E731
        names = {k: v for k, v in self.names.items() if other.names.get(k) == v}
        return EnvDescription(env=self.env if self.env == other.env else "", control_hz=same("control_hz"),
                              names=names, cameras=tuple(c for c in self.cameras if c in other.cameras),
                              image_size=same("image_size"))


def read_env_description(store: str | os.PathLike) -> EnvDescription | None:
    """The store's description, or None (a store recorded before descriptions were kept, or by other tools)."""
    path = Path(store) / ENV_FILE
    if not path.is_file():
        return None
    try:
        return EnvDescription.from_json(json.loads(path.read_text()))
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path} is not an env description ({exc}): remove it, or pass what it should say "
                         "(export_lerobot --fps)") from None


def write_env_description(store: str | os.PathLike, description: EnvDescription) -> Path:
    """Keep `description` with the store (atomic), merged with what the store already says (`agreed`)."""
    root = Path(store)
    root.mkdir(parents=True, exist_ok=True)
    previous = read_env_description(root)
    if previous is not None and previous != description:
        description = previous.agreed(description)
    path = root / ENV_FILE
    tmp = root / f".{ENV_FILE}.tmp"
    tmp.write_text(json.dumps(description.to_json(), indent=2) + "\n")
    os.replace(tmp, path)
    return path
