"""Robot bridge wire protocol, version 2: length-prefixed frames of JSON plus raw array bytes.

Never pickle: a frame can only ever decode to a JSON object and numpy arrays of a
few plain dtypes. Every frame is

    offset  size  field
    0       4     magic b"CRBP"
    4       2     protocol version (uint16, little-endian; this module speaks 2)
    6       2     reserved, 0
    8       4     header length H (uint32 LE), 1 .. MAX_HEADER
    12      4     payload length P (uint32 LE), 0 .. max_payload
    16      H     header: UTF-8 JSON object
                    {"type": str, "seq": int, "fields": {...},
                     "arrays": [{"name": str, "dtype": str, "shape": [int, ...]}, ...]}
    16+H    P     payload: the arrays' bytes, C order, little-endian, back to back
                  in the order listed (their sizes must add up to P exactly)

Message types (client = rollout side, server = robot side):

    client -> server                         server -> client
                                             challenge   {nonce}: the server's first frame, as it accepts
    hello      {proof, client}               welcome     {robot, control_hz, cameras, state_dim, image_shape,
                                                          operator, teleop} + action_low/high arrays
    observe    {}                            observation {instruction, subtask, subtask_id, step, success,
                                                          episode_state[, operator_events]}
                                                         + image_<camera> (H, W, 3) uint8, state (S,) float32
    action     + action (A,) float32         action_ack  {clipped, safe_stop, reason} + sent (A,) float32
    reset      {seed}                        reset_done  {instruction, task, subtasks}
    teleop     {}                            teleop_action + action (A,) float32: the operator's device
                                                         (leader arm; the scripted expert in sim)
    estop      {}                            estop_ack   {}
    heartbeat  {t}                           heartbeat_ack {t}
    bye        {}                            error       {code, message, fatal[, unheard]}

The hello is a challenge-response, so that the shared token never crosses the wire and a recorded hello is
worth nothing: the server opens every connection with `challenge`, a fresh random `nonce` (NONCE_BYTES, hex),
and the client's hello carries `proof` = HMAC-SHA256(key: the token, UTF-8; message: nonce + HELLO_CONTEXT),
hex (`hello_proof`, `hello_message`). The server compares it in constant time; a hello replayed on another
connection meets another nonce and is a wrong token. A server without a token checks no proof. A hello that
still carries a `token` field (protocol 1 sent the token itself) is refused at once, unchecked, with the fix.
What this does not give: secrecy or integrity after the hello (the frames are plain TCP: an on-path attacker
can still read or hijack a session; tunnel it, e.g. SSH or WireGuard, beyond a trusted network), nor
protection of a weak token from a guess tested offline against a recorded challenge and proof: use a long
random token (`secrets.token_urlsafe(32)`).

`teleop` says the robot side has a teleoperation device; `operator` that it reads operator input of its
own, whose events since the last observation come in `operator_events` (`kind` or `coach:TEXT`, the kinds of
`robot_side.operator_input.Kind`). `sent` is what the robot took: clipped, rate-limited, and as the hardware clipped it
further. Fields a side does not know are ignored.

Counts are bounded: a header is at most MAX_HEADER bytes, a payload max_payload, a frame carries at most
MAX_ARRAYS arrays of at most MAX_DIMS dimensions each under 2**31, and `seq` and a reset's `seed` are below
2**63 (MAX_INT).

The header is strict JSON: NaN and Infinity are refused like any other malformed
header. A frame that cannot be decoded is answered with an `error` frame (its
`code` one of `ERROR_CODES`); the server then drops the connection if the stream
can no longer be trusted (`fatal`), and always before hello. `unheard` (true when present): the server
closed the connection before reading anything it sent (its pool of connections yet to say hello was full), so
nothing was done and the client should connect again.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

MAGIC = b"CRBP"
VERSION = 2  # 2: the hello proves the token over the server's challenge (1 sent the token itself)
PREFIX = struct.Struct("<4sHHII")
PREFIX_BYTES = PREFIX.size  # 16
MAX_HEADER = 64 * 1024
MAX_PAYLOAD = 64 * 1024 * 1024
MAX_ARRAYS = 32
MAX_DIMS = 8
MAX_INT = 2**63  # `seq` and a reset's `seed` are below it
NONCE_BYTES = 32  # the challenge's nonce: fresh for every connection
HELLO_CONTEXT = b"capsule_rollout robot bridge hello, protocol 2"  # what the proof is for: never a proof elsewhere
PROOF_CHARS = 2 * hashlib.sha256().digest_size  # a proof is the HMAC's hex digest
DTYPES = ("uint8", "int32", "int64", "float32", "float64", "bool")

CLIENT_TYPES = ("hello", "observe", "action", "reset", "teleop", "estop", "heartbeat", "bye")
SERVER_TYPES = ("challenge", "welcome", "observation", "action_ack", "reset_done", "teleop_action", "estop_ack",
                "heartbeat_ack", "error")
TYPES = CLIENT_TYPES + SERVER_TYPES

ERROR_CODES = (
    "bad_magic",  # not this protocol: fatal
    "bad_version",  # another protocol version: fatal, the message says which side to upgrade
    "oversized",  # header or payload over the limits: fatal (the stream cannot be skipped safely)
    "truncated",  # the connection ended mid-frame
    "bad_header",  # header not a JSON object of the documented shape
    "bad_array",  # an array spec that does not match the payload
    "unknown_type",  # a message type this side does not handle
    "unauthorized",  # a wrong or missing proof of the token (answered after a per-address backoff), a plaintext
    #                 token (protocol 1's hello), or a message before hello
    "unsafe_action",  # a NaN/inf action: the robot holds (safe stop)
    "heartbeat_timeout",  # the client went quiet: the robot holds, the episode is aborted
    "not_ready",  # e.g. an action before reset, or after another client's episode ended
    "robot_fault",  # the robot side failed to carry out a request
    "busy",  # another client controls the robot, or the server is full: fatal, try again later
    "frame_timeout",  # a frame did not arrive in full in time: fatal
    "idle_timeout",  # no frame for the server's idle limit, or no hello in its time: the connection is closed
)


class ProtocolError(Exception):
    """A frame that breaks the protocol; `code` is one of ERROR_CODES."""

    def __init__(self, code: str, message: str, *, fatal: bool = False) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.fatal = code, message, fatal


class ConnectionClosed(Exception):
    """The peer closed the connection at a frame boundary."""


@dataclass
class Message:
    type: str
    fields: dict = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    seq: int = 0


def encode(msg: Message, *, max_payload: int = MAX_PAYLOAD) -> bytes:
    """One frame for `msg` (its arrays are converted to little-endian C order)."""
    if msg.type not in TYPES:
        raise ValueError(f"unknown message type {msg.type!r}; known: {TYPES}")
    specs, chunks = [], []
    for name, arr in msg.arrays.items():
        a = np.asarray(arr)
        if a.dtype.name not in DTYPES:
            raise ValueError(f"array {name!r} has dtype {a.dtype}; the protocol carries {DTYPES}")
        a = a.astype(a.dtype.newbyteorder("<"), order="C", copy=False)  # keeps 0-d arrays 0-d
        specs.append({"name": name, "dtype": a.dtype.name, "shape": list(a.shape)})
        chunks.append(a.tobytes())
    header = json.dumps({"type": msg.type, "seq": int(msg.seq), "fields": msg.fields, "arrays": specs},
                        allow_nan=False, separators=(",", ":")).encode()
    payload = b"".join(chunks)
    if len(header) > MAX_HEADER or len(payload) > max_payload:
        raise ValueError(f"message too large (header {len(header)} B, payload {len(payload)} B)")
    return PREFIX.pack(MAGIC, VERSION, 0, len(header), len(payload)) + header + payload


def parse_prefix(prefix: bytes, *, max_payload: int = MAX_PAYLOAD, peer: str = "peer") -> tuple[int, int]:
    """(header length, payload length) from the 16-byte prefix, or ProtocolError; `peer` names the other side
    in the error that says which side to upgrade ("client", "robot side")."""
    if len(prefix) < PREFIX_BYTES:
        raise ProtocolError("truncated", f"frame prefix is {len(prefix)} of {PREFIX_BYTES} bytes")
    magic, version, reserved, h_len, p_len = PREFIX.unpack(prefix[:PREFIX_BYTES])
    if magic != MAGIC:
        raise ProtocolError("bad_magic", f"frame starts with {magic!r}, expected {MAGIC!r}", fatal=True)
    if version != VERSION:
        raise ProtocolError("bad_version", version_advice(version, peer), fatal=True)
    if reserved != 0:
        raise ProtocolError("bad_header", f"reserved prefix field is {reserved}, must be 0", fatal=True)
    if not 1 <= h_len <= MAX_HEADER:
        raise ProtocolError("oversized", f"header length {h_len} outside 1..{MAX_HEADER}", fatal=True)
    if p_len > max_payload:
        raise ProtocolError("oversized", f"payload length {p_len} over the limit {max_payload}", fatal=True)
    return h_len, p_len


def decode(frame: bytes, *, max_payload: int = MAX_PAYLOAD) -> Message:
    """The message in one complete frame, or ProtocolError (never anything else)."""
    h_len, p_len = parse_prefix(frame, max_payload=max_payload)
    if len(frame) != PREFIX_BYTES + h_len + p_len:
        raise ProtocolError("truncated" if len(frame) < PREFIX_BYTES + h_len + p_len else "bad_header",
                            f"frame is {len(frame)} bytes, its prefix announces {PREFIX_BYTES + h_len + p_len}")
    return decode_body(frame[PREFIX_BYTES:PREFIX_BYTES + h_len], frame[PREFIX_BYTES + h_len:])


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def decode_body(header_bytes: bytes, payload: bytes) -> Message:
    try:  # strict JSON, as `encode` writes it: no NaN or Infinity (they could not be echoed back)
        header = json.loads(header_bytes.decode("utf-8"), parse_constant=_no_constant, parse_float=_finite_float)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ProtocolError("bad_header", "header is not UTF-8 JSON (NaN and Infinity are not JSON)") from None
    if not isinstance(header, dict):
        raise ProtocolError("bad_header", "header must be a JSON object")
    mtype, seq = header.get("type"), header.get("seq", 0)
    fields, specs = header.get("fields", {}), header.get("arrays", [])
    if not isinstance(mtype, str):
        raise ProtocolError("bad_header", "header needs a string 'type'")
    if mtype not in TYPES:
        raise ProtocolError("unknown_type", f"message type {mtype[:40]!r} is not part of protocol v{VERSION}")
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < MAX_INT:
        raise ProtocolError("bad_header", "'seq' must be a non-negative integer")
    if not isinstance(fields, dict):
        raise ProtocolError("bad_header", "'fields' must be a JSON object")
    if not isinstance(specs, list) or len(specs) > MAX_ARRAYS:
        raise ProtocolError("bad_header", f"'arrays' must be a list of at most {MAX_ARRAYS} specs")
    arrays: dict[str, np.ndarray] = {}
    offset = 0
    for spec in specs:
        if not isinstance(spec, dict) or set(spec) != {"name", "dtype", "shape"}:
            raise ProtocolError("bad_array", "each array spec is {name, dtype, shape}")
        name, dtype, shape = spec["name"], spec["dtype"], spec["shape"]
        if not isinstance(name, str) or not name or name in arrays:
            raise ProtocolError("bad_array", "array names must be unique non-empty strings")
        if dtype not in DTYPES:
            raise ProtocolError("bad_array", f"array {name[:40]!r}: dtype {str(dtype)[:20]!r} not in {DTYPES}")
        if (not isinstance(shape, list) or len(shape) > MAX_DIMS
                or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**31 for d in shape)):
            raise ProtocolError("bad_array", f"array {name[:40]!r}: shape must be a list of at most {MAX_DIMS} sizes")
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize  # Python ints: no overflow
        if offset + nbytes > len(payload):
            raise ProtocolError("bad_array", f"array {name[:40]!r} runs past the payload ({len(payload)} bytes)")
        arrays[name] = np.frombuffer(payload, dtype=np.dtype(dtype).newbyteorder("<"), count=nbytes //
                                     np.dtype(dtype).itemsize, offset=offset).reshape(tuple(shape)).copy()
        offset += nbytes
    if offset != len(payload):
        raise ProtocolError("bad_array", f"arrays take {offset} bytes, the payload has {len(payload)}")
    return Message(mtype, fields, arrays, seq)


def read_frame(recv_exactly: Callable[[int], bytes], *, max_payload: int = MAX_PAYLOAD, peer: str = "peer") -> Message:
    """Read and decode one frame; `recv_exactly(n)` returns n bytes, fewer only at end of stream.

    Raises ConnectionClosed on a clean end before the frame, ProtocolError otherwise.
    """
    prefix = recv_exactly(PREFIX_BYTES)
    if not prefix:
        raise ConnectionClosed("peer closed the connection")
    h_len, p_len = parse_prefix(prefix, max_payload=max_payload, peer=peer)
    body = recv_exactly(h_len + p_len)
    if len(body) < h_len + p_len:
        raise ProtocolError("truncated", f"connection ended {h_len + p_len - len(body)} bytes before the frame's end")
    return decode_body(body[:h_len], body[h_len:])


def error_message(code: str, message: str, *, fatal: bool = False, seq: int = 0, unheard: bool = False) -> Message:
    """An error frame. `unheard`: the connection is closed before anything it sent was read (a full admission pool
    made room): nothing was done, and connecting again at once is what a client should do."""
    if code not in ERROR_CODES:
        raise ValueError(f"unknown error code {code!r}")
    fields = {"code": code, "message": message[:500], "fatal": fatal}
    if unheard:
        fields["unheard"] = True
    return Message("error", fields, {}, seq)


def require_fields(msg: Message, spec: Mapping[str, type]) -> None:
    """Check that `msg.fields` has each named field of the given type (ProtocolError otherwise)."""
    for name, kind in spec.items():
        value = msg.fields.get(name)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ProtocolError("bad_header", f"{msg.type} needs field {name!r} of type {kind.__name__}")


def version_advice(theirs: int, peer: str = "peer") -> str:
    """What a frame of protocol `theirs` is told: which side speaks what, and which to upgrade."""
    older = f"the {peer}" if theirs < VERSION else "this side"
    why = (" (since protocol 2 the hello proves the token over the server's challenge: the token no longer "
           "travels)") if theirs < 2 <= VERSION else ""
    return f"this side speaks protocol {VERSION}, the {peer} protocol {theirs}: upgrade {older}{why}"


def hello_proof(token: str, nonce: bytes) -> str:
    """The hello's proof that the client knows `token`, for this connection's `nonce` only (hex HMAC-SHA256)."""
    key = token.encode("utf-8", "surrogatepass")
    return hmac.new(key, nonce + HELLO_CONTEXT, hashlib.sha256).hexdigest()


def proof_matches(proof: object, token: str, nonce: bytes) -> bool:
    """Whether a hello's `proof` field is the proof of `token` for `nonce`, compared in constant time."""
    return (isinstance(proof, str) and len(proof) == PROOF_CHARS and proof.isascii()
            and hmac.compare_digest(proof, hello_proof(token, nonce)))


def challenge_message(nonce: bytes) -> Message:
    """The server's first frame on a connection: the nonce its hello must prove the token over."""
    return Message("challenge", {"nonce": nonce.hex()})


def challenge_nonce(msg: Message) -> bytes:
    """The nonce of a `challenge` (ProtocolError unless it is one, with a nonce of NONCE_BYTES)."""
    if msg.type != "challenge":
        raise ProtocolError("bad_header", f"the robot side's first frame is {msg.type!r}, not a challenge: it "
                            f"speaks an older protocol than {VERSION}; upgrade the robot side")
    nonce = msg.fields.get("nonce")
    if not isinstance(nonce, str) or len(nonce) != 2 * NONCE_BYTES:
        raise ProtocolError("bad_header", f"a challenge's nonce is {NONCE_BYTES} bytes in hex")
    try:
        return bytes.fromhex(nonce)
    except ValueError:
        raise ProtocolError("bad_header", f"a challenge's nonce is {NONCE_BYTES} bytes in hex") from None


def hello_message(challenge: Message, token: str, *, client: str = "rollout", seq: int = 0) -> Message:
    """The hello that answers `challenge`: a proof of `token` over its nonce (the token itself is not sent)."""
    return Message("hello", {"proof": hello_proof(token, challenge_nonce(challenge)), "client": client}, {}, seq)
