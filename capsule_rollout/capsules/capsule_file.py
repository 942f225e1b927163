"""Capsule serialization: safetensors tensors + JSON metadata, never pickle.

One file (or byte string) per capsule. The safetensors header's `__metadata__`
holds `format`, `format_version`, `meta` (JSON: identity, fingerprint, specs,
digests), `meta_sha256` (of the `meta` text) and, when written with a key, `signature` (HMAC-SHA256 over the
`meta` text and every tensor's bytes). Reading checks, in order: header
framing (size limit, truncation), strict JSON (no NaN or Infinity), format name and
version, the metadata's sha256, the type of every metadata value, that tensors match
the declared specs, and that every buffer matches its recorded digest. Every problem
is a `CapsuleFormatError` or `CapsuleIntegrityError`. Only then is a `Capsule` built,
so a refused file can never reach (let alone half-restore) a live arena. The digests
detect damage, not tampering: whoever can write the file can recompute them; a capsule from another machine
is trusted through a key both sides hold (`save_capsule(..., key=)`, `load_capsule(..., key=)`: an unsigned or
wrongly signed file is refused before anything is built). Files are written atomically.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import safetensors.torch
import torch

from capsule_rollout.capsules.buffer_spec import DTYPE_NAMES, BufferSpec
from capsule_rollout.capsules.capsule import Capsule, CapsuleMeta
from capsule_rollout.capsules.errors import CapsuleFormatError, CapsuleSignatureError, SpecError
from capsule_rollout.capsules.layout import plan_slabs
from capsule_rollout.capsules.trust import Trust

FORMAT_NAME = "capsule-rollout/capsule"
FORMAT_VERSION = 1
MAX_HEADER_BYTES = 64 << 20
FILE_SUFFIX = ".capsule"
# `meta_sha256` (sha256 of the `meta` text) makes damage to identity fields (label, step...) detectable too;
# files written before it existed lack it and are still read.
METADATA_KEYS = frozenset({"format", "format_version", "meta", "meta_sha256", "signature"})
SIGNATURE_SCHEME = "hmac-sha256"


def _key_bytes(key: bytes | str) -> bytes:
    data = key.encode() if isinstance(key, str) else bytes(key)
    if len(data) < 16:
        raise ValueError(f"a capsule key of {len(data)} bytes is too short to sign with: use 16 or more "
                         "(e.g. secrets.token_hex(32))")
    return data


def _signature(key: bytes | str, text: str, tensors: Mapping[str, torch.Tensor]) -> str:
    """HMAC-SHA256 over the format name, the `meta` text and every tensor (name, dtype, shape, bytes)."""
    mac = hmac.new(_key_bytes(key), FORMAT_NAME.encode() + b"\0" + text.encode(), hashlib.sha256)
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        mac.update(b"\0" + json.dumps([name, str(t.dtype), list(t.shape)]).encode() + b"\0")
        mac.update(t.reshape(-1).view(torch.uint8).numpy())  # the bytes in place, not a copy
    return f"{SIGNATURE_SCHEME}:{mac.hexdigest()}"


def capsule_to_bytes(capsule: Capsule, *, annotations: Mapping[str, str] | None = None,
                     key: bytes | str | None = None) -> bytes:
    """Serialize a capsule (digests included) to bytes; signed when a `key` is given. `annotations`: notes kept
    beside it in the signed meta (None: the capsule's own, those it was read with)."""
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
        "annotations": dict(annotations if annotations is not None else capsule.annotations),
    }
    # Views of one slab share storage, which safetensors refuses: save copies.
    tensors = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in capsule.tensors().items()}
    text = json.dumps(payload, allow_nan=False)
    metadata = {"format": FORMAT_NAME, "format_version": str(FORMAT_VERSION), "meta": text,
                "meta_sha256": _meta_sha256(text)}
    if key is not None:
        metadata["signature"] = _signature(key, text, tensors)
    return safetensors.torch.save(tensors, metadata=metadata)


def read_header(data: bytes, source: str = "<bytes>", *, total_size: int | None = None) -> dict[str, Any]:
    """Validate framing, format, version and the tensor table; return the parsed `meta` JSON.

    `data` must hold at least the length prefix and the header; `total_size` is
    the full size of the serialized capsule (default: `len(data)`). Every problem
    is a `CapsuleFormatError` (never a `ValueError`, `OverflowError`...).
    """
    total = len(data) if total_size is None else total_size
    if total < 8 or len(data) < 8:
        raise CapsuleFormatError(f"{source}: {total} bytes is too short to be a capsule (truncated?)")
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER_BYTES:
        raise CapsuleFormatError(
            f"{source}: header of {n} bytes is over the {MAX_HEADER_BYTES}-byte limit: not a capsule this code "
            "wrote (or its length prefix is damaged)"
        )
    if 8 + n > min(total, len(data)):
        raise CapsuleFormatError(
            f"{source}: header claims {n} bytes but only {min(total, len(data)) - 8} follow the length "
            "prefix: the file is truncated or not a capsule"
        )
    header = _strict_json(bytes(data[8 : 8 + n]), source, "the safetensors header")
    meta_block = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(meta_block, dict):
        raise CapsuleFormatError(f"{source}: not a capsule file (no safetensors metadata header)")
    unknown = sorted(set(meta_block) - METADATA_KEYS)
    if unknown:
        raise CapsuleFormatError(f"{source}: unknown entries {unknown} in the capsule header (damaged or not ours)")
    if meta_block.get("format") != FORMAT_NAME:
        raise CapsuleFormatError(f"{source}: format {meta_block.get('format')!r} is not {FORMAT_NAME!r}")
    version = meta_block.get("format_version")
    if version != str(FORMAT_VERSION):
        raise CapsuleFormatError(
            f"{source}: capsule format version {version!r}; this build reads version {FORMAT_VERSION}. "
            "Re-create the capsule with this version of the code."
        )
    text = meta_block.get("meta")
    if not isinstance(text, str):
        raise CapsuleFormatError(f"{source}: capsule metadata is not valid JSON (no 'meta' string)")
    recorded = meta_block.get("meta_sha256")
    if recorded is not None and recorded != _meta_sha256(text):
        raise CapsuleFormatError(
            f"{source}: capsule metadata does not match its sha256: the header was changed after the capsule "
            "was written (a damaged file); take a new snapshot"
        )
    meta = _strict_json(text, source, "capsule metadata")
    if not isinstance(meta, dict):
        raise CapsuleFormatError(f"{source}: capsule metadata is not valid JSON (not an object)")
    end = 8 + n + _tensor_table_end(header, source)
    if end > total:
        raise CapsuleFormatError(f"{source}: tensor data ends at byte {end} but there are only {total}: truncated")
    return meta


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON value")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _strict_json(raw: bytes | str, source: str, what: str) -> Any:
    """JSON as the writer writes it: NaN, Infinity and out-of-range floats are refused."""
    try:
        return json.loads(raw, parse_constant=_no_constant, parse_float=_finite_float)
    except (ValueError, TypeError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise CapsuleFormatError(f"{source}: {what} is not valid JSON ({str(exc)[:200]})") from None


def _meta_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _tensor_table_end(header: dict[str, Any], source: str) -> int:
    """Largest data offset in the safetensors tensor table, after checking every entry's types."""
    end = 0
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if (
            not isinstance(entry.get("dtype") if isinstance(entry, dict) else None, str)
            or not isinstance(shape, list)
            or not all(_is_int(d) and d >= 0 for d in shape)
            or not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(_is_int(o) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise CapsuleFormatError(f"{source}: malformed tensor table entry {str(key)[:80]!r} in the header")
        end = max(end, offsets[1])
    return end


def _require(meta: dict[str, Any], name: str, kinds: tuple[type, ...], source: str) -> Any:
    if name not in meta:
        raise CapsuleFormatError(f"{source}: malformed capsule metadata (no {name!r})")
    value = meta[name]
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        expected = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
        raise CapsuleFormatError(
            f"{source}: malformed capsule metadata ({name!r} is {type(value).__name__}, expected {expected})"
        )
    return value


def _str_map(meta: dict[str, Any], name: str, source: str) -> dict[str, str]:
    value = _require(meta, name, (dict,), source)
    if not all(isinstance(v, str) for v in value.values()):
        raise CapsuleFormatError(f"{source}: malformed capsule metadata ({name!r} values must be strings)")
    return value


def parse_meta(meta: dict[str, Any], source: str = "<bytes>") -> tuple[CapsuleMeta, dict[str, BufferSpec], dict[str, str]]:
    """(identity, specs, digests) from header `meta`, every value checked against what the writer writes."""
    step = _require(meta, "step", (int,), source)
    if step < 0:
        raise CapsuleFormatError(f"{source}: malformed capsule metadata (negative step {step})")
    try:
        created_at = float(_require(meta, "created_at", (int, float), source))
    except OverflowError:
        created_at = math.inf
    if not math.isfinite(created_at):
        raise CapsuleFormatError(f"{source}: malformed capsule metadata ('created_at' out of range)")
    raw_specs = _require(meta, "specs", (dict,), source)
    try:
        specs = {k: BufferSpec.from_json(v) for k, v in raw_specs.items()}
    except SpecError as exc:
        raise CapsuleFormatError(f"{source}: malformed capsule metadata ({exc})") from None
    for key, spec in specs.items():  # keys are "<component>/<buffer name>", as an arena makes them
        component, _, name = key.rpartition("/")
        if not component or "/" in component or name != spec.name:
            raise CapsuleFormatError(
                f"{source}: malformed capsule metadata (spec {key[:80]!r} names buffer {spec.name[:80]!r})"
            )
    capsule_meta = CapsuleMeta(
        capsule_id=_require(meta, "capsule_id", (str,), source),
        label=_require(meta, "label", (str,), source),
        step=step,
        episode=_require(meta, "episode", (str, type(None)), source),
        created_at=created_at,
        fingerprint=MappingProxyType(dict(_str_map(meta, "fingerprint", source))),
        forced=_require(meta, "forced", (bool,), source),
        extra=MappingProxyType(dict(_str_map(meta, "extra", source))),
    )
    return capsule_meta, specs, dict(_str_map(meta, "digests", source))


def capsule_from_bytes(data: bytes, *, source: str = "<bytes>", key: bytes | str | None = None,
                       trust: Trust | str | None = None) -> Capsule:
    """Parse and fully validate a serialized capsule (see module docstring); with a `key`, the file must carry
    a signature made with it over what it holds now (`CapsuleSignatureError` otherwise). The capsule's `trust`
    (`capsules.trust`): `OWN` when verified with a key; without one, `trust` (`DATA` when None: a restore sets
    data only; `CODE`: as powerful as pickle; `OWN`: the caller vouches that it wrote the bytes itself)."""
    level = Trust.OWN if key is not None else Trust.parse(trust) if trust is not None else Trust.DATA
    header = read_header(data, source)
    capsule_meta, specs, digests = parse_meta(header, source)
    annotations = _str_map(header, "annotations", source) if "annotations" in header else {}
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
    capsule = Capsule(capsule_meta, slabs, digests, trust=level)
    capsule.check_integrity(source)
    if key is not None:  # damage is named first (by buffer, above), then tampering; nothing is returned either way
        _verify_signature(data, tensors, key, source)
    # what the writer noted beside it (`save_capsule(annotations=)`: a run's host spec), in the signed meta text
    capsule.annotations = MappingProxyType(annotations)
    return capsule


def _verify_signature(data: bytes, tensors: Mapping[str, torch.Tensor], key: bytes | str, source: str) -> None:
    (n,) = struct.unpack("<Q", data[:8])
    block = json.loads(bytes(data[8 : 8 + n]))["__metadata__"]  # framing checked by read_header already
    recorded = block.get("signature")
    if recorded is None:
        raise CapsuleSignatureError(f"{source}: the capsule is not signed, and a key was given to verify it: "
                                    "refusing it (sign it where it was made: save_capsule(..., key=))")
    if not hmac.compare_digest(str(recorded), _signature(key, block["meta"], tensors)):
        raise CapsuleSignatureError(f"{source}: the capsule's signature does not match this key: it was signed "
                                    "with another key, or changed since it was signed; refusing it")


def _check_tensors(
    tensors: Mapping[str, torch.Tensor], specs: Mapping[str, BufferSpec], digests: Mapping[str, str], source: str
) -> None:
    if set(tensors) != set(specs) or set(digests) != set(specs):
        missing = sorted(set(specs) - set(tensors))
        extra = sorted(set(tensors) - set(specs))
        no_digest = sorted(set(specs) - set(digests))
        raise CapsuleFormatError(
            f"{source}: tensors do not match the declared specs (missing {missing}, undeclared {extra}, "
            f"without digest {no_digest})"
        )
    for key, t in tensors.items():
        spec = specs[key]
        if t.dtype != spec.dtype or tuple(t.shape) != spec.shape:
            stored = f"{DTYPE_NAMES.get(t.dtype, t.dtype)}{list(t.shape)}"
            raise CapsuleFormatError(
                f"{source}: tensor {key!r} is stored as {stored} but its spec says "
                f"{DTYPE_NAMES[spec.dtype]}{list(spec.shape)}: the header's dtype or shape was relabelled "
                "(a damaged file); take a new snapshot"
            )


class _UserKey:
    """The user's key (`capsules.signing_key()`), resolved when a file is written or read."""

    def __repr__(self) -> str:
        return "USER_KEY"


USER_KEY: Any = _UserKey()
"""The default `key` of `save_capsule`, `load_capsule` and `CapsuleStore`: files are signed with, and read only
when signed with, the user's key (`capsules.signing_key`); `key=None` writes an unsigned file, or reads one
without checking its signature (a capsule whose source you trust)."""


def _resolved(key: Any) -> bytes | str | None:
    if key is USER_KEY:
        from capsule_rollout.capsules.signing_key import signing_key

        return signing_key()
    return key


def save_capsule(capsule: Capsule, path: str | os.PathLike, *, annotations: Mapping[str, str] | None = None,
                 key: Any = USER_KEY) -> Path:
    """Write atomically (temp file, fsync, rename), signed with `key` (the user's by default, `USER_KEY`; None:
    unsigned); returns the final path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = capsule_to_bytes(capsule, annotations=annotations, key=_resolved(key))
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


def load_capsule(path: str | os.PathLike, *, key: Any = USER_KEY, trust: Trust | str | None = None) -> Capsule:
    """Read and validate a capsule file; raises CapsuleFormatError / CapsuleIntegrityError, and
    CapsuleSignatureError for a file not signed with `key` (the user's by default, `USER_KEY`; None: the signature
    is not checked, for a capsule whose source you trust, restored at `trust`: `DATA` by default, see
    `capsules.trust` and `capsule_from_bytes`)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CapsuleFormatError(f"{path}: no such capsule file") from None
    return capsule_from_bytes(data, source=str(path), key=_resolved(key), trust=trust)


def nbytes_from_header(meta: dict[str, Any], source: str = "<header>") -> int:
    """Slab bytes a capsule described by header `meta` occupies once loaded."""
    _, specs, _ = parse_meta(meta, source)
    return sum(layout.nbytes for layout in plan_slabs(specs))


def read_file_header(path: str | os.PathLike) -> dict[str, Any]:
    """The `meta` JSON of a capsule file, reading only its header."""
    path = Path(path)
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise CapsuleFormatError(f"{path}: too short to be a capsule (truncated?)")
        (n,) = struct.unpack("<Q", prefix)
        head = prefix + f.read(min(n, MAX_HEADER_BYTES))  # read_header refuses a longer one
    return read_header(head, str(path), total_size=path.stat().st_size)
