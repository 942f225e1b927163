"""openpi's websocket policy protocol, as bytes: msgpack with numpy arrays, both directions, bounded.

The protocol (what `openpi_client.WebsocketClientPolicy` speaks): the server sends one binary frame, its
metadata (a map), as soon as the websocket opens; then each binary frame from the client is an observation
map (`state`, images, `prompt`...) and each answer a map holding `actions` `(T, A)`; a text frame from the
server is an error (the client raises with its text). An array travels as a map `{b"__ndarray__": True,
b"data": raw bytes, b"dtype": numpy's dtype string, b"shape": [...]}`, a numpy scalar as `{b"__npgeneric__":
True, b"data": value, b"dtype": ...}`. openpi-client sends `Authorization: Api-Key <key>` when given an
`api_key`; that header carries this project's token.

Nothing here is pickle, and decoding never builds anything but plain values and numeric arrays: a dtype
outside `DTYPES` (object, void, structured, big-endian...), a shape that does not match its bytes, more than
`MAX_DIMS` dimensions, a msgpack extension type, or a frame over the caller's byte limit is a `WireError`.
"""

from __future__ import annotations

import ipaddress
import math
import os
from collections.abc import Mapping
from typing import Any

import msgpack
import numpy as np

ACTIONS = "actions"
"""The chunk `(T, A)` in an answer."""
PROMPT = "prompt"
"""The instruction or subtask text in a request."""
EPISODE_SEED = "episode_seed"
"""Optional request key (this project's servers announce it in their metadata): start a new episode's noise
stream at this seed before answering (openpi clients have no reset message)."""
SERVER_TIMING = "server_timing"
"""openpi's servers add `{"infer_ms": ...}` to each answer."""
TOKEN_ENV = "CAPSULE_ROLLOUT_POLICY_TOKEN"
"""Where a client or server finds the shared token when none is passed."""
AUTH_HEADER = "Authorization"
AUTH_SCHEME = "Api-Key"
DTYPES = frozenset({"|b1", "|u1", "|i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8", "<f2", "<f4", "<f8"})
"""The dtypes an array may have on the wire (numpy's `dtype.str`, little-endian)."""
MAX_DIMS = 8
_ND, _NG = b"__ndarray__", b"__npgeneric__"
_ND_KEYS = frozenset({_ND, b"data", b"dtype", b"shape"})
_NG_KEYS = frozenset({_NG, b"data", b"dtype"})


class WireError(ValueError):
    """A frame that is not a message of the protocol (or is past a limit); says what is wrong."""


def _pack(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        if obj.dtype.str not in DTYPES:
            raise WireError(f"an array of dtype {obj.dtype} cannot be sent (numeric and bool only)")
        return {_ND: True, b"data": np.ascontiguousarray(obj).tobytes(), b"dtype": obj.dtype.str,
                b"shape": list(obj.shape)}
    if isinstance(obj, np.generic):
        if obj.dtype.str not in DTYPES:
            raise WireError(f"a scalar of dtype {obj.dtype} cannot be sent (numeric and bool only)")
        return {_NG: True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise WireError(f"a {type(obj).__name__} cannot be sent (plain values, maps, lists and numpy arrays only)")


def encode(message: Mapping[str, Any]) -> bytes:
    """One binary frame: `message` as msgpack, its arrays in openpi's numpy format."""
    return msgpack.packb(message, default=_pack, use_bin_type=True)


def _dtype(name: Any) -> np.dtype:
    if isinstance(name, bytes):
        name = name.decode("ascii", "replace")
    if not isinstance(name, str) or name not in DTYPES:
        raise WireError(f"array dtype {name!r} is not one this protocol carries ({', '.join(sorted(DTYPES))})")
    return np.dtype(name)


def _unpack(obj: dict) -> Any:
    if _ND in obj:
        if set(obj) != _ND_KEYS:
            raise WireError(f"an array map holds {sorted(map(repr, obj))}; expected {sorted(map(repr, _ND_KEYS))}")
        dtype, shape, data = _dtype(obj[b"dtype"]), obj[b"shape"], obj[b"data"]
        if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(
                isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
            raise WireError(f"array shape {shape!r}: at most {MAX_DIMS} non-negative integers")
        if not isinstance(data, bytes) or len(data) != math.prod(shape) * dtype.itemsize:
            size = len(data) if isinstance(data, bytes) else type(data).__name__
            raise WireError(f"array of shape {shape} and dtype {dtype} needs {math.prod(shape) * dtype.itemsize} "
                            f"bytes; the frame holds {size}")
        return np.frombuffer(bytearray(data), dtype=dtype).reshape(shape)  # writable: a policy may write its inputs
    if _NG in obj:
        if set(obj) != _NG_KEYS or not isinstance(obj[b"data"], bool | int | float):
            raise WireError("a numpy scalar map must hold __npgeneric__, data (a number) and dtype")
        try:
            return _dtype(obj[b"dtype"]).type(obj[b"data"])
        except OverflowError as exc:
            raise WireError(f"numpy scalar: {exc}") from None
    return obj


def decode(frame: bytes, *, max_bytes: int) -> Any:
    """The message in a binary frame (maps, lists, plain values, numeric arrays); `WireError` otherwise."""
    if not isinstance(frame, bytes | bytearray | memoryview):
        raise WireError(f"expected a binary frame, got {type(frame).__name__}")
    if len(frame) > max_bytes:
        raise WireError(f"a frame of {len(frame)} bytes; the limit is {max_bytes}")
    try:
        return msgpack.unpackb(frame, object_hook=_unpack, raw=False, strict_map_key=True, max_ext_len=0)
    except WireError:
        raise
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise WireError(f"not a msgpack message of this protocol ({why})") from None


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def token_from(given: str | None) -> str:
    """The token to use: `given`, else `$CAPSULE_ROLLOUT_POLICY_TOKEN`, else empty."""
    return given if given else os.environ.get(TOKEN_ENV, "")


def parse_key_map(keys: str, policy_keys: tuple[str, ...]) -> dict[str, str]:
    """Wire key -> the policy's key. `keys`: `project` (the policy's own names), `openpi` (openpi's example
    clients' names: `observation/state`, `observation/image` for the first camera, `observation/wrist_image` for
    the second), or explicit pairs `WIRE=KEY,WIRE=KEY` (keys the pairs leave out keep their names)."""
    if keys == "project":
        return {k: k for k in policy_keys}
    if keys == "openpi":
        images = [k for k in policy_keys if k.startswith("image_")]
        if len(images) > 2:
            raise ValueError(f"--keys openpi names two cameras (observation/image, observation/wrist_image); the "
                             f"policy reads {images}: give the map as WIRE=KEY pairs")
        named = {"state": "observation/state", **dict(zip(images, ("observation/image", "observation/wrist_image")))}
        return {named.get(k, k): k for k in policy_keys}
    pairs = {}
    for pair in filter(None, (p.strip() for p in keys.split(","))):
        wire, sep, key = pair.partition("=")
        if not sep or not wire or key not in policy_keys:
            raise ValueError(f"key map entry {pair!r}: give WIRE=KEY with KEY one of {list(policy_keys)} (or "
                             "--keys project / openpi)")
        pairs[key] = wire
    mapped = {pairs.get(k, k): k for k in policy_keys}
    if len(mapped) != len(policy_keys):
        raise ValueError(f"key map {keys!r} gives two of the policy's keys one wire name")
    return mapped
