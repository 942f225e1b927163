"""`WebsocketPolicyClient`: a connection to a policy served with openpi's websocket protocol (`openpi_wire`).

An address is `ws://host:port`, `wss://host:port` or `openpi://host:port` (= `ws://`), with options of this
client in its query, removed before connecting (the rest of the query goes to the server, e.g. `seed`):
- `timeout_s` (default 60): the longest wait for an answer (or the metadata) before the episode ends with an
  error; a model that compiles on its first call needs it longer than its inference.
- `connect_timeout_s` (default 10): the handshake's.
- `chunk_length`: the chunk a server answers, for servers whose metadata does not say (this project's
  servers announce it as `action_horizon`; without either the client asks once on a zero observation).
- `keys`: `project` (default: the env's own names) or `openpi` (`observation/state`, `observation/image`,
  `observation/wrist_image`): the names a server that does not announce its keys reads.
Anything but loopback needs a token (`token=`, else `$CAPSULE_ROLLOUT_POLICY_TOKEN`), sent as openpi-client
sends its api key. Every failure is a `RemotePolicyError` naming the server and what happened: no answer in
time, the connection lost, a text frame (the server's error), a frame that is not a message of the protocol.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import numpy as np
import websockets
import websockets.sync.client

from capsule_rollout.policies import openpi_wire as W

SCHEMES = ("ws://", "wss://", "openpi://")
OPTIONS = ("timeout_s", "connect_timeout_s", "chunk_length", "keys")
MAX_ANSWER_BYTES = 64 << 20  # an answer holds a chunk and a few numbers


def is_remote(source: str) -> bool:
    """Whether a policy source names a policy server (`ws://`, `wss://`, `openpi://`)."""
    return source.startswith(SCHEMES)


class RemotePolicyError(RuntimeError):
    """The policy server could not give a chunk (an episode ends with this error, nothing is executed)."""

    stop_reason = "error"


class RemoteActionError(RemotePolicyError):
    """The server answered actions that must not reach the env (non-finite, another shape)."""

    stop_reason = "safety"


@dataclass(frozen=True)
class PolicyAddress:
    """A parsed policy source: where to connect and this client's options."""

    uri: str  # what is connected to (ws:// or wss://, the server's own query kept)
    host: str
    timeout_s: float = 60.0
    connect_timeout_s: float = 10.0
    chunk_length: int | None = None
    keys: str = "project"
    display: str = field(default="", compare=False)  # scheme://host:port, for messages and fingerprints

    @classmethod
    def parse(cls, source: str) -> PolicyAddress:
        if not is_remote(source):
            raise ValueError(f"{source!r} is not a policy server address: give ws://host:port (or wss://, openpi://)")
        parts = urlsplit("ws://" + source[len("openpi://"):] if source.startswith("openpi://") else source)
        if not parts.hostname or parts.port is None:
            raise ValueError(f"policy server address {source!r}: give host and port, e.g. ws://127.0.0.1:8000")
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        ours = {k: query.pop(k) for k in OPTIONS if k in query}
        try:
            address = cls(urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), "")), parts.hostname,
                          float(ours.get("timeout_s", 60.0)), float(ours.get("connect_timeout_s", 10.0)),
                          int(ours["chunk_length"]) if "chunk_length" in ours else None, ours.get("keys", "project"),
                          f"{parts.scheme}://{parts.netloc}")
        except ValueError as exc:
            raise ValueError(f"policy server address {source!r}: {exc} (options: {', '.join(OPTIONS)})") from None
        if not (address.timeout_s > 0 and address.connect_timeout_s > 0) or address.keys not in ("project", "openpi"):
            raise ValueError(f"policy server address {source!r}: timeouts must be > 0 and keys project or openpi")
        if address.chunk_length is not None and address.chunk_length < 1:
            raise ValueError(f"policy server address {source!r}: chunk_length must be >= 1")
        return address


class WebsocketPolicyClient:
    """One connection to a policy server: `metadata` (read on connecting), `infer(request) -> answer`.

    After any failure the connection is closed; `reconnect()` opens a new one (a new session on the server),
    which must announce the same observation and chunk as the first."""

    def __init__(self, source: str, *, token: str | None = None) -> None:
        self.address = PolicyAddress.parse(source)
        self.source = source
        self._token = W.token_from(token)
        if not W.is_loopback(self.address.host) and not self._token:
            raise ValueError(f"policy server {self.address.display} is not on this machine: give a token "
                             f"(${W.TOKEN_ENV} or token=); without one only loopback addresses are used")
        self._ws = None
        self.server_ms: float | None = None  # the server's own time on the last answer (openpi's server_timing)
        self.metadata: dict = self._connect()

    @property
    def connected(self) -> bool:
        return self._ws is not None

    def _fail(self, what: str, cls: type[RemotePolicyError] = RemotePolicyError) -> RemotePolicyError:
        self.close()
        return cls(f"policy server {self.address.display}: {what}")

    def _connect(self) -> dict:
        headers = {W.AUTH_HEADER: f"{W.AUTH_SCHEME} {self._token}"} if self._token else None
        try:  # entered as a context manager (websockets >= 16 asks for that), left in close()
            self._ws = contextlib.ExitStack().enter_context(websockets.sync.client.connect(
                self.address.uri, compression=None, max_size=MAX_ANSWER_BYTES, additional_headers=headers,
                open_timeout=self.address.connect_timeout_s, close_timeout=1.0, proxy=None))
        except (OSError, TimeoutError, websockets.exceptions.WebSocketException) as exc:
            raise RemotePolicyError(f"policy server {self.address.display}: cannot connect "
                                    f"({type(exc).__name__}: {exc})") from None
        metadata = self._receive("its metadata", self.address.connect_timeout_s)
        if not isinstance(metadata, dict):
            raise self._fail(f"its first frame is a {type(metadata).__name__}, not openpi's metadata map")
        return metadata

    def reconnect(self) -> None:
        """A new connection (a new session); refused if the server now serves something else."""
        self.close()
        metadata = self._connect()
        for key in ("observation", "action_horizon", "action_dim"):
            if metadata.get(key) != self.metadata.get(key):
                raise self._fail(f"after reconnecting it announces {key} {metadata.get(key)!r}, not "
                                 f"{self.metadata.get(key)!r} as before: another policy is served there")

    def _receive(self, what: str, timeout_s: float) -> Any:
        try:
            frame = self._ws.recv(timeout=timeout_s)
        except TimeoutError:
            raise self._fail(f"no answer ({what}) within {timeout_s:g} s: the server is stalled or overloaded "
                             "(raise timeout_s in the address for a slow model)") from None
        except websockets.exceptions.ConnectionClosed as exc:
            raise self._fail(f"the connection was lost waiting for {what} ({exc})") from None
        if isinstance(frame, str):
            raise self._fail(f"the server answered an error: {frame.strip()[-2000:]}")
        try:
            return W.decode(frame, max_bytes=MAX_ANSWER_BYTES)
        except W.WireError as exc:
            raise self._fail(f"malformed answer ({what}): {exc}") from None

    def infer(self, request: Mapping[str, Any]) -> dict:
        """Send one observation map; its answer map (holding `actions`)."""
        if self._ws is None:
            raise RemotePolicyError(f"policy server {self.address.display}: not connected (the connection "
                                    "failed earlier in this episode)")
        try:
            self._ws.send(W.encode(request))
        except websockets.exceptions.ConnectionClosed as exc:
            raise self._fail(f"the connection was lost sending an observation ({exc})") from None
        answer = self._receive("an action chunk", self.address.timeout_s)
        if not isinstance(answer, dict) or W.ACTIONS not in answer:
            keys = sorted(answer) if isinstance(answer, dict) else type(answer).__name__
            raise self._fail(f"malformed answer: a map with {W.ACTIONS!r} expected, got {keys}")
        timing = answer.get(W.SERVER_TIMING)
        self.server_ms = timing.get("infer_ms") if isinstance(timing, dict) else None
        return answer

    def close(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            ws.close()


def chunk_of(answer: Mapping[str, Any], shape: tuple[int, int], where: str) -> np.ndarray:
    """The answer's `actions` as float32 `shape` (a leading batch of 1 dropped), every number finite; else
    `RemoteActionError`: such actions never reach an env."""
    actions = answer[W.ACTIONS]
    if not isinstance(actions, np.ndarray) or actions.dtype.kind not in "fiub":
        raise RemoteActionError(f"policy server {where}: actions must be a numeric array, got "
                                f"{type(actions).__name__}{'' if not isinstance(actions, np.ndarray) else actions.dtype}")
    if actions.ndim == 3 and actions.shape[0] == 1:
        actions = actions[0]
    if actions.shape != shape:
        raise RemoteActionError(f"policy server {where}: actions of shape {actions.shape}; this host acts with "
                                f"{shape} (chunk_length x the env's action dimension)")
    with np.errstate(over="ignore", invalid="ignore"):
        chunk = actions.astype(np.float32)
    if not np.isfinite(chunk).all():
        bad = np.argwhere(~np.isfinite(chunk))[0]
        raise RemoteActionError(f"policy server {where}: non-finite action {float(actions[tuple(bad)])!r} at row {bad[0]} "
                                "(as float32); nothing of this chunk is executed")
    return chunk
