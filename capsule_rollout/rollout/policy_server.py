"""`PolicyServer`: any policy this project loads, served with openpi's websocket protocol (`policies.openpi_wire`).

    served = serve_spec(RunSpec(env="tabletop:pick_place", policy="checkpoints/policy"))
    with PolicyServer(served, port=8000) as server:   # openpi_client.WebsocketClientPolicy("127.0.0.1", 8000)
        server.wait()

What a client gets, in order: the metadata (`ServedPolicy.metadata`: the observation keys with shapes and
dtypes, the prompt, the chunk), then one answer `{"actions": (T, A) float32, "server_timing": {...}}` per
request. A request is checked against the metadata (exactly its keys, shapes and dtypes, plus `prompt` and
`episode_seed`): a wrong one is answered with one text frame saying what is wrong, then the connection is
closed (code 1008; 1011 when the policy itself raised), as openpi's server closes after an error.

Sessions: each connection is a session with the policy's state of its own (its noise stream, prompt,
conditioning), kept as a capsule of the policy's arena while another session acts. A session starts at the seed
in the URL (`ws://host:port/?seed=N`, default 0) with the policy's `reset(seed)`; a request holding
`episode_seed` starts it over there (a new episode). Requests are served one at a time (one policy). So a
session's chunks are those of the policy in process after `reset(seed)`, fed the same observations and
prompts: bit for bit on the same machine and torch build.
"""

from __future__ import annotations

import hmac
import threading
import time
import traceback
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import numpy as np
import websockets
import websockets.sync.server

from capsule_rollout.capsules import Capsule, restore, snapshot
from capsule_rollout.models.prompt_buffer import PROMPT_BYTES
from capsule_rollout.policies import openpi_wire as W
from capsule_rollout.policies.rollout_policy import LanguageConditioned
from capsule_rollout.rollout.host_factory import BuiltPolicy, RunSpec, build_policy, recorded_acting

PROTOCOL = "openpi-websocket/msgpack-numpy"
SEED_LIMIT = 2**62


class RequestError(ValueError):
    """A request that does not fit the served policy's metadata."""


@dataclass
class Session:
    """One connection's state: the seed its noise stream started at, its policy state while another session
    is live, the prompt last encoded, requests served."""

    seed: int = 0
    started: bool = False
    capsule: Capsule | None = None
    prompt: str | None = None
    requests: int = 0


class ServedPolicy:
    """A built policy (`host_factory.build_policy`) as a server answers for it: metadata, request checks, and
    the chunk of a session's request (one at a time). `keys`: the observation's names on the wire
    (`openpi_wire.parse_key_map`: `project`, `openpi` or `WIRE=KEY,...`)."""

    def __init__(self, built: BuiltPolicy, *, keys: str = "project", description: str = "",
                 acting: dict | None = None) -> None:
        self.policy, self.arena = built.policy, built.arena
        spec = self.policy.spec
        self.wire = W.parse_key_map(keys, spec.observation_keys)  # wire name -> the policy's key
        self.expected = {w: built.arrays[k] for w, k in self.wire.items()}
        self.shape = (spec.chunk_length, spec.action_dim)
        self.language = isinstance(self.policy, LanguageConditioned)
        self.description = description or type(self.policy).__name__
        self.acting = dict(acting or {})
        self.conditioning = built.conditioning
        self.max_request_bytes = sum(a.dtype.itemsize * int(np.prod(a.shape)) for a in self.expected.values()) \
            + 4 * PROMPT_BYTES + (64 << 10)
        self.base = snapshot(self.arena, label="served policy", force=True, digest=False)
        self._live: Session | None = None
        self._lock = threading.Lock()

    def metadata(self) -> dict[str, Any]:
        """What the server sends first: everything a client must send, and what it gets back."""
        T, A = self.shape
        return {
            "server": "capsule_rollout serve_policy", "protocol": PROTOCOL, "policy": self.description,
            "observation": {w: {"key": self.wire[w], "shape": list(a.shape), "dtype": a.dtype.name}
                            for w, a in self.expected.items()},
            "prompt": {"key": W.PROMPT, "used": self.language, "max_bytes": PROMPT_BYTES},
            "actions": {"key": W.ACTIONS, "shape": [T, A], "dtype": "float32"},
            "action_horizon": T, "action_dim": A,
            W.EPISODE_SEED: {"key": W.EPISODE_SEED, "doc": "an int in a request: a new episode's noise stream "
                             "starts at that seed (reset(seed)); the connection's first starts at ?seed= (0)"},
            "conditioning": {"advantage": self.conditioning.advantage, "beta": self.conditioning.beta},
            "acting": self.acting,
        }

    def check(self, request: Any) -> tuple[dict[str, np.ndarray], str | None, int | None]:
        """The policy's observation, the prompt and the episode seed of a request; `RequestError` naming every
        key that is missing, unknown, or of another shape or dtype."""
        if not isinstance(request, dict):
            raise RequestError(f"a request is a map of observation keys, got {type(request).__name__}")
        problems = [f"unknown key {k!r}" for k in request if k not in self.expected and k not in
                    (W.PROMPT, W.EPISODE_SEED)]
        obs = {}
        for wire, spec in self.expected.items():
            value = request.get(wire)
            if value is None:
                problems.append(f"missing {wire!r}")
            elif not isinstance(value, np.ndarray) or value.shape != spec.shape or value.dtype != spec.dtype:
                got = f"{value.shape} {value.dtype}" if isinstance(value, np.ndarray) else type(value).__name__
                problems.append(f"{wire!r} is {got}, expected {spec.shape} {spec.dtype}")
            else:
                obs[self.wire[wire]] = value
        prompt, seed = request.get(W.PROMPT), request.get(W.EPISODE_SEED)
        if prompt is not None and (not isinstance(prompt, str) or len(prompt.encode()) > PROMPT_BYTES):
            problems.append(f"{W.PROMPT!r} must be text of at most {PROMPT_BYTES} bytes")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < SEED_LIMIT):
            problems.append(f"{W.EPISODE_SEED!r} must be an int in [0, 2**62), got {seed!r}")
        if problems:
            raise RequestError("; ".join(problems) + f" (the metadata names the request: keys "
                               f"{sorted(self.expected)}, optional {W.PROMPT!r} and {W.EPISODE_SEED!r})")
        return obs, prompt, seed

    def infer(self, session: Session, obs: dict[str, np.ndarray], prompt: str | None, seed: int | None) -> np.ndarray:
        """The chunk `(T, A)` float32 for a session's checked request."""
        with self._lock:
            if seed is not None:
                session.seed, session.started = seed, False
            self._activate(session)
            if self.language and prompt is not None and prompt != session.prompt:
                self.policy.set_language(prompt)
                session.prompt = prompt
            self.policy.load_observation(obs)
            chunk = self.policy.act().detach().reshape(self.shape).cpu().numpy().astype(np.float32, copy=True)
            session.requests += 1
            return chunk

    def _activate(self, session: Session) -> None:
        """Make the policy's state the session's (keeping the live one's as a capsule)."""
        if self._live is not None and self._live is not session:
            self._live.capsule = snapshot(self.arena, label="session", force=True, digest=False)
        if not session.started:  # a new episode: the policy as built, its noise at the session's seed
            restore(self.arena, self.base)
            self.policy.reset(session.seed)
            session.started, session.prompt, session.capsule = True, None, None
        elif self._live is not session:
            restore(self.arena, session.capsule)
        self._live = session

    def end(self, session: Session) -> None:
        with self._lock:
            if self._live is session:
                self._live = None


def serve_spec(spec: RunSpec, *, keys: str = "project") -> ServedPolicy:
    """The spec's policy (checkpoint or factory, conditioning as the spec resolves it), ready to serve."""
    acting = recorded_acting(spec.policy)
    return ServedPolicy(build_policy(spec), keys=keys, description=spec.policy,
                        acting={"n_exec": spec.host.n_exec, **({"noise_scale": spec.noise_scale}
                                                                if "noise_scale" in acting else {})})


class PolicyServer:
    """A websocket server of a `ServedPolicy` on a thread of its own (a context manager). Binds `host`
    (127.0.0.1 by default; anything else needs `token`, which clients send as openpi-client sends its api key:
    `Authorization: Api-Key <token>`); port 0 picks a free one (`port`). `GET /healthz` answers 200."""

    def __init__(self, served: ServedPolicy, *, host: str = "127.0.0.1", port: int = 0, token: str = "",
                 max_connections: int = 8) -> None:
        if not W.is_loopback(host) and not token:
            raise ValueError(f"binding {host!r} serves the policy beyond this machine: give a token (--token or "
                             f"${W.TOKEN_ENV}); clients send it as openpi-client's api_key")
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        self.served, self.token, self.max_connections = served, token, max_connections
        self.counts = {"connections": 0, "requests": 0, "bad_requests": 0, "policy_errors": 0, "refused": 0}
        self._active = 0
        self._count_lock = threading.Lock()
        self._metadata = W.encode(served.metadata())
        self._server = websockets.sync.server.serve(
            self._handle, host, port, process_request=self._admit, compression=None,
            max_size=served.max_request_bytes, open_timeout=10, close_timeout=2)
        self.host, self.port = host, self._server.socket.getsockname()[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="policy-server", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"ws://{self.host}:{self.port}"

    def __enter__(self) -> PolicyServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._server.shutdown()
        self._thread.join(timeout=10)

    def wait(self, seconds: float | None = None) -> None:
        """Serve until `seconds` have passed (None: until the thread ends, e.g. Ctrl-C in the caller)."""
        self._thread.join(timeout=seconds)

    def _bump(self, key: str, n: int = 1) -> None:
        with self._count_lock:
            self.counts[key] += n

    def _admit(self, connection, request):
        if request.path == "/healthz":
            return connection.respond(HTTPStatus.OK, "OK\n")
        try:
            url_seed(request.path)
        except ValueError as exc:
            return connection.respond(HTTPStatus.BAD_REQUEST, f"{exc}\n")
        if self.token:
            given = request.headers.get(W.AUTH_HEADER, "")
            if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"),
                                       f"{W.AUTH_SCHEME} {self.token}".encode()):
                self._bump("refused")
                time.sleep(0.25)  # slows guessing down (this connection's thread only)
                return connection.respond(HTTPStatus.UNAUTHORIZED, f"a token is required: send "
                                          f"'{W.AUTH_HEADER}: {W.AUTH_SCHEME} <token>' (openpi-client's api_key)\n")
        with self._count_lock:
            if self._active >= self.max_connections:
                self.counts["refused"] += 1
                return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE,
                                          f"{self.max_connections} clients are connected already\n")
            self._active += 1
        return None

    def _handle(self, ws) -> None:
        session = Session(seed=url_seed(ws.request.path))
        self._bump("connections")
        try:
            ws.send(self._metadata)
            while True:
                if not self._serve_one(ws, session):
                    break
        except websockets.exceptions.ConnectionClosed:
            pass
        finally:
            self.served.end(session)
            with self._count_lock:
                self._active -= 1

    def _serve_one(self, ws, session: Session) -> bool:
        """One request and its answer; False when the connection is over."""
        frame = ws.recv()
        try:
            if isinstance(frame, str):
                raise RequestError("a text frame is not a request: send the observation as a msgpack binary frame")
            obs, prompt, seed = self.served.check(W.decode(frame, max_bytes=self.served.max_request_bytes))
        except (W.WireError, RequestError) as exc:
            self._bump("bad_requests")
            return _refuse(ws, f"bad request: {exc}", 1008)
        t0 = time.perf_counter()
        try:
            chunk = self.served.infer(session, obs, prompt, seed)
        except Exception as exc:  # the policy's own error: its text to the client, as openpi's server does
            self._bump("policy_errors")
            return _refuse(ws, f"the policy raised {type(exc).__name__}: {exc}\n{traceback.format_exc()}", 1011)
        ws.send(W.encode({W.ACTIONS: chunk, W.SERVER_TIMING: {"infer_ms": (time.perf_counter() - t0) * 1e3}}))
        self._bump("requests")
        return True


def _refuse(ws, text: str, code: int) -> bool:
    ws.send(text)
    ws.close(code, text.splitlines()[0].encode()[:120].decode(errors="ignore"))
    return False


def url_seed(path: str) -> int:
    """The `seed` in a request path's query (0 when none); ValueError for one that is not in [0, 2**62)."""
    value = dict(parse_qsl(urlsplit(path).query)).get("seed", "0")
    seed = int(value) if value.isdigit() else -1
    if not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"seed {value!r} in the URL: give an integer in [0, 2**62)")
    return seed


