"""`RemotePolicy`: a rollout policy that acts through a policy server (openpi's websocket protocol).

    policy = connect_remote_policy("ws://127.0.0.1:8000", action_dim=7, arrays={"state": ((9,), "float32"), ...})

Each chunk is the server's answer to the observation (the keys it reads, under the names it announces or the
address's `keys`) and the prompt. Its state is on the server, so it cannot be captured: the capsule holds only
the episode's seed, how many chunks the episode has asked for, and the prompt; the fingerprint says
`capturable: no`. A capsule of an episode's start (no chunk asked yet) restores: the next request carries the
episode's seed (`episode_seed`, for a server that announces it: this project's restart the policy's noise
stream there, so an episode is a function of its seed as in process). A capsule taken later is refused by
`check_restore`: the server has moved on and cannot be put back. Branch values therefore refuse such a host,
and `replay` plays the recorded actions instead (`RecordedChunks`: same component, same capsule).

An answer whose actions are not a finite `(T, A)` array, a lost connection, a stalled server or a malformed
frame raise `RemotePolicyError` (`RemoteActionError`, stop reason `safety`, for the actions) from `act()`:
the episode ends there and nothing of that chunk reaches the env.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np
import torch

from capsule_rollout.capsules import BufferComponent, BufferSpec, Role
from capsule_rollout.models.inputs import require_keys
from capsule_rollout.models.prompt_buffer import prompt_specs, read_prompt, write_prompt
from capsule_rollout.policies import openpi_wire as W
from capsule_rollout.policies.rollout_policy import PolicySpec
from capsule_rollout.policies.websocket_policy_client import (
    RemoteActionError,
    RemotePolicyError,
    WebsocketPolicyClient,
    chunk_of,
)

KIND = "remote_policy"
NOT_CAPTURABLE = "no: its state is on the policy server"
Arrays = Mapping[str, tuple[tuple[int, ...], str]]  # observation key -> (shape, dtype name)


class ChunkSource(Protocol):
    def chunk(self, obs: dict[str, np.ndarray], prompt: str | None, seed: int, first: bool) -> np.ndarray:
        """The chunk `(T, A)` float32, finite, for `obs`; `first`: the episode's first request (seed `seed`)."""
        ...

    def close(self) -> None: ...


class ServerChunks:
    """Chunks from a server over a `WebsocketPolicyClient`; `wire`: wire key -> observation key."""

    def __init__(self, client: WebsocketPolicyClient, wire: Mapping[str, str], shape: tuple[int, int]) -> None:
        self.client, self.wire, self.shape = client, dict(wire), shape
        self.takes_seed = W.EPISODE_SEED in client.metadata

    def chunk(self, obs: dict[str, np.ndarray], prompt: str | None, seed: int, first: bool) -> np.ndarray:
        if not self.client.connected and first:  # lost in an earlier episode: this one starts a new session
            self.client.reconnect()
        request: dict[str, Any] = {wire: obs[key] for wire, key in self.wire.items()}
        if prompt is not None:
            request[W.PROMPT] = prompt
        if first and self.takes_seed:
            request[W.EPISODE_SEED] = int(seed)
        answer = self.client.infer(request)
        try:
            return chunk_of(answer, self.shape, self.client.address.display)
        except RemoteActionError:
            self.client.close()  # the episode ends here; the next one opens a new session
            raise

    def close(self) -> None:
        self.client.close()


class RecordedChunks:
    """A recorded episode's proposed actions as the chunks (for `replay`): the chunk asked for at control step t
    is rows t.. of `policy_actions` `(L, A)` (NaN rows, steps no policy acted, as 0; past the end, 0). At step L
    (an episode that ended asking for a chunk) it raises as the recording ended: `stop_reason`."""

    def __init__(self, policy_actions: np.ndarray, steps: Callable[[], int], chunk_length: int,
                 stop_reason: str) -> None:
        actions = np.nan_to_num(np.asarray(policy_actions, np.float32), nan=0.0)
        self.rows = np.concatenate([actions, np.zeros((chunk_length, actions.shape[1]), np.float32)])
        self.length, self.steps, self.chunk_length, self.stop_reason = len(actions), steps, chunk_length, stop_reason

    def chunk(self, obs: dict[str, np.ndarray], prompt: str | None, seed: int, first: bool) -> np.ndarray:
        t = self.steps()
        if t >= self.length:
            cls = RemoteActionError if self.stop_reason == RemoteActionError.stop_reason else RemotePolicyError
            raise cls(f"the recording ends at step {self.length} ({self.stop_reason}): the policy server gave no "
                      "chunk there")
        return self.rows[t: t + self.chunk_length]

    def close(self) -> None:
        return None


class RemotePolicy(BufferComponent):
    """The rollout protocol's policy over a `ChunkSource` (see the module docstring)."""

    capturable = False

    def __init__(self, spec: PolicySpec, source: ChunkSource, *, server: str, wire: Mapping[str, str],
                 served: str = "", image_size: int | None = None, name: str = "policy") -> None:
        super().__init__()
        self.spec, self.source, self.name, self.server = spec, source, name, server
        self.device = torch.device("cpu")
        self.image_size = image_size
        self._obs: dict[str, np.ndarray] = {}
        self._fingerprint = {"kind": KIND, "capturable": NOT_CAPTURABLE, "server": server, "served": served,
                             "chunk": f"{spec.chunk_length}x{spec.action_dim}", "reads": ",".join(spec.observation_keys),
                             "wire": ",".join(f"{w}={k}" for w, k in wire.items()), "images": str(image_size or "")}

    @classmethod
    def from_fingerprint(cls, fingerprint: Mapping[str, str], source: ChunkSource, name: str = "policy") -> RemotePolicy:
        """The policy a capsule's fingerprint (its `policy.*` keys, prefix removed) describes, over `source`
        (replay: `RecordedChunks`); its fingerprint is the capsule's."""
        chunk_length, action_dim = (int(n) for n in fingerprint["chunk"].split("x"))
        wire = dict(pair.split("=", 1) for pair in fingerprint["wire"].split(",") if pair)
        images = fingerprint.get("images", "")
        return cls(PolicySpec(chunk_length, action_dim, tuple(filter(None, fingerprint["reads"].split(",")))), source,
                   server=fingerprint["server"], wire=wire, served=fingerprint.get("served", ""),
                   image_size=int(images) if images else None, name=name)

    def buffer_specs(self) -> list[BufferSpec]:
        T, A = self.spec.chunk_length, self.spec.action_dim
        return [BufferSpec("session", (2,), torch.int64, "cpu", doc="episode seed, chunks asked in this episode"),
                *prompt_specs(),
                BufferSpec("chunk", (T, A), torch.float32, "cpu", Role.IO)]

    def fingerprint(self) -> Mapping[str, str]:
        return self._fingerprint

    def reset(self, episode_seed: int) -> None:
        self.buffers["session"].copy_(torch.tensor([int(episode_seed), 0]))

    def set_language(self, text: str) -> None:
        write_prompt(self.buffers, text, "a RemotePolicy")

    @property
    def prompt(self) -> str | None:
        return read_prompt(self.buffers)

    @property
    def chunks_asked(self) -> int:
        """Chunks asked for in the current episode (0: at its start, where a capsule still restores)."""
        return int(self.buffers["session"][1])

    def load_observation(self, obs: Mapping[str, Any]) -> None:
        require_keys(obs, self.spec.observation_keys, "policy")
        self._obs = {k: np.ascontiguousarray(obs[k]) for k in self.spec.observation_keys}

    def act(self) -> torch.Tensor:
        """The server's chunk `(T, A)` for the loaded observation and prompt (raises `RemotePolicyError`)."""
        session = self.buffers["session"]
        chunk = self.source.chunk(self._obs, self.prompt, int(session[0]), int(session[1]) == 0)
        session[1] += 1
        self.buffers["chunk"].copy_(torch.from_numpy(np.ascontiguousarray(chunk)))
        return self.buffers["chunk"]

    def check_restore(self, view: Mapping[str, torch.Tensor]) -> None:
        asked = int(view["session"][1])
        if asked:
            raise ValueError(
                f"the policy acts through the policy server {self.server}, whose state no capsule holds: this "
                f"capsule was taken after {asked} chunk(s) of its episode, and the server cannot be put back there. "
                "Only an episode's initial capsule restores; a recorded episode replays its recorded actions "
                "(replay), and branch values need a policy in process")

    def close(self) -> None:
        self.source.close()


def connect_remote_policy(source: str, *, action_dim: int, arrays: Arrays, token: str | None = None,
                          client: WebsocketPolicyClient | None = None) -> RemotePolicy:
    """A `RemotePolicy` on a server, sized from its metadata (keys, chunk) and the env (`action_dim`, `arrays`:
    the observation keys it gives with their shapes and dtypes); a mismatch is a `ValueError` naming both."""
    client = client if client is not None else WebsocketPolicyClient(source, token=token)
    meta, where = client.metadata, client.address.display
    announced = meta.get("observation")
    if isinstance(announced, dict):
        wire = {}
        for key_on_wire, entry in announced.items():
            key = entry.get("key", key_on_wire) if isinstance(entry, dict) else key_on_wire
            if key not in arrays:
                raise ValueError(f"the policy served at {where} reads {key!r}; the env gives {sorted(arrays)}")
            want = (tuple(entry.get("shape", ())), str(entry.get("dtype", "")))
            if (tuple(arrays[key][0]), str(arrays[key][1])) != want:
                raise ValueError(f"the policy served at {where} reads {key!r} as {want}; the env gives "
                                 f"{(tuple(arrays[key][0]), str(arrays[key][1]))}")
            wire[key_on_wire] = key
    else:  # a server that does not say: every key the env gives, under the address's names
        wire = W.parse_key_map(client.address.keys, tuple(arrays))
    length = meta.get("action_horizon") if isinstance(meta.get("action_horizon"), int) else client.address.chunk_length
    if "action_dim" in meta and meta["action_dim"] != action_dim:
        raise ValueError(f"the policy served at {where} acts with {meta['action_dim']} numbers; the env's action "
                         f"space has {action_dim}")
    if not length:
        length = _probe_chunk_length(client, wire, arrays)
    images = [shape[0] for key, (shape, _) in arrays.items() if key in wire.values() and key.startswith("image_")]
    served = meta.get("policy") if isinstance(meta.get("policy"), str) else "an openpi server"
    spec = PolicySpec(int(length), action_dim, tuple(wire.values()))
    return RemotePolicy(spec, ServerChunks(client, wire, (int(length), action_dim)), server=where, wire=wire,
                        served=served, image_size=max(images) if images else None)


def _probe_chunk_length(client: WebsocketPolicyClient, wire: Mapping[str, str], arrays: Arrays) -> int:
    """Ask once on a zero observation (a server that announces no chunk and an address without chunk_length)."""
    answer = client.infer({w: np.zeros(arrays[k][0], arrays[k][1]) for w, k in wire.items()})
    actions = answer[W.ACTIONS]
    if not isinstance(actions, np.ndarray) or actions.ndim not in (2, 3):
        raise RemotePolicyError(f"policy server {client.address.display}: actions of a probe are "
                                f"{getattr(actions, 'shape', type(actions).__name__)}, not a chunk (T, A)")
    return int(actions.shape[-2])
