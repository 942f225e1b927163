"""Reference components that exercise every capsule path (used by verify_capsule).

- `NoisyChunkStandIn`: a torch module with recurrent state, an action queue
  refilled every `chunk` steps from a `torch.Generator` (live state outside the
  arena, mirrored by hooks), a bf16 running mean and a bool flag; the queue
  declares a chunk-boundary alignment.
- `NumpyWalkerStandIn`: host state kept as numpy arrays that share memory with the
  arena, with noise from a numpy PCG64 generator (mirrored by hooks).
- `CombinedStandIn`: both in one arena, the policy driving the walker, as a
  rollout host does with policy and env.

Real components (env, policy, critic, hand-off) join verify_capsule in their own
packages; these remain as the mechanism's own regression check.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from capsule_rollout.capsules.arena import Arena
from capsule_rollout.capsules.buffer_spec import BufferSpec, Role
from capsule_rollout.capsules.component import BufferComponent
from capsule_rollout.capsules.fingerprint import tensors_sha256
from capsule_rollout.capsules.rng_state import PCG64_WORDS, pack_pcg64, unpack_pcg64


class NoisyChunkStandIn(BufferComponent):
    """Stand-in for a chunked stochastic policy (see module docstring)."""

    def __init__(
        self,
        *,
        name: str = "noisy_chunk",
        batch: int = 2,
        obs_dim: int = 6,
        hidden: int = 16,
        act_dim: int = 3,
        chunk: int = 4,
        device: str = "cpu",
        weight_seed: int = 0,
        noise_seed: int = 1234,
    ) -> None:
        super().__init__()
        self.name, self.batch, self.obs_dim, self.hidden, self.act_dim, self.chunk = (
            name, batch, obs_dim, hidden, act_dim, chunk,
        )
        self.device = torch.device(device)
        g = torch.Generator().manual_seed(weight_seed)
        self.w_obs = (torch.randn(obs_dim, hidden, generator=g) / obs_dim**0.5).to(self.device)
        self.w_h = (torch.randn(hidden, hidden, generator=g) / hidden**0.5).to(self.device)
        self.w_act = (torch.randn(hidden, act_dim, generator=g) / hidden**0.5).to(self.device)
        self.noise = torch.Generator(device=self.device)
        self.noise.manual_seed(noise_seed)
        self._gen_bytes = self.noise.get_state().numel()
        self._fingerprint = {
            "kind": "standin/noisy_chunk",
            "weights_sha256": tensors_sha256({"w_obs": self.w_obs, "w_h": self.w_h, "w_act": self.w_act}),
        }

    def buffer_specs(self) -> list[BufferSpec]:
        b, h, a, dev = self.batch, self.hidden, self.act_dim, str(self.device)
        return [
            BufferSpec("hidden", (b, h), torch.float32, dev),
            BufferSpec("queue", (self.chunk, b, a), torch.float32, dev, alignment=self.chunk),
            BufferSpec("cursor", (), torch.int64, dev),
            BufferSpec("ema", (b, a), torch.bfloat16, dev),
            BufferSpec("flag", (b,), torch.bool, dev),
            # torch.Generator.get_state() is a CPU byte tensor for every device.
            BufferSpec("generator", (self._gen_bytes,), torch.uint8, "cpu"),
            BufferSpec("obs", (b, self.obs_dim), torch.float32, dev, Role.IO),
            BufferSpec("action", (b, a), torch.float32, dev, Role.IO),
            BufferSpec("pre", (b, h), torch.float32, dev, Role.SCRATCH),
        ]

    def fingerprint(self) -> Mapping[str, str]:
        return self._fingerprint

    def before_snapshot(self) -> None:
        self.buffers["generator"].copy_(self.noise.get_state())

    def after_restore(self) -> None:
        self.noise.set_state(self.buffers["generator"].clone())

    def act(self, obs: torch.Tensor) -> torch.Tensor:
        """One control step: obs (B, obs_dim) float32 -> action (B, act_dim) float32."""
        b = self.buffers
        b["obs"].copy_(obs)
        cursor = int(b["cursor"])
        if cursor == 0:  # chunk boundary: refill the queue
            torch.matmul(b["obs"], self.w_obs, out=b["pre"])
            b["pre"].addmm_(b["hidden"], self.w_h)
            torch.tanh(b["pre"], out=b["hidden"])
            mean = torch.tanh(b["hidden"] @ self.w_act)
            noise = torch.randn(self.chunk, self.batch, self.act_dim, generator=self.noise, device=self.device)
            b["queue"].copy_(mean.unsqueeze(0) + 0.1 * noise)
        b["action"].copy_(b["queue"][cursor])
        b["cursor"].fill_((cursor + 1) % self.chunk)
        b["ema"].copy_((0.9 * b["ema"].float() + 0.1 * b["action"]).to(torch.bfloat16))
        b["flag"].logical_or_(b["action"][:, 0] > 0)
        return b["action"]


class NumpyWalkerStandIn(BufferComponent):
    """Stand-in for host simulator state held in numpy (see module docstring)."""

    def __init__(self, *, name: str = "numpy_walker", bodies: int = 4, dt: float = 0.05, seed: int = 7) -> None:
        super().__init__()
        self.name, self.bodies, self.dt = name, bodies, dt
        self.rng = np.random.Generator(np.random.PCG64(seed))

    def buffer_specs(self) -> list[BufferSpec]:
        n = self.bodies
        return [
            BufferSpec("pos", (n, 3), torch.float64),
            BufferSpec("vel", (n, 3), torch.float32),
            BufferSpec("t", (), torch.int64),
            BufferSpec("rng", (PCG64_WORDS,), torch.int64),
            BufferSpec("force", (n, 3), torch.float64, role=Role.IO),
        ]

    def bind(self, buffers: Mapping[str, torch.Tensor]) -> None:
        super().bind(buffers)
        # numpy views share the arena's memory: the simulation writes arena bytes.
        self.pos = buffers["pos"].numpy()
        self.vel = buffers["vel"].numpy()
        self.t = buffers["t"].numpy()
        self.rng_words = buffers["rng"].numpy().view(np.uint64)
        self.force = buffers["force"].numpy()

    def before_snapshot(self) -> None:
        pack_pcg64(self.rng, self.rng_words)

    def after_restore(self) -> None:
        unpack_pcg64(self.rng, self.rng_words)

    def advance(self, force: np.ndarray) -> np.ndarray:
        """One physics step under `force` (bodies, 3); returns positions (a live view)."""
        self.force[:] = force
        noise = self.rng.standard_normal(self.force.shape)
        self.vel += ((self.force + 0.05 * noise) * self.dt).astype(np.float32)
        self.pos += self.vel * self.dt
        out = np.abs(self.pos) > 1.0  # walls at +-1 reflect
        self.vel[out] *= -1
        self.t += 1
        return self.pos


class _SteppableMixin:
    arena: Arena

    def scramble(self, generator: torch.Generator) -> None:
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
        for component in self.arena.components.values():
            if isinstance(component, NoisyChunkStandIn):
                component.noise.manual_seed(seed)
            elif isinstance(component, NumpyWalkerStandIn):
                component.rng = np.random.Generator(np.random.PCG64(seed))


class NoisyChunkSteppable(_SteppableMixin):
    def __init__(self, device: str = "cpu") -> None:
        self.policy = NoisyChunkStandIn(device=device)
        self.name = f"standin/noisy_chunk[{self.policy.device.type}]"
        self.arena = Arena([self.policy]).allocate()

    def sample_inputs(self, generator: torch.Generator) -> dict[str, torch.Tensor]:
        obs = torch.randn(self.policy.batch, self.policy.obs_dim, generator=generator)
        return {"obs": obs.to(self.policy.device)}

    def step(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        b = self.policy.buffers
        return {"action": self.policy.act(inputs["obs"]), "ema": b["ema"], "flag": b["flag"]}


class NumpyWalkerSteppable(_SteppableMixin):
    def __init__(self) -> None:
        self.walker = NumpyWalkerStandIn()
        self.name = "standin/numpy_walker"
        self.arena = Arena([self.walker]).allocate()

    def sample_inputs(self, generator: torch.Generator) -> dict[str, torch.Tensor]:
        return {"force": torch.randn(self.walker.bodies, 3, generator=generator, dtype=torch.float64)}

    def step(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        pos = self.walker.advance(inputs["force"].numpy())
        return {"pos": torch.from_numpy(pos), "vel": self.walker.buffers["vel"]}


class CombinedStandIn(_SteppableMixin):
    """Policy and walker in one arena: the policy's action pushes the walker."""

    def __init__(self) -> None:
        self.policy = NoisyChunkStandIn(batch=1, obs_dim=12, act_dim=3)
        self.walker = NumpyWalkerStandIn(bodies=4)
        self.name = "standin/policy+walker"
        self.arena = Arena([self.policy, self.walker], fingerprint={"host/code": "standin"}).allocate()

    def sample_inputs(self, generator: torch.Generator) -> dict[str, torch.Tensor]:
        return {"push": torch.randn(4, 3, generator=generator, dtype=torch.float64)}

    def step(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        obs = torch.from_numpy(self.walker.pos.astype(np.float32).reshape(1, -1))
        action = self.policy.act(obs)
        force = inputs["push"].numpy() + action.double().numpy()[0]
        pos = self.walker.advance(force)
        return {"action": action, "pos": torch.from_numpy(pos)}
