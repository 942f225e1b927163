"""`BufferSpec`: a component's declaration of one named buffer of its state."""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from capsule_rollout.capsules.errors import SpecError


class Role(str, enum.Enum):
    """What a buffer is for, which decides whether capsules carry it."""

    STATE = "state"  # part of the committed boundary: snapshotted and restored
    IO = "io"  # static input/output slot of a captured graph: overwritten every step
    SCRATCH = "scratch"  # temporary workspace: never snapshotted


# dtype <-> name, for JSON metadata and the disk format.
DTYPES: dict[str, torch.dtype] = {
    "bool": torch.bool,
    "uint8": torch.uint8,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")


def dtype_from_name(name: str) -> torch.dtype:
    """Inverse of `DTYPE_NAMES`, with an error that lists the supported names."""
    try:
        return DTYPES[name]
    except KeyError:
        raise SpecError(f"unsupported dtype {name!r}; supported: {sorted(DTYPES)}") from None


@dataclass(frozen=True)
class BufferSpec:
    """One named buffer a component needs: `shape`, `dtype`, `device` and `role`.

    `alignment` (state buffers only) says that committed boundaries must fall on
    multiples of this many host steps (e.g. an action-chunk boundary); a snapshot
    elsewhere is refused unless forced.
    """

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: str = "cpu"
    role: Role = Role.STATE
    alignment: int | None = None
    doc: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise SpecError(
                f"buffer name {self.name!r} is invalid: use letters, digits, '_', '.' "
                "or '-', starting with a letter or '_' (no '/': it separates component "
                "and buffer)"
            )
        try:
            shape = tuple(int(s) for s in self.shape)
        except (TypeError, ValueError):
            raise SpecError(f"buffer {self.name!r}: shape {self.shape!r} must be a tuple of ints") from None
        if any(s < 0 for s in shape):
            raise SpecError(f"buffer {self.name!r}: shape {shape} has a negative dimension")
        object.__setattr__(self, "shape", shape)
        if isinstance(self.dtype, str):
            object.__setattr__(self, "dtype", dtype_from_name(self.dtype))
        if self.dtype not in DTYPE_NAMES:
            raise SpecError(
                f"buffer {self.name!r}: dtype {self.dtype} is not supported; use one of {sorted(DTYPES)}"
            )
        try:
            device = torch.device(self.device)
        except (RuntimeError, TypeError):
            raise SpecError(f"buffer {self.name!r}: device {self.device!r} is not a torch device") from None
        object.__setattr__(self, "device", str(device))
        try:
            object.__setattr__(self, "role", Role(self.role))
        except ValueError:
            raise SpecError(
                f"buffer {self.name!r}: role {self.role!r} is unknown; use one of {[r.value for r in Role]}"
            ) from None
        if self.alignment is not None:
            if isinstance(self.alignment, bool) or not isinstance(self.alignment, int) or self.alignment < 1:
                raise SpecError(f"buffer {self.name!r}: alignment must be a positive int, got {self.alignment!r}")
            if self.role is not Role.STATE:
                raise SpecError(
                    f"buffer {self.name!r}: alignment only applies to role 'state' "
                    f"(this buffer is {self.role.value!r}); drop the alignment"
                )

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def device_type(self) -> str:
        return torch.device(self.device).type

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": DTYPE_NAMES[self.dtype],
            "device": self.device,
            "role": self.role.value,
            "alignment": self.alignment,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BufferSpec:
        """The inverse of `to_json`; anything `to_json` would not have written is a `SpecError`."""
        if not isinstance(data, dict):
            raise SpecError(f"malformed buffer spec: expected an object, got {type(data).__name__}")
        shape = data.get("shape")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
            raise SpecError(f"malformed buffer spec {str(data)[:200]}: shape must be a list of ints")
        if not all(isinstance(data.get(k), str) for k in ("name", "dtype", "device", "role")):
            raise SpecError(f"malformed buffer spec {str(data)[:200]}: name, dtype, device and role are strings")
        try:
            return cls(
                name=data["name"],
                shape=tuple(shape),
                dtype=dtype_from_name(data["dtype"]),
                device=data["device"],
                role=Role(data["role"]),
                alignment=data.get("alignment"),
            )
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise SpecError(f"malformed buffer spec {str(data)[:200]}: {str(exc)[:200]}") from None

    def describe(self) -> str:
        """Short human form used in mismatch messages."""
        align = f", align {self.alignment}" if self.alignment else ""
        return f"{DTYPE_NAMES[self.dtype]}{list(self.shape)} on {self.device} ({self.role.value}{align})"
