"""Robot bridge protocol v2: round trip of every message, the challenge-response hello, version errors that say
which side to upgrade, and fuzzing of broken frames."""

import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from capsule_rollout.robot_side.protocol import (
    ERROR_CODES,
    MAX_HEADER,
    NONCE_BYTES,
    PREFIX,
    TYPES,
    VERSION,
    ConnectionClosed,
    Message,
    ProtocolError,
    challenge_message,
    challenge_nonce,
    decode,
    encode,
    error_message,
    hello_message,
    hello_proof,
    proof_matches,
    read_frame,
)

EXAMPLES = {
    "challenge": challenge_message(bytes(range(NONCE_BYTES))),
    "hello": Message("hello", {"proof": "ab" * 32, "client": "rollout-host"}),
    "welcome": Message("welcome", {"robot": "sim-tabletop", "control_hz": 10, "cameras": ["front"]},
                       {"action_low": -np.ones(4, np.float32), "action_high": np.ones(4, np.float32)}),
    "observe": Message("observe", {}, {}, seq=3),
    "observation": Message("observation", {"instruction": "put the red block on the blue pad", "subtask": "pick",
                                           "subtask_id": 0, "step": 7, "success": False},
                           {"image_front": np.arange(64 * 64 * 3, dtype=np.uint8).reshape(64, 64, 3) % 251,
                            "state": np.linspace(-1, 1, 8).astype(np.float32)}),
    "action": Message("action", {}, {"action": np.array([0.5, -1.5, 0.0, 1.0], np.float32)}, seq=9),
    "action_ack": Message("action_ack", {"clipped": True, "safe_stop": False, "reason": ""},
                          {"sent": np.array([0.5, -1.0, 0.0, 1.0], np.float32)}),
    "reset": Message("reset", {"seed": 1000000}),
    "reset_done": Message("reset_done", {"instruction": "stack the green block on the red one", "task": "stack",
                                         "subtasks": ["pick up the green block", "put it on the red block"]}),
    "teleop": Message("teleop"),
    "teleop_action": Message("teleop_action", {}, {"action": np.array([0.1, 0.2, -0.3, 1.0], np.float32)}),
    "estop": Message("estop"),
    "estop_ack": Message("estop_ack"),
    "heartbeat": Message("heartbeat", {"t": 12.5}),
    "heartbeat_ack": Message("heartbeat_ack", {"t": 12.5}),
    "bye": Message("bye"),
    "error": error_message("unsafe_action", "action has NaN", fatal=False, seq=4),
}


def test_every_message_type_round_trips():
    assert set(EXAMPLES) == set(TYPES)
    for name, msg in EXAMPLES.items():
        back = decode(encode(msg))
        assert (back.type, back.seq, back.fields) == (msg.type, msg.seq, msg.fields), name
        assert set(back.arrays) == set(msg.arrays)
        for key, arr in msg.arrays.items():
            assert back.arrays[key].dtype == arr.dtype and np.array_equal(back.arrays[key], arr), (name, key)


def test_other_dtypes_scalars_and_big_endian_arrays():
    arrays = {"b": np.array([True, False]), "i": np.array([[1, -2]], np.int32), "l": np.array(7, np.int64),
              "d": np.array([1.5], dtype=">f8"), "e": np.zeros((0, 3), np.float32)}
    back = decode(encode(Message("observation", {}, arrays)))
    for k, v in arrays.items():
        assert np.array_equal(back.arrays[k], v) and back.arrays[k].shape == v.shape


def test_encoding_refuses_what_the_protocol_cannot_carry():
    with pytest.raises(ValueError, match="unknown message type"):
        encode(Message("teleport"))
    with pytest.raises(ValueError, match="dtype"):
        encode(Message("action", {}, {"action": np.zeros(4, np.float16)}))
    with pytest.raises(ValueError):
        encode(Message("heartbeat", {"t": float("nan")}))  # strict JSON
    with pytest.raises(ValueError, match="unknown error code"):
        error_message("oops", "x")


def _frame(header: bytes, payload: bytes = b"", *, version=VERSION, magic=b"CRBP") -> bytes:
    return PREFIX.pack(magic, version, 0, len(header), len(payload)) + header + payload


@pytest.mark.parametrize("frame, code", [
    (_frame(b'{"type":"observe"}', magic=b"HTTP"), "bad_magic"),
    (_frame(b'{"type":"observe"}', version=1), "bad_version"),
    (_frame(b'{"type":"observe"}', version=VERSION + 1), "bad_version"),
    (PREFIX.pack(b"CRBP", VERSION, 0, MAX_HEADER + 1, 0), "oversized"),
    (PREFIX.pack(b"CRBP", VERSION, 0, 10, 2**31), "oversized"),
    (_frame(b'{"type":"observe"}')[:-3], "truncated"),
    (b"CRBP\x01", "truncated"),
    (_frame(b"\xff\xfe"), "bad_header"),
    (_frame(b"[1, 2]"), "bad_header"),
    (_frame(b'{"type":"observe","seq":-1}'), "bad_header"),
    (_frame(b'{"type":"launch"}'), "unknown_type"),
    (_frame(b'{"type":"action","arrays":[{"name":"a","dtype":"float32","shape":[4]}]}', b"\0" * 8), "bad_array"),
    (_frame(b'{"type":"action","arrays":[{"name":"a","dtype":"float32","shape":[1]}]}', b"\0" * 8), "bad_array"),
    (_frame(b'{"type":"action","arrays":[{"name":"a","dtype":"object","shape":[1]}]}', b"\0" * 8), "bad_array"),
    (_frame(b'{"type":"action","arrays":[{"name":"a","dtype":"uint8","shape":[2147483647,2147483647,'
            b'2147483647,2147483647]}]}', b"\0"), "bad_array"),
])
def test_broken_frames_get_the_documented_error_codes(frame, code):
    with pytest.raises(ProtocolError) as info:
        decode(frame, max_payload=2**20)
    assert info.value.code == code and code in ERROR_CODES


@given(st.binary(max_size=512))
def test_random_bytes_only_ever_raise_protocol_errors(data):
    try:
        decode(data)
    except ProtocolError:
        pass


@given(st.sampled_from(sorted(EXAMPLES)), st.data())
def test_mutated_and_truncated_frames_only_ever_raise_protocol_errors(name, data):
    frame = bytearray(encode(EXAMPLES[name]))
    for _ in range(data.draw(st.integers(0, 4))):
        i = data.draw(st.integers(0, len(frame) - 1))
        frame[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(frame)))
    try:
        decode(bytes(frame[:cut]))
    except ProtocolError:
        pass


def test_read_frame_from_a_stream():
    stream = bytearray(encode(EXAMPLES["action"]) + encode(EXAMPLES["heartbeat"]))

    def recv_exactly(n):
        chunk = bytes(stream[:n])
        del stream[:n]
        return chunk

    assert read_frame(recv_exactly).type == "action"
    assert read_frame(recv_exactly).fields == {"t": 12.5}
    with pytest.raises(ConnectionClosed):
        read_frame(recv_exactly)
    stream.extend(encode(EXAMPLES["observation"])[:100])
    with pytest.raises(ProtocolError, match="truncated"):
        read_frame(recv_exactly)
    assert struct.calcsize("<4sHHII") == 16


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_non_finite_numbers_in_a_header_are_bad_headers(value):
    header = ('{"type":"heartbeat","seq":1,"fields":{"t":%s},"arrays":[]}' % value).encode()  # noqa: UP031 - JSON braces
    with pytest.raises(ProtocolError) as info:
        decode(PREFIX.pack(b"CRBP", VERSION, 0, len(header), 0) + header)
    assert info.value.code == "bad_header" and not info.value.fatal


def test_the_hello_proves_the_token_over_the_challenge_without_carrying_it():
    nonce, other = bytes(range(NONCE_BYTES)), bytes(NONCE_BYTES)
    challenge = decode(encode(challenge_message(nonce)))
    assert challenge.type == "challenge" and challenge_nonce(challenge) == nonce
    hello = hello_message(challenge, "s3cret-t0ken", client="host", seq=1)
    frame = encode(hello)
    assert b"s3cret-t0ken" not in frame and set(hello.fields) == {"proof", "client"} and hello.seq == 1
    proof = decode(frame).fields["proof"]
    assert proof_matches(proof, "s3cret-t0ken", nonce)
    assert not proof_matches(proof, "s3cret-t0ken", other)  # a recorded hello is worth nothing on another connection
    assert not proof_matches(proof, "s3cret-t0ke", nonce) and not proof_matches(proof, "", nonce)
    assert hello_proof("t\u00f6ken", nonce) != hello_proof("token", nonce)  # the token's UTF-8 bytes are the key
    for bad in (None, 17, "", proof[:-1], proof.upper() if proof != proof.upper() else "0" * 64, "\u00e9" * 64):
        assert not proof_matches(bad, "s3cret-t0ken", nonce), bad


@pytest.mark.parametrize("msg", [
    Message("welcome"),
    Message("challenge", {"nonce": "ab" * (NONCE_BYTES - 1)}),
    Message("challenge", {"nonce": "zz" * NONCE_BYTES}),
    Message("challenge", {"nonce": 12}),
])
def test_a_first_frame_that_is_no_challenge_is_a_clear_error(msg):
    with pytest.raises(ProtocolError) as info:
        challenge_nonce(msg)
    assert info.value.code == "bad_header"
    if msg.type == "welcome":
        assert "upgrade the robot side" in info.value.message


def test_a_version_mismatch_says_which_side_to_upgrade():
    old = PREFIX.pack(b"CRBP", 1, 0, 10, 0)
    with pytest.raises(ProtocolError, match="upgrade the client") as info:
        read_frame(lambda n: old[:n], peer="client")
    assert f"speaks protocol {VERSION}" in info.value.message and "token no longer travels" in info.value.message
    newer = PREFIX.pack(b"CRBP", VERSION + 1, 0, 10, 0)
    with pytest.raises(ProtocolError, match="upgrade this side") as info:
        read_frame(lambda n: newer[:n], peer="robot side")
    assert info.value.code == "bad_version"
