"""A fuzzer for the robot bridge: sessions of broken, hostile and valid frames against a live server.

`CheckedSimBackend` is the sim robot with a tripwire on its actuators: every action the server
applies is checked (finite, inside the bounds, within the rate limit of the previous one, only
during a running episode). `session(rng)` is one connection's worth of frames (bytes to send, in
order), drawn from the kinds below; `run_session` sends them and drains the replies; `health_check`
is what a proper client must still be able to do.
"""

from __future__ import annotations

import json
import socket
import time

import numpy as np

from capsule_rollout.envs.robot_bridge import RobotClient, RobotServer
from capsule_rollout.robot_side.protocol import MAX_ARRAYS, MAX_HEADER, PREFIX, VERSION, Message, encode
from capsule_rollout.tabletop.sim_robot import SimBackend

CLIENT_TIMEOUT_S = 5.0  # RobotClient's default: a client waits this long for any reply


class CheckedSimBackend(SimBackend):
    """The tabletop sim robot; `bad` lists every action that should never have reached it."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.server: RobotServer | None = None
        self.applied, self.bad = 0, []
        self._prev: np.ndarray | None = None

    def reset(self, seed):
        self._prev = None
        return super().reset(seed)

    def apply(self, action: np.ndarray) -> None:
        a = np.asarray(action)
        problems = []
        if a.shape != self.action_low.shape or a.dtype != np.float32:
            problems.append(f"shape {a.shape} dtype {a.dtype}")
        else:
            if not np.all(np.isfinite(a)):
                problems.append("not finite")
            elif np.any(a < self.action_low) or np.any(a > self.action_high):
                problems.append("out of bounds")
            elif self._prev is not None and np.any(np.abs(a - self._prev) > self.server.max_rate + 1e-6):
                problems.append("over the rate limit")
        if self.server is not None and self.server.episode_state != "running":
            problems.append(f"applied while the episode is {self.server.episode_state}")
        if problems:
            self.bad.append((a.tolist(), problems))
        self.applied += 1
        self._prev = a.astype(np.float32) if a.shape == self.action_low.shape else None
        super().apply(action)


def checked_server(**kw) -> RobotServer:
    backend = CheckedSimBackend(cameras=("front",), image_size=16)
    kw.setdefault("max_rate", np.array([1.0, 1.0, 1.0, 2.0]))  # motion limited to half its range per step
    server = RobotServer(backend, **kw)
    backend.server = server
    return server


# -- frames --------------------------------------------------------------------------------------

def _raw_header(header: dict | str, payload: bytes = b"", *, h_len: int | None = None, p_len: int | None = None,
                magic: bytes = b"CRBP", version: int = VERSION) -> bytes:
    raw = header.encode() if isinstance(header, str) else json.dumps(header).encode()  # allow_nan: NaN as is
    return PREFIX.pack(magic, version, 0, len(raw) if h_len is None else h_len,
                       len(payload) if p_len is None else p_len) + raw + payload


def _pick(rng: np.random.Generator, options: list):
    return options[int(rng.integers(len(options)))]


def _action_values(rng: np.random.Generator) -> np.ndarray:
    pick = rng.integers(6)
    if pick == 0:
        return rng.uniform(-1, 1, 4).astype(np.float32)
    if pick == 1:
        return (rng.uniform(-1, 1, 4) * 10 ** rng.uniform(0, 30)).astype(np.float32)  # huge
    if pick == 2:
        a = rng.uniform(-1, 1, 4).astype(np.float32)
        a[rng.integers(4)] = rng.choice([np.nan, np.inf, -np.inf])
        return a
    if pick == 3:
        return np.full(4, rng.choice([-1.0, 1.0]), np.float32)  # a full swing from the last one
    if pick == 4:
        return np.array([np.float32(rng.choice([3.4e38, -3.4e38, 1e-45, 0.0])) for _ in range(4)], np.float32)
    return rng.uniform(-1, 1, 4).astype(np.float32)


def _valid(rng: np.random.Generator) -> Message:
    kind = rng.choice(["reset", "action", "action", "action", "observe", "heartbeat", "teleop", "estop"],
                      p=[0.1, 0.25, 0.2, 0.1, 0.1, 0.1, 0.1, 0.05])
    if kind == "reset":
        return Message("reset", {"seed": int(rng.integers(1000))})
    if kind == "action":
        return Message("action", {}, {"action": _action_values(rng)})
    if kind == "heartbeat":
        return Message("heartbeat", {"t": float(rng.normal())})
    return Message(str(kind))


def _hostile(rng: np.random.Generator) -> bytes:
    """One frame that breaks the protocol or its rules (some in ways that end the connection)."""
    kind = int(rng.integers(14))
    if kind == 0:
        return rng.bytes(int(rng.integers(1, 300)))
    if kind == 1:  # a valid frame with a few bytes changed
        frame = bytearray(encode(_valid(rng)))
        for _ in range(int(rng.integers(1, 4))):
            frame[int(rng.integers(len(frame)))] = int(rng.integers(256))
        return bytes(frame)
    if kind == 2:
        return _raw_header({"type": "observe", "seq": 1}, h_len=MAX_HEADER + 1)
    if kind == 3:
        return _raw_header({"type": "observe", "seq": 1}, p_len=2**32 - 1)
    if kind == 4:
        return _raw_header({"type": "observe", "seq": 1}, version=int(rng.integers(2, 65535)))
    if kind == 5:
        return _raw_header({"type": "observe", "seq": 1}, magic=rng.bytes(4))
    if kind == 6:
        value = rng.choice(["NaN", "Infinity", "-Infinity", "1e999"])
        kind_ = rng.choice(["heartbeat", "reset", "action"])
        template = '{"type":"%s","seq":3,"fields":{"t":%s,"seed":%s},"arrays":[]}'  # JSON braces: % reads better
        return _raw_header(template % (kind_, value, value))  # noqa: UP031
    if kind == 7:  # arrays that lie about their size, shape or dtype
        specs = [{"name": "action", "dtype": str(rng.choice(["float32", "float64", "int64", "uint8", "bool"])),
                  "shape": [int(d) for d in rng.integers(0, 6, size=int(rng.integers(0, 3)))]}]
        payload = rng.bytes(int(rng.integers(0, 40)))
        return _raw_header({"type": "action", "seq": 2, "fields": {}, "arrays": specs}, payload)
    if kind == 8:
        specs = [{"name": f"a{i}", "dtype": "uint8", "shape": [1]} for i in range(MAX_ARRAYS + 1)]
        return _raw_header({"type": "action", "seq": 2, "fields": {}, "arrays": specs}, bytes(MAX_ARRAYS + 1))
    if kind == 9:
        seed = _pick(rng, [-1, "7", 1e30, True, [1], {"a": 1}, 2**70])
        return _raw_header({"type": "reset", "seq": 2, "fields": {"seed": seed}, "arrays": []})
    if kind == 10:
        t = _pick(rng, ["x", [], {"a": [1, 2]}, True, 2**80, None])
        return _raw_header({"type": "heartbeat", "seq": 2, "fields": {"t": t}, "arrays": []})
    if kind == 11:
        return _raw_header({"type": str(rng.choice(["welcome", "error", "observation", "dance", ""])), "seq": 5})
    if kind == 12:  # deep nesting
        depth = int(rng.integers(100, 5000))
        return _raw_header('{"type":"observe","seq":1,"fields":' + "[" * depth + "]" * depth + "}")
    return encode(_valid(rng))[: int(rng.integers(1, 20))]  # truncated: the connection then ends mid-frame


def session(rng: np.random.Generator) -> list[bytes]:
    """One connection's frames: usually a hello (and a reset) first, then a mix of valid and hostile frames."""
    frames: list[bytes] = []
    if rng.random() < 0.85:
        token = _pick(rng, ["", "", "", "t\u00f6ken", "x" * int(rng.integers(1, 2000)), 17, None])
        frames.append(encode(Message("hello", {"token": token, "client": "fuzz"})))
        if rng.random() < 0.7:
            frames.append(encode(Message("reset", {"seed": int(rng.integers(1000))})))
    for _ in range(int(rng.integers(1, 16))):
        frames.append(encode(_valid(rng)) if rng.random() < 0.6 else _hostile(rng))
    if rng.random() < 0.3:
        frames.append(encode(Message("bye")))
    return frames


def actuator_session(rng: np.random.Generator, actions: int = 30) -> list[bytes]:
    """Hello, reset, then extreme actions (huge, NaN/inf, full swings, denormals), a reset after each
    non-finite one (it safe-stops the robot)."""
    frames = [encode(Message("hello", {"token": ""})), encode(Message("reset", {"seed": int(rng.integers(1000))}))]
    for _ in range(actions):
        action = _action_values(rng)
        frames.append(encode(Message("action", {}, {"action": action})))
        if not np.all(np.isfinite(action)):
            frames.append(encode(Message("reset", {"seed": int(rng.integers(1000))})))
    return frames


def run_session(address, frames: list[bytes], *, deadline_s: float = 10.0) -> int:
    """Send the frames (reading the answer to each, when one comes), then close as a polite client does
    (shut down writing, read to the end); returns how many frames were sent."""
    sent = 0
    try:
        with socket.create_connection(address, timeout=2.0) as sock:
            end = time.monotonic() + deadline_s
            for frame in frames:
                try:
                    sock.sendall(frame)
                except OSError:  # the server closed the connection (a fatal error frame came first)
                    break
                sent += 1
                if not _drain(sock, first_wait=0.2):
                    break
                if time.monotonic() > end:
                    break
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            sock.settimeout(3.0)
            while sock.recv(1 << 20):
                pass
    except OSError:
        pass
    return sent


def _drain(sock: socket.socket, first_wait: float) -> bool:
    """Read what the server sent (waiting up to `first_wait` for the first bytes); False at end of stream."""
    sock.settimeout(first_wait)
    try:
        while True:
            if not sock.recv(1 << 20):
                return False
            sock.settimeout(0.002)
    except TimeoutError:
        return True
    except OSError:
        return False


def time_to_first_reply(address, *, timeout_s: float = CLIENT_TIMEOUT_S) -> tuple[float, str]:
    """How long a proper client waits for its hello's answer, and what it was ('welcome', an error code,
    or 'no reply' after `timeout_s`)."""
    from capsule_rollout.envs.robot_bridge import RobotDisconnected, RobotError

    start = time.monotonic()
    try:
        client = RobotClient(*address, timeout_s=timeout_s, heartbeat_s=None)
    except RobotError as exc:
        return time.monotonic() - start, exc.code
    except RobotDisconnected:
        return time.monotonic() - start, "no reply"
    waited = time.monotonic() - start
    client.close()
    return waited, "welcome"


def health_check(server: RobotServer, *, token: str = "") -> tuple[bool, float]:
    """The server threads run and a proper client can reset, observe and act; (ok, seconds to welcome)."""
    if not server.alive:
        return False, float("inf")
    start = time.monotonic()
    try:
        with RobotClient(*server.address, token=token, timeout_s=CLIENT_TIMEOUT_S) as robot:
            waited = time.monotonic() - start
            robot.reset_to_initial(seed=1)
            obs, info = robot.observe()
            sent = robot.send_action(np.zeros(4, np.float32))
            ok = obs["image_front"].shape == (16, 16, 3) and info["episode_state"] == "running" and sent.shape == (4,)
            return ok, waited
    except Exception:  # noqa: BLE001 - a failed health check is the result
        return False, time.monotonic() - start
