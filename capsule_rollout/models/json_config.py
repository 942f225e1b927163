"""`JsonConfig`: to_json / from_json for frozen dataclass configs saved in checkpoints.

`from_json` restores tuples (JSON has lists), refuses unknown fields with the known ones
listed, and reads a renamed field under its old name (`RENAMED = {"old": "new"}`), so
checkpoints written before a rename still load.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, TypeVar

T = TypeVar("T", bound="JsonConfig")


class JsonConfig:
    RENAMED: ClassVar[dict[str, str]] = {}
    WHAT: ClassVar[str] = "config"
    """What the config describes, for messages ("policy config")."""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_json(cls: type[T], data: dict[str, Any]) -> T:
        data = {cls.RENAMED.get(key, key): value for key, value in data.items()}
        fields = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - fields)
        if unknown:
            raise ValueError(f"unknown {cls.WHAT} fields {unknown}; this code knows {sorted(fields)}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})
