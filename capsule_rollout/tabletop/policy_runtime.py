"""`PolicyRuntime`: the flow policy as a rollout-host component with static buffers.

It implements the rollout protocol's policy side (`policies.rollout_policy`).
Buffers (see `buffer_specs`): `state` = the noise generator's (seed, counter),
the subtask language embedding (written by `set_language`, read every chunk) and
the advantage indicator and guidance weight (`set_conditioning`); `io` = the
observation slots and the output chunk. `act()` runs one buffer-to-buffer function
over the loaded observation through a `GraphRunner` (one CUDA graph on a GPU, eager
on the CPU). Snapshot -> act -> restore -> act gives the same chunk bit for bit;
`reset(seed)` starts a new noise stream. `noise_scale` multiplies each chunk's noise before the flow is
integrated (a sampling temperature: 1 samples the learned distribution, 0 integrates from the origin and
gives one chunk per observation).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from capsule_rollout.capsules import BufferSpec, Role
from capsule_rollout.models.counter_rng import normal_, normal_rows_
from capsule_rollout.models.inputs import load_observation
from capsule_rollout.models.runtime import ModelRuntime, in_rows
from capsule_rollout.policies.conditioning import check_noise_scale
from capsule_rollout.policies.rollout_policy import PolicySpec
from capsule_rollout.tabletop.flow_policy import ADV_NONE, FlowPolicy


class PolicyRuntime(ModelRuntime):
    KIND = "flow_policy"

    def __init__(
        self,
        model: FlowPolicy,
        *,
        name: str = "policy",
        device: str = "cpu",
        batch: int = 1,
        seed: int = 0,
        guidance: bool = False,
        noise_scale: float = 1.0,
        capture: bool | None = None,
        trace: bool | None = None,
        rows: bool = False,
        batch_invariant: bool | None = None,
        sums: str | None = None,
    ) -> None:
        """`guidance`: classifier-free guidance over the advantage indicator (weight in `set_conditioning`).
        `noise_scale`: the chunk noise's scale (>= 0; a capsule fits only a runtime with the same scale).
        `trace`: run the network as TorchScript on the CPU (None: yes; see `trace_on_cpu`).
        `rows`: the batched runtime of a host's slots (`batched`): a noise stream and a guidance weight per row,
        and an `active` row mask (only rows that act advance their stream).
        `batch_invariant`: a row's chunk the same at any batch size (`models.runtime`; None: yes); `sums`: how
        (`models.runtime.SUMS`; None: exact sums)."""
        check_noise_scale(noise_scale)
        scaled = {} if noise_scale == 1.0 else {"noise_scale": repr(float(noise_scale))}
        super().__init__(model, name=name, device=device, batch=batch, capture=capture, trace=trace,
                         batch_invariant=batch_invariant, sums=sums, guidance=str(guidance), **scaled)
        self.seed, self.guidance, self.noise_scale, self.rows = seed, guidance, float(noise_scale), rows
        flat = self.config.chunk_length * self.config.action_dim
        self._index = torch.arange(flat if rows else batch * flat, device=self.device)
        self.core: torch.nn.Module = _PolicyCore(self.model, guidance, self._index, self.noise_scale, rows)
        self.spec = PolicySpec(chunk_length=self.config.chunk_length, action_dim=self.config.action_dim,
                               observation_keys=self.observation_keys)

    # -- component ------------------------------------------------------------------
    def buffer_specs(self) -> list[BufferSpec]:
        c, b, dev = self.config, self.batch, str(self.device)
        per_row = (b,) if self.rows else ()
        specs = [
            BufferSpec("rng", (*per_row, 2), torch.int64, dev, doc="noise generator (seed, counter)"),
            BufferSpec("lang", (b, c.lang_dim), torch.float32, dev, doc="subtask embedding"),
            # RECAP conditioning persists across chunks (set per episode): committed state
            BufferSpec("advantage", (b,), torch.int64, dev, doc="indicator: 0 none, 1 positive, 2 negative"),
            BufferSpec("beta", per_row, torch.float32, dev, doc="classifier-free guidance weight"),
            BufferSpec("state", (b, c.state_dim), torch.float32, dev, Role.IO),
            BufferSpec("chunk", (b, c.chunk_length, c.action_dim), torch.float32, dev, Role.IO),
            BufferSpec("noise", (b, c.chunk_length * c.action_dim), torch.float32, dev, Role.SCRATCH),
        ]
        specs += [BufferSpec(f"image_{cam}", (b, c.image_size, c.image_size, 3), torch.uint8, dev, Role.IO)
                  for cam in c.cameras]
        if self.rows:
            specs.append(BufferSpec("active", (b,), torch.int64, dev, Role.IO, doc="1: the row acts this call"))
        return specs

    def bind(self, buffers: Mapping[str, torch.Tensor]) -> None:
        super().bind(buffers)
        self.buffers["rng"].copy_(torch.tensor([self.seed, 0]).expand_as(self.buffers["rng"]))
        self.buffers["beta"].fill_(1.0)
        self.buffers["advantage"].fill_(ADV_NONE)
        b = self.buffers
        example = (tuple(b[f"image_{cam}"] for cam in self.config.cameras), b["state"], b["lang"], b["advantage"],
                   b["beta"], b["rng"], b["noise"], *((b["active"],) if self.rows else ()))
        beta = b["beta"][:, None] if self.rows else b["beta"].expand(self.batch)[:, None]
        self.together = self.core.together = self.rows_together(
            self.core._sample, (*example[0], b["state"], b["lang"], b["advantage"], beta, b["noise"]))
        # tracing and warm-up run the function: the noise counter they bump is put back
        self.core = self._compile(self.core, example, self._act, preserve=[b["rng"]])

    # -- rollout protocol ---------------------------------------------------------
    def reset(self, episode_seed: int) -> None:
        """Start the noise stream of an episode (or branch): generator state (seed, 0)."""
        self.buffers["rng"].copy_(torch.tensor([int(episode_seed), 0]))

    def batched(self, n: int):
        """This policy for a host of `n` slots: one runtime of `n` rows (its own buffers, the same weights and
        settings) and a one-row component per slot (`PolicyRows`)."""
        from capsule_rollout.tabletop.model_rows import PolicyRows

        return PolicyRows(self, n)

    def set_conditioning(self, advantage: int, beta: float | None = None) -> None:
        """RECAP conditioning: indicator 0 none, 1 positive, 2 negative; `beta`: the classifier-free
        guidance weight (None: the conditional policy alone; needs a runtime made with `guidance=True`)."""
        self.check_conditioning(advantage, beta)
        self.buffers["advantage"].fill_(advantage)
        self.buffers["beta"].fill_(1.0 if beta is None else float(beta))

    def check_conditioning(self, advantage: int, beta: float | None) -> None:
        if advantage not in (0, 1, 2):
            raise ValueError(f"advantage indicator must be 0 (none), 1 (positive) or 2 (negative), got {advantage}")
        if beta is not None and not self.guidance:
            raise ValueError(f"guidance weight {beta} given, but this policy runtime was made without guidance "
                             "(PolicyRuntime(..., guidance=True))")
        if beta is not None and not beta > 0:
            raise ValueError(f"the guidance weight must be > 0, got {beta}")

    def load_observation(self, obs: Mapping[str, np.ndarray | torch.Tensor]) -> None:
        """Validate an observation (`image_<camera>`, `state`; batch dim optional when batch=1) and copy
        it into the io slots."""
        load_observation(self.buffers, obs, cameras=self.config.cameras, who="policy")

    def act(self, obs: Mapping[str, np.ndarray | torch.Tensor] | None = None) -> torch.Tensor:
        """One action chunk `(B, T, A)` for `obs` (else the loaded observation): a view of the output
        buffer, valid until the next call (copy it to keep it)."""
        if obs is not None:
            self.load_observation(obs)
        self.runner()
        return self.buffers["chunk"]

    # -- the captured function ----------------------------------------------------
    def _act(self) -> None:
        b = self.buffers
        images = tuple(b[f"image_{cam}"] for cam in self.config.cameras)
        b["chunk"].copy_(self.core(images, b["state"], b["lang"], b["advantage"], b["beta"], b["rng"], b["noise"],
                                   *((b["active"],) if self.rows else ())))


class _PolicyCore(torch.nn.Module):
    """Noise state + observation -> action chunk: all of `act` but the output copy (traced on the CPU).

    Draws the chunk's noise into `noise` (times `noise_scale`) and bumps the counter in `rng`, in place; the
    network then runs over the rows together, or one at a time where together they would not get what each gets
    alone (`models.runtime.rows_agree`).
    """

    def __init__(self, model: FlowPolicy, guidance: bool, index: torch.Tensor, noise_scale: float = 1.0,
                 rows: bool = False) -> None:
        super().__init__()
        self.model, self.guidance, self.noise_scale, self.rows = model, guidance, noise_scale, rows
        self.together = True  # set where the runtime is made (`rows_agree`)
        self.cameras = model.config.cameras
        self.register_buffer("index", index, persistent=False)

    def forward(self, images: tuple[torch.Tensor, ...], state: torch.Tensor, lang: torch.Tensor,
                advantage: torch.Tensor, beta: torch.Tensor, rng: torch.Tensor, noise: torch.Tensor,
                active: torch.Tensor | None = None) -> torch.Tensor:
        if self.rows:  # a stream per row; a guidance weight per row
            normal_rows_(rng, noise, self.index, active)
            beta = beta[:, None]
        else:
            normal_(rng, noise, self.index)
            beta = beta.expand(noise.shape[0])[:, None]
        if self.noise_scale != 1.0:  # a constant of the traced / captured function
            noise.mul_(self.noise_scale)
        return in_rows(self._sample, (*images, state, lang, advantage, beta, noise), self.together)

    def _sample(self, *rows: torch.Tensor) -> torch.Tensor:
        *images, state, lang, advantage, beta, noise = rows
        m = self.model
        feats = m.features(dict(zip(self.cameras, images)), state, lang)
        cond = m.condition(feats, advantage)
        if self.guidance:
            cond_none = m.condition(feats, torch.zeros_like(advantage))
            return m.sample(cond, noise, cond_none=cond_none, beta=beta)
        return m.sample(cond, noise)
