"""Damaged variants of a capsule file: what storage faults, bad copies and careless edits make of one.

`variants(data, rng, flips)` yields `(kind, name, bytes)` from the bytes of a valid capsule file:
truncations, single-bit flips anywhere, relabelled dtypes, overlapping offsets, NaN/Infinity and
out-of-range numbers in the header, huge strings, missing tensors, wrong format versions, shapes
changed consistently (tensor and spec agree, digests still match), and a task family edited with the
digests recomputed (only a component's own check can refuse that one). Edits of the metadata
recompute its sha256 where noted, as a deliberate edit would, so the deeper checks are what refuse.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from capsule_rollout.capsules import Capsule, capsule_from_bytes, capsule_to_bytes
from capsule_rollout.capsules.capsule_file import MAX_HEADER_BYTES

Variant = tuple[str, str, bytes]


def split(data: bytes) -> tuple[dict[str, Any], bytes]:
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def join(header: dict[str, Any] | str, body: bytes) -> bytes:
    raw = (header if isinstance(header, str) else json.dumps(header, separators=(",", ":"))).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + body


def edit_meta(data: bytes, edit, *, rehash: bool = True, raw: bool = False) -> bytes:
    """Apply `edit(meta)` to the capsule metadata (`raw`: to its JSON text); `rehash`: recompute its sha256."""
    header, body = split(data)
    block = header["__metadata__"]
    if raw:
        block["meta"] = edit(block["meta"])
    else:
        meta = json.loads(block["meta"])
        edit(meta)
        block["meta"] = json.dumps(meta)  # allow_nan: NaN and Infinity are written as such
    if rehash:
        block["meta_sha256"] = hashlib.sha256(block["meta"].encode("utf-8", "surrogatepass")).hexdigest()
    return join(header, body)


def _tensor_keys(header: dict[str, Any]) -> list[str]:
    return sorted(k for k in header if k != "__metadata__")


def truncations(data: bytes) -> Iterator[Variant]:
    (n,) = struct.unpack("<Q", data[:8])
    cuts = {0, 1, 7, 8, 9, 8 + n // 2, 8 + n - 1, 8 + n, 8 + n + 1, (8 + n + len(data)) // 2, len(data) - 1}
    for cut in sorted(c for c in cuts if 0 <= c < len(data)):
        yield "truncation", f"first {cut} of {len(data)} bytes", data[:cut]


def bit_flips(data: bytes, rng: np.random.Generator, count: int) -> Iterator[Variant]:
    (n,) = struct.unpack("<Q", data[:8])
    # a third in the length prefix and header, the rest anywhere
    positions = list(rng.integers(0, 8 + n, size=count // 3)) + list(rng.integers(0, len(data), size=count - count // 3))
    for pos in positions:
        bit = int(rng.integers(8))
        flipped = bytearray(data)
        flipped[pos] ^= 1 << bit
        yield "bit flip", f"byte {pos} bit {bit}", bytes(flipped)


_SAME_SIZE = {"F32": "I32", "I32": "F32", "F64": "I64", "I64": "F64", "U8": "BOOL", "BOOL": "U8", "I8": "U8",
              "BF16": "F16", "F16": "BF16"}


def relabels(data: bytes) -> Iterator[Variant]:
    header, body = split(data)
    seen = set()
    for key in _tensor_keys(header):
        dtype = header[key]["dtype"]
        if dtype in _SAME_SIZE and dtype not in seen:  # one tensor per dtype
            seen.add(dtype)
            h = json.loads(json.dumps(header))
            h[key]["dtype"] = _SAME_SIZE[dtype]
            yield "relabelled dtype", f"{key} {dtype} -> {_SAME_SIZE[dtype]}", join(h, body)
    key = max(_tensor_keys(header), key=lambda k: len(header[k]["shape"]))
    h = json.loads(json.dumps(header))
    shape = h[key]["shape"]
    h[key]["shape"] = shape[::-1] if len(shape) > 1 and shape != shape[::-1] else [1, *shape]
    yield "relabelled shape", f"{key} {shape} -> {h[key]['shape']}", join(h, body)


def overlapping_offsets(data: bytes) -> Iterator[Variant]:
    header, body = split(data)
    keys = [k for k in _tensor_keys(header) if header[k]["data_offsets"][1] > header[k]["data_offsets"][0]]
    by_start = sorted(keys, key=lambda k: header[k]["data_offsets"][0])
    for a, b in zip(by_start, by_start[1:]):
        (a0, a1), (b0, b1) = header[a]["data_offsets"], header[b]["data_offsets"]
        if b1 - b0 == a1 - a0:  # b made to read a's bytes: same size, so only the overlap is wrong
            h = json.loads(json.dumps(header))
            h[b]["data_offsets"] = [a0, a1]
            yield "overlapping offsets", f"{b} onto {a}", join(h, body)
    first = by_start[0]
    h = json.loads(json.dumps(header))
    s0, s1 = h[first]["data_offsets"]
    h[first]["data_offsets"] = [s0, s1 + 8]  # runs into the next tensor
    yield "overlapping offsets", f"{first} 8 bytes longer", join(h, body)


def non_finite(data: bytes) -> Iterator[Variant]:
    header, body = split(data)
    key = _tensor_keys(header)[0]
    text = json.dumps(header, separators=(",", ":"))
    start, end = header[key]["data_offsets"]
    old = f'"data_offsets":[{start},{end}]'
    for value in ("Infinity", "NaN", "1e400", "-Infinity"):
        damaged = text.replace(old, f'"data_offsets":[{start},{value}]')
        yield "NaN/Infinity in header", f"tensor offset {value}", join(damaged, body)
    meta = json.loads(header["__metadata__"]["meta"])
    spec_key = next(iter(meta["specs"]))

    def setter(path, value):
        def edit(m):
            target = m
            for p in path[:-1]:
                target = target[p]
            target[path[-1]] = value

        return edit

    cases = [(("step",), float("inf")), (("step",), float("nan")), (("created_at",), float("inf")),
             (("specs", spec_key, "shape"), [float("inf")]), (("specs", spec_key, "alignment"), float("nan")),
             (("step",), 1e300), (("step",), -3), (("forced",), "yes"), (("fingerprint",), {"k": float("inf")})]
    for path, value in cases:
        yield "NaN/Infinity in header", f"meta {'.'.join(path)} = {value!r}", edit_meta(data, setter(path, value))


def huge_strings(data: bytes) -> Iterator[Variant]:
    header, body = split(data)
    big = "x" * (MAX_HEADER_BYTES + 64)
    h = json.loads(json.dumps(header))
    h["__metadata__"]["padding"] = big
    yield "huge string", "header over the size limit", join(h, body)
    meta = json.loads(header["__metadata__"]["meta"])
    spec_key = next(iter(meta["specs"]))

    def long_dtype(m):
        m["specs"][spec_key]["dtype"] = "float" * 100_000

    def long_name(m):
        m["specs"][spec_key]["name"] = "n" * 200_000

    def long_fingerprint(m):
        m["fingerprint"][next(iter(m["fingerprint"]))] = "f" * 1_000_000

    for name, edit in (("dtype name", long_dtype), ("buffer name", long_name), ("fingerprint value", long_fingerprint)):
        yield "huge string", f"1e5+ character {name}", edit_meta(data, edit)
    yield "huge string", "1e6 character label, not rehashed", edit_meta(data, lambda m: m.update(label="l" * 1_000_000),
                                                                       rehash=False)


def missing_tensors(data: bytes) -> Iterator[Variant]:
    import safetensors.torch

    header, body = split(data)
    key = _tensor_keys(header)[-1]
    tensors = safetensors.torch.load(data)
    del tensors[key]
    yield "missing tensor", f"{key} gone, still declared", safetensors.torch.save(tensors, header["__metadata__"])
    block = dict(header["__metadata__"])
    meta = json.loads(block["meta"])
    del meta["specs"][key], meta["digests"][key]
    block["meta"] = json.dumps(meta)
    block["meta_sha256"] = hashlib.sha256(block["meta"].encode()).hexdigest()
    yield "missing tensor", f"{key} gone with its spec and digest", safetensors.torch.save(tensors, block)


def wrong_versions(data: bytes) -> Iterator[Variant]:
    header, body = split(data)
    for version in ("0", "2", "99", 1, None):
        h = json.loads(json.dumps(header))
        if version is None:
            del h["__metadata__"]["format_version"]
        else:
            h["__metadata__"]["format_version"] = version
        yield "wrong version", f"format_version {version!r}", join(h, body)
    h = json.loads(json.dumps(header))
    h["__metadata__"]["format"] = "capsule-rollout/checkpoint"
    yield "wrong version", "another format name", join(h, body)


def consistent_shapes(data: bytes) -> Iterator[Variant]:
    """Spec and tensor reshaped alike (same bytes, digests still match): a capsule for some other arena."""
    import safetensors.torch

    header, _ = split(data)
    tensors = safetensors.torch.load(data)
    meta = json.loads(header["__metadata__"]["meta"])
    for key in _tensor_keys(header):
        t = tensors[key]
        if t.dim() >= 1 and t.numel() >= 2 and t.numel() % 2 == 0:
            new_shape = [2, t.numel() // 2] if list(t.shape) != [2, t.numel() // 2] else [t.numel()]
            tensors = {**tensors, key: t.reshape(new_shape).contiguous()}
            meta["specs"][key]["shape"] = new_shape
            block = dict(header["__metadata__"])
            block["meta"] = json.dumps(meta)
            block["meta_sha256"] = hashlib.sha256(block["meta"].encode()).hexdigest()
            yield "consistent shape change", f"{key} {list(t.shape)} -> {new_shape}", safetensors.torch.save(tensors, block)
            return


def edited_family(capsule: Capsule, key: str, family: int, annotations: dict[str, str] | None) -> Iterator[Variant]:
    """The task family changed in the bytes and the digests recomputed: a consistent file of a wrong task."""
    slabs = [(lay, slab.clone()) for lay, slab in capsule.slabs()]
    edited = Capsule(capsule.meta, slabs)
    edited.buffer(key)[0] = family
    yield "edited with digests recomputed", f"{key}[0] = {family}", capsule_to_bytes(edited, annotations=annotations)


def variants(capsule: Capsule, family_key: str, other_family: int, rng: np.random.Generator, flips: int,
             annotations: dict[str, str] | None = None) -> Iterator[Variant]:
    data = capsule_to_bytes(capsule, annotations=annotations)
    assert capsule_from_bytes(data).meta == capsule.meta  # the original is valid
    yield from truncations(data)
    yield from bit_flips(data, rng, flips)
    yield from relabels(data)
    yield from overlapping_offsets(data)
    yield from non_finite(data)
    yield from huge_strings(data)
    yield from missing_tensors(data)
    yield from wrong_versions(data)
    yield from consistent_shapes(data)
    yield from edited_family(capsule, family_key, other_family, annotations)


def same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
