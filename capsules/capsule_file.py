"""Capsule serialization: safetensors tensors + JSON metadata, never pickle.

One file (or byte string) per capsule. The safetensors header's `__metadata__`
holds `format`, `format_version` and `meta` (JSON: identity, fingerprint, specs,
digests). Reading checks, in order: header framing (truncation), format name and
version, that tensors match the declared specs, and that every buffer matches its
recorded digest. Only then is a `Capsule` built, so a refused file can never reach
(let alone half-restore) a live arena. Files are written atomically.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import safetensors.torch
import torch

from capsules.buffer_spec import BufferSpec
from capsules.capsule import Capsule, CapsuleMeta
from capsules.errors import CapsuleFormatError, CapsuleIntegrityError, SpecError
from capsules.layout import plan_slabs

FORMAT_NAME = "capsule-rollout/capsule"
FORMAT_VERSION = 1
MAX_HEADER_BYTES = 64 << 20
FILE_SUFFIX = ".capsule"


def capsule_to_bytes(capsule: Capsule, *, annotations: Mapping[str, str] | None = None) -> bytes:
    """Serialize a capsule (digests included) to bytes."""
    meta = capsule.meta
    payload = {
        "capsule_id": meta.capsule_id,
        "label": meta.label,
        "step": meta.step,
        "episode": meta.episode,
        "created_at": meta.created_at,
        "fingerprint": dict(meta.fingerprint),
        "forced": meta.forced,
        "extra": dict(meta.extra),
        "specs": {k: s.to_json() for k, s in capsule.specs.items()},
        "digests": dict(capsule.digests),
        "annotations": dict(annotations or {}),
    }
    # Views of one slab share storage, which safetensors refuses: save copies.
    tensors = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in capsule.tensors().items()}
    return safetensors.torch.save(
        tensors,
        metadata={"format": FORMAT_NAME, "format_version": str(FORMAT_VERSION), "meta": json.dumps(payload)},
    )


def read_header(data: bytes, source: str = "<bytes>", *, total_size: int | None = None) -> dict[str, Any]:
    """Validate framing, format and version; return the parsed `meta` JSON.

    `data` must hold at least the length prefix and the header; `total_size` is
    the full size of the serialized capsule (default: `len(data)`).
    """
    total = len(data) if total_size is None else total_size
    if total < 8 or len(data) < 8:
        raise CapsuleFormatError(f"{source}: {total} bytes is too short to be a capsule (truncated?)")
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER_BYTES or 8 + n > min(total, len(data)):
        raise CapsuleFormatError(
            f"{source}: header claims {n} bytes but only {min(total, len(data)) - 8} follow the length "
            "prefix: the file is truncated or not a capsule"
        )
    try:
        header = json.loads(data[8 : 8 + n])
        meta_block = header["__metadata__"]
        if not isinstance(meta_block, dict):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        raise CapsuleFormatError(f"{source}: not a capsule file (no safetensors metadata header)") from None
    if meta_block.get("format") != FORMAT_NAME:
        raise CapsuleFormatError(f"{source}: format {meta_block.get('format')!r} is not {FORMAT_NAME!r}")
    version = meta_block.get("format_version")
    if version != str(FORMAT_VERSION):
        raise CapsuleFormatError(
            f"{source}: capsule format version {version!r}; this build reads version {FORMAT_VERSION}. "
            "Re-create the capsule with this version of the code."
        )
    try:
        meta = json.loads(meta_block["meta"])
    except (ValueError, KeyError):
        raise CapsuleFormatError(f"{source}: capsule metadata is not valid JSON") from None
    try:
        ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
    except (KeyError, TypeError, IndexError):
        raise CapsuleFormatError(f"{source}: malformed tensor table in the header") from None
    try:
        end = 8 + n + max((int(e) for e in ends), default=0)
    except (TypeError, ValueError):
        raise CapsuleFormatError(f"{source}: malformed tensor table in the header") from None
    if end > total:
        raise CapsuleFormatError(f"{source}: tensor data ends at byte {end} but there are only {total}: truncated")
    return meta


def capsule_from_bytes(data: bytes, *, source: str = "<bytes>") -> Capsule:
    """Parse and fully validate a serialized capsule (see module docstring)."""
    meta = read_header(data, source)
    try:
        specs = {k: BufferSpec.from_json(v) for k, v in meta["specs"].items()}
        digests = {str(k): str(v) for k, v in meta["digests"].items()}
        capsule_meta = CapsuleMeta(
            capsule_id=str(meta["capsule_id"]),
            label=str(meta["label"]),
            step=int(meta["step"]),
            episode=None if meta["episode"] is None else str(meta["episode"]),
            created_at=float(meta["created_at"]),
            fingerprint=MappingProxyType({str(k): str(v) for k, v in meta["fingerprint"].items()}),
            forced=bool(meta["forced"]),
            extra=MappingProxyType({str(k): str(v) for k, v in meta["extra"].items()}),
        )
    except (KeyError, TypeError, ValueError, AttributeError, SpecError) as exc:
        raise CapsuleFormatError(f"{source}: malformed capsule metadata ({exc!r})") from None
    try:
        tensors = safetensors.torch.load(bytes(data))
    except Exception as exc:  # the Rust reader raises its own error type
        raise CapsuleFormatError(f"{source}: unreadable tensor data ({exc})") from None
    _check_tensors(tensors, specs, digests, source)
    slabs = []
    for layout in plan_slabs(specs):
        slab = torch.zeros(layout.nbytes, dtype=torch.uint8)
        for slot in layout.slots:  # raw bytes: a typed copy would normalise e.g. bools
            raw = tensors[slot.key].reshape(-1).view(torch.uint8)
            slab[slot.offset : slot.offset + slot.nbytes].copy_(raw)
        slabs.append((layout, slab))
    capsule = Capsule(capsule_meta, slabs, digests)
    capsule.check_integrity(source)
    return capsule


def _check_tensors(
    tensors: Mapping[str, torch.Tensor], specs: Mapping[str, BufferSpec], digests: Mapping[str, str], source: str
) -> None:
    if set(tensors) != set(specs) or set(digests) != set(specs):
        missing = sorted(set(specs) - set(tensors))
        extra = sorted(set(tensors) - set(specs))
        raise CapsuleFormatError(
            f"{source}: tensors do not match the declared specs (missing {missing}, undeclared {extra})"
        )
    bad = [k for k, t in tensors.items() if t.dtype != specs[k].dtype or tuple(t.shape) != specs[k].shape]
    if bad:
        raise CapsuleIntegrityError(source, bad)


def save_capsule(capsule: Capsule, path: str | os.PathLike, *, annotations: Mapping[str, str] | None = None) -> Path:
    """Write atomically (temp file, fsync, rename); returns the final path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = capsule_to_bytes(capsule, annotations=annotations)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def load_capsule(path: str | os.PathLike) -> Capsule:
    """Read and validate a capsule file; raises CapsuleFormatError / CapsuleIntegrityError."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CapsuleFormatError(f"{path}: no such capsule file") from None
    return capsule_from_bytes(data, source=str(path))


def nbytes_from_header(meta: dict[str, Any]) -> int:
    """Slab bytes a capsule described by header `meta` occupies once loaded."""
    try:
        specs = {k: BufferSpec.from_json(v) for k, v in meta["specs"].items()}
    except (KeyError, TypeError, AttributeError, SpecError) as exc:
        raise CapsuleFormatError(f"malformed capsule specs in header ({exc!r})") from None
    return sum(layout.nbytes for layout in plan_slabs(specs))


def read_file_header(path: str | os.PathLike) -> dict[str, Any]:
    """The `meta` JSON of a capsule file, reading only its header."""
    path = Path(path)
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise CapsuleFormatError(f"{path}: too short to be a capsule (truncated?)")
        (n,) = struct.unpack("<Q", prefix)
        if n > MAX_HEADER_BYTES:
            raise CapsuleFormatError(f"{path}: header length {n} is implausible: not a capsule")
        head = prefix + f.read(n)
    return read_header(head, str(path), total_size=path.stat().st_size)
