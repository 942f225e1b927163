"""`CriticRuntime`: the value critic as a rollout-host component with static buffers.

Buffers: `state` = the subtask language embedding; `io` = observation slots (the
images, the robot state, the episode step, for a critic that reads the plan, the
actions about to be executed, and for a privileged critic, the env's `privileged`
observation) and the outputs (value `(B,)` and logits `(B, bins)`). `evaluate()` runs one
buffer-to-buffer function through a `GraphRunner`, so it can run on lane C of a
`TwoLaneContext` while the policy runs on lane P. It implements the rollout protocol's
critic side (`critics.rollout_critic`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from capsule_rollout.capsules import BufferSpec, Role
from capsule_rollout.critics.rollout_critic import CriticSpec
from capsule_rollout.models.inputs import all_counts, all_finite, as_state_tensor, load_observation, require_keys
from capsule_rollout.models.runtime import ModelRuntime, in_rows
from capsule_rollout.stores.episode_schema import PRIVILEGED
from capsule_rollout.tabletop.value_critic import ACTOR_POLICY, ValueCritic


class CriticRuntime(ModelRuntime):
    KIND = "value_critic"

    def __init__(self, model: ValueCritic, *, name: str = "critic", device: str = "cpu", batch: int = 1,
                 capture: bool | None = None, trace: bool | None = None, batch_invariant: bool | None = None,
                 sums: str | None = None) -> None:
        """`trace`: run the network as TorchScript on the CPU (None: yes; see `trace_on_cpu`).
        `batch_invariant`: a row's value the same at any batch size (`models.runtime`; None: yes); `sums`: how
        (`models.runtime.SUMS`; None: exact sums)."""
        super().__init__(model, name=name, device=device, batch=batch, capture=capture, trace=trace,
                         batch_invariant=batch_invariant, sums=sums)
        self.core: torch.nn.Module = _CriticCore(self.model)
        self.spec = CriticSpec(observation_keys=self.observation_keys)

    @property
    def observation_keys(self) -> tuple[str, ...]:
        return (*super().observation_keys, *((PRIVILEGED,) if self.config.privileged_dim else ()))

    def buffer_specs(self) -> list[BufferSpec]:
        c, b, dev = self.config, self.batch, str(self.device)
        specs = [
            BufferSpec("lang", (b, c.lang_dim), torch.float32, dev, doc="subtask embedding"),
            BufferSpec("state", (b, c.state_dim), torch.float32, dev, Role.IO),
            BufferSpec("step", (b,), torch.float32, dev, Role.IO, doc="control steps since the episode started"),
            BufferSpec("value", (b,), torch.float32, dev, Role.IO),
            BufferSpec("logits", (b, c.bins), torch.float32, dev, Role.IO),
        ]
        specs += [BufferSpec(f"image_{cam}", (b, c.image_size, c.image_size, 3), torch.uint8, dev, Role.IO)
                  for cam in c.cameras]
        if c.plan_steps:
            specs.append(BufferSpec("plan", (b, c.plan_steps, c.action_dim), torch.float32, dev, Role.IO,
                                    doc="actions about to be executed (NaN: none, the state's value)"))
        if c.privileged_dim:
            specs.append(BufferSpec(PRIVILEGED, (b, c.privileged_dim), torch.float32, dev, Role.IO,
                                    doc="the env's privileged observation (the sim's object and gripper poses)"))
        return specs

    def bind(self, buffers: Mapping[str, torch.Tensor]) -> None:
        super().bind(buffers)
        b = self.buffers
        example = (tuple(b[f"image_{cam}"] for cam in self.config.cameras), b["state"], b["lang"], b["step"],
                   self._extra_args())
        self.together = self.core.together = self.rows_together(
            self.core._logits, (*example[0], *example[1:4], *example[4]))
        self.core = self._compile(self.core, example, self._evaluate)

    def batched(self, n: int):
        """This critic for a host of `n` slots: one runtime of `n` rows and a one-row component per slot
        (`CriticRows`)."""
        from capsule_rollout.tabletop.model_rows import CriticRows

        return CriticRows(self, n)

    def check_step(self, step) -> torch.Tensor | None:
        """The episode step(s) as a float tensor (None for a critic without a time input); refuses bad ones."""
        if not self.config.episode_limit:
            return None
        if step is None:
            raise ValueError(f"critic {self.name} reads the episode step (limit {self.config.episode_limit}); "
                             "pass step= with the observation")
        if isinstance(step, torch.Tensor):
            t = step.to(torch.float32).reshape(-1)
        else:  # an int at every step: through numpy, without torch's dispatch
            try:
                t = torch.from_numpy(np.asarray(step, dtype=np.float32).reshape(-1))
            except (TypeError, ValueError):
                t = None
        if t is None or t.shape[0] not in (1, self.batch) or not all_counts(t):
            raise ValueError(f"step must be a count >= 0 (an int or one per batch row), got {step!r}")
        return t

    def load_observation(self, obs: Mapping[str, np.ndarray | torch.Tensor], step=None) -> None:
        """Validate an observation (`image_<camera>`, `state`; batch dim optional when batch=1) and copy
        it into the io slots.

        `step`: control steps since the episode started (an int, or `(B,)`); a critic
        with a time input (`config.episode_limit`) needs it, one without ignores it.
        """
        t = self.check_step(step)
        privileged = self.check_privileged(obs, self.batch)
        load_observation(self.buffers, obs, cameras=self.config.cameras, who="critic")
        if privileged is not None:
            self.buffers[PRIVILEGED].copy_(privileged)
        if t is not None:
            self.buffers["step"].copy_(t.expand(self.batch))
        if self.config.plan_steps:
            self.buffers["plan"].fill_(float("nan"))  # a new state: no plan until one is given

    def check_privileged(self, obs: Mapping, rows: int) -> torch.Tensor | None:
        """The observation's `privileged` vector(s) `(rows, P)` for a privileged critic (None for another);
        refuses a missing, misshapen or non-finite one."""
        if not self.config.privileged_dim:
            return None
        require_keys(obs, (PRIVILEGED,), f"critic {self.name} (privileged)")
        p = torch.as_tensor(obs[PRIVILEGED])
        if rows == 1 and p.dim() == 1:
            p = p[None]
        return as_state_tensor(p, (rows, self.config.privileged_dim))

    def load_plan(self, plan) -> None:
        """The actions about to be executed from the loaded observation (a plan critic only): `(T, A)` or
        `(B, T, A)` with T >= plan_steps (a policy's chunk; its first plan_steps are read)."""
        c = self.config
        if not c.plan_steps:
            raise ValueError(f"critic {self.name} reads no plan (plan_steps 0)")
        p = torch.as_tensor(plan, dtype=torch.float32)
        if p.dim() == 2:
            p = p[None]
        if p.dim() != 3 or p.shape[0] not in (1, self.batch) or p.shape[1] < c.plan_steps or p.shape[2] != c.action_dim:
            raise ValueError(f"critic {self.name}: plan must be (T, {c.action_dim}) or ({self.batch}, T, "
                             f"{c.action_dim}) with T >= {c.plan_steps}; got {tuple(p.shape)}")
        if not all_finite(p[:, : c.plan_steps]):
            raise ValueError(f"critic {self.name}: the plan holds NaN/inf actions")
        self.buffers["plan"].copy_(p[:, : c.plan_steps].expand(self.batch, -1, -1))

    def evaluate(self, obs: Mapping[str, np.ndarray | torch.Tensor] | None = None, step=None,
                 plan=None) -> torch.Tensor:
        """Values `(B,)` (a view of the output buffer). A plan critic values the state alone unless
        `plan` (see `load_plan`) is given; `evaluate(plan=chunk)` after `evaluate(obs...)` values the
        same observation with the plan."""
        if obs is not None:
            self.load_observation(obs, step)
        if plan is not None:
            self.load_plan(plan)
        self.runner()
        return self.buffers["value"]

    def _extra_args(self) -> tuple[torch.Tensor, ...]:
        """The inputs only some critics read, in order: the plan, the privileged state."""
        return (*((self.buffers["plan"],) if self.config.plan_steps else ()),
                *((self.buffers[PRIVILEGED],) if self.config.privileged_dim else ()))

    def _evaluate(self) -> None:
        b = self.buffers
        logits, value = self.core(tuple(b[f"image_{cam}"] for cam in self.config.cameras), b["state"], b["lang"],
                                  b["step"], self._extra_args())
        b["logits"].copy_(logits)
        b["value"].copy_(value)


class _CriticCore(torch.nn.Module):
    """Observation -> (logits, value): the network part of `evaluate` (traced on the CPU), over the rows
    together or one at a time (`models.runtime.rows_agree`).

    At run time the critic judges the policy that is acting: a critic with an actor input
    is asked for the policy's value (`ACTOR_POLICY`)."""

    def __init__(self, model: ValueCritic) -> None:
        super().__init__()
        self.model, self.together = model, True  # together: set where the runtime is made (`rows_agree`)
        self.cameras = model.config.cameras

    def forward(self, images: tuple[torch.Tensor, ...], state: torch.Tensor, lang: torch.Tensor, step: torch.Tensor,
                extra: tuple[torch.Tensor, ...]):
        logits = in_rows(self._logits, (*images, state, lang, step, *extra), self.together)
        # row by row: a row's value is then the same whatever the batch holds beside it (a batched matrix-vector
        # product is not), and equal to a batch of one's
        return logits, torch.cat([self.model.value(logits[i: i + 1]) for i in range(logits.shape[0])])

    def _logits(self, *rows: torch.Tensor) -> torch.Tensor:
        config = self.model.config
        n = len(self.cameras)
        images, (state, lang, step), extra = rows[:n], rows[n: n + 3], rows[n + 3:]
        plan = extra[0] if config.plan_steps else None
        privileged = extra[-1] if config.privileged_dim else None
        return self.model.logits(dict(zip(self.cameras, images)), state, lang, step if config.episode_limit else None,
                                 torch.full_like(step, ACTOR_POLICY) if config.actor_input else None,
                                 plan, privileged)
