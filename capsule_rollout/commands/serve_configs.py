"""Config of `serve_policy`, a policy served over openpi's websocket protocol (standard library only: the CLI
stays fast)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from capsule_rollout.commands.registry import command
from capsule_rollout.learning.options import FAMILIES, SHIPPED_POLICY, Acting


@command(
    "serve_policy",
    "Serve a policy (checkpoint or factory, RECAP conditioning included) over openpi's websocket protocol.",
)
@dataclass(frozen=True)
class ServePolicyConfig:
    ALIASES: ClassVar[dict[str, str]] = {"advantage": "act.advantage", "beta": "act.beta", "n_exec": "act.n_exec"}

    policy: str = SHIPPED_POLICY
    """What to serve: a policy checkpoint (the example's flow policy, a RECAP one, a `TorchPolicy`...) or a
    factory's import path `package.module:make_policy` (an `infer(obs)` object, a LeRobot policy wrapped so)."""
    env: str = ""
    """The env the policy acts in (`suite:task` or `package.module:make_env`): it sizes the policy (observation
    keys, shapes, dtypes, action dimension) as a host would; empty: the tabletop --family."""
    family: FAMILIES = "pick_place"
    """Tabletop family (without --env)."""
    act: Acting = Acting()
    """How the policy acts: RECAP conditioning (a RECAP checkpoint: what it records), noise scale; --act.n_exec
    is announced to clients (`acting` in the metadata; sim_rollout takes it as its default)."""
    host: str = "127.0.0.1"
    """Address to bind (anything but loopback needs a token)."""
    port: int = 8000
    """Port to listen on (0: a free one, printed)."""
    token: str = ""
    """Shared token clients must send (`Authorization: Api-Key <token>`: openpi-client's api_key); empty:
    $CAPSULE_ROLLOUT_POLICY_TOKEN, if set."""
    keys: str = "project"
    """Observation names on the wire: project (`state`, `image_<camera>`), openpi (`observation/state`,
    `observation/image`, `observation/wrist_image`), or pairs WIRE=KEY,WIRE=KEY. The metadata names them."""
    max_connections: int = 8
    """Clients connected at once (each a session with the policy's state of its own); more are refused (503)."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where the policy runs."""
    threads: int = 1
    """torch threads."""
    seconds: float = 0.0
    """Serve this long, then stop (0: until Ctrl-C)."""

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536 or self.max_connections < 1 or self.threads < 1 or self.seconds < 0:
            raise ValueError("--port must be in [0, 65535], --max_connections and --threads >= 1, --seconds >= 0")
        if self.env.endswith(":*"):
            raise ValueError(f"--env {self.env}: a server serves one task's policy; name the task")
