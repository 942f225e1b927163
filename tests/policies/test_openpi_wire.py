"""openpi's wire format: what openpi-client packs reads back exactly, and a frame that could build anything but
plain values and numeric arrays (object or void dtypes, a lying shape, extension types, deep nesting, a frame past
the limit) is refused with a `WireError` saying what is wrong."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from capsule_rollout.policies import openpi_wire as W

DTYPES = [np.uint8, np.int32, np.int64, np.float16, np.float32, np.float64, np.bool_]


@given(hnp.arrays(st.sampled_from(DTYPES), hnp.array_shapes(min_dims=0, max_dims=4, max_side=5)))
def test_arrays_read_back_exactly(arr):
    out = W.decode(W.encode({"a": arr, "prompt": "pick", "n": np.float32(1.5)}), max_bytes=1 << 20)
    assert out["a"].dtype == arr.dtype and out["a"].shape == arr.shape
    assert np.array_equal(out["a"], arr, equal_nan=True)
    assert out["prompt"] == "pick" and out["n"] == np.float32(1.5) and isinstance(out["n"], np.float32)


def test_the_format_is_openpis():
    """The map openpi_client.msgpack_numpy builds (keys as bytes, dtype as numpy's string, shape a list)."""
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    raw = msgpack.unpackb(W.encode({"actions": arr}), raw=False)
    assert raw["actions"] == {b"__ndarray__": True, b"data": arr.tobytes(), b"dtype": "<f4", b"shape": [2, 3]}
    theirs = msgpack.packb({"x": {b"__ndarray__": True, b"data": arr.tobytes(), b"dtype": "<f4", b"shape": (2, 3)}})
    assert np.array_equal(W.decode(theirs, max_bytes=1000)["x"], arr)


def _nd(dtype, shape, data):
    return msgpack.packb({"x": {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape}})


@pytest.mark.parametrize("frame, why", [
    (_nd("|O", [1], b"\0" * 8), "dtype '|O'"),  # object pointers: what np.ndarray(buffer=...) would trust
    (_nd("|V8", [1], b"\0" * 8), "dtype '|V8'"),
    (_nd(">f4", [1], b"\0" * 4), "dtype '>f4'"),
    (_nd("<f4", [3], b"\0" * 8), "needs 12 bytes"),
    (_nd("<f4", [-1], b""), "non-negative"),
    (_nd("<f4", [1] * 9, b"\0" * 4), "at most 8"),
    (_nd("<f4", [2], "text"), "needs 8 bytes"),
    (msgpack.packb({"x": {b"__ndarray__": True, b"data": b"", b"dtype": "<f4", b"shape": [0], b"more": 1}}),
     "array map"),
    (msgpack.packb({"x": {b"__npgeneric__": True, b"data": [1], b"dtype": "<f4"}}), "numpy scalar"),
    (msgpack.packb(msgpack.ExtType(1, b"abcd")), "max_ext_len"),
    (b"\x91" * 5000 + b"\xc0", "StackError"),
    (b"\xc1", "FormatError"),
    (msgpack.packb({1: 2}), "map key"),
    (msgpack.packb([1]) + b"\x01", "ExtraData"),
    (b"\xa3\xff\xfe\xfd", "UnicodeDecodeError"),
])
def test_frames_that_are_not_messages_are_refused(frame, why):
    with pytest.raises(W.WireError, match=why.replace("(", r"\(").replace("[", r"\[")):
        W.decode(frame, max_bytes=1 << 20)


def test_a_frame_past_the_limit_is_refused_before_it_is_read():
    with pytest.raises(W.WireError, match="limit is 100"):
        W.decode(W.encode({"x": np.zeros(100, np.uint8)}), max_bytes=100)


def test_what_cannot_be_sent_is_refused():
    for value in (np.array([object()]), np.zeros(2, np.complex64), {1, 2}):
        with pytest.raises(W.WireError):
            W.encode({"x": value})


def test_key_maps_and_loopback():
    keys = ("state", "image_front", "image_wrist")
    assert W.parse_key_map("project", keys) == {k: k for k in keys}
    assert W.parse_key_map("openpi", keys) == {"observation/state": "state", "observation/image": "image_front",
                                               "observation/wrist_image": "image_wrist"}
    assert W.parse_key_map("obs/s=state", keys) == {"obs/s": "state", "image_front": "image_front",
                                                    "image_wrist": "image_wrist"}
    with pytest.raises(ValueError, match="WIRE=KEY"):
        W.parse_key_map("obs/s=stat", keys)
    with pytest.raises(ValueError, match="one wire name"):
        W.parse_key_map("image_wrist=state", keys)
    assert all(map(W.is_loopback, ("127.0.0.1", "127.8.0.1", "::1", "[::1]", "localhost")))
    assert not any(map(W.is_loopback, ("0.0.0.0", "10.0.0.2", "example.org", "::")))
