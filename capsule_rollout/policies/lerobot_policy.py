"""`LeRobotPolicy`: a LeRobot policy (ACT, Diffusion Policy) as a rollout policy, its state between calls in capsules.

LeRobot's `select_action(obs)` hands out one action per control step: it appends the observation to a history of
the last `n_obs_steps` (filled with copies of the first at an episode's start), and when its action queue is empty
it runs the network on that history and queues the next `n_action_steps` actions. This policy does the same with
that state in its own buffers, one row per env slot, so a capsule holds it and a restore, a fork into another slot
or a replay resumes with the same history and the same queued actions:

    rng         (2,) int64                     (seed, counter): the torch.Generator of each network call
    hist_<key>  (n_obs_steps, ...) env dtype   the observations the network reads, oldest first, as the env gave them
    hist_len    (1,) int64                     0 at an episode's start (the first observation fills the history)
    queue       (n_action_steps, A) float32    the actions of the last network call, unnormalised
    queue_left  (1,) int64                     how many of them are still to be handed out

The host acts with chunks of one action (`chunk_length` 1, `n_exec` 1), so every control step is a chunk boundary:
a capsule may be taken in the middle of the queue, and the actions that follow its restore are the queued ones.
Randomness: each network call that refills a row's queue seeds a `torch.Generator` from the row's (seed, counter)
and advances the counter (Diffusion draws its initial noise and each DDPM step's noise from it), so noise is capsule
state like the rest. With N slots one model serves every slot (`LeRobotPolicyRows`): a step's network call takes
all N rows (padded to a power of two; a row that needs no actions is computed and dropped) where the network gives a
row the same actions at any position of such a batch, and computes each row that needs actions alone where it does
not (checked when the rows are made); either way what a row gets never depends on which slot it is in or on what
the other slots are doing, so a capsule restores into any slot.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from capsule_rollout.capsules import Arena, BufferComponent, BufferSpec, Role
from capsule_rollout.models.inputs import require_keys
from capsule_rollout.models.rows import RowSlot, set_active
from capsule_rollout.policies.lerobot_model import LeRobotModel
from capsule_rollout.policies.rollout_policy import PolicySpec

KIND = "lerobot_policy"
_MASK64 = (1 << 64) - 1


def call_seed(seed: int, counter: int) -> int:
    """The torch.Generator seed of a row's network call from its (seed, counter) (splitmix64 of both)."""
    z = (int(seed) * 0x9E3779B97F4A7C15 + int(counter) + 0x632BE59BD9B4E019) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def row_generator(seed: int, counter: int) -> torch.Generator:
    """The generator a network call draws a row's noise from (CPU; LeRobot moves the noise to its device)."""
    return torch.Generator().manual_seed(call_seed(seed, counter))


def state_specs(model: LeRobotModel, shapes: Mapping[str, tuple[tuple[int, ...], np.dtype]],
                rows: tuple[int, ...] = ()) -> list[BufferSpec]:
    """The state buffers of one row (`rows` ()) or of N (`rows` (N,)): see the module docstring."""
    specs = [BufferSpec("rng", (*rows, 2), torch.int64, "cpu", doc="noise generator (seed, counter)"),
             BufferSpec("hist_len", (*rows, 1), torch.int64, "cpu", doc="observations in the history (0: none yet)"),
             BufferSpec("queue", (*rows, model.n_action_steps, model.action_dim), torch.float32, "cpu",
                        doc="actions of the last network call"),
             BufferSpec("queue_left", (*rows, 1), torch.int64, "cpu", doc="queued actions still to hand out")]
    for key, (shape, dtype) in shapes.items():
        specs.append(BufferSpec(f"hist_{key}", (*rows, model.n_obs_steps, *shape), torch.from_numpy(
            np.zeros(0, dtype)).dtype, "cpu", doc=f"the last {model.n_obs_steps} observations' {key}"))
    return specs


def position_free(model: LeRobotModel, shapes: Mapping[str, tuple[tuple[int, ...], np.dtype]], batch: int,
                  seed: int = 0) -> bool:
    """Whether the network gives a row the same actions at every position of a batch of `batch` rows, bit for bit:
    random histories, and the batch again in each of its cyclic shifts (every row at every position). Kernels may
    compute a batch's last rows another way (a tail of a GEMM or convolution block): seen here for batches of 3, 5,
    6 and 7 rows, not of 2, 4 or 8."""
    g = torch.Generator().manual_seed(seed)
    history = {}
    for key, (shape, dtype) in shapes.items():
        size = (batch, model.n_obs_steps, *shape)
        history[key] = (torch.randint(0, 256, size, generator=g, dtype=torch.uint8) if dtype == np.uint8
                        else torch.randn(size, generator=g).to(torch.from_numpy(np.zeros(0, dtype)).dtype))
    generators = (lambda order: [row_generator(seed, r) for r in order]) if model.samples else (lambda order: None)
    base = model.chunk_rows(history, generators(range(batch)))
    for shift in range(1, batch):
        order = [(p + shift) % batch for p in range(batch)]
        if not torch.equal(model.chunk_rows({k: v[order] for k, v in history.items()}, generators(order)),
                           base[order]):
            return False
    return True


class _Engine:
    """LeRobot's `select_action` over N rows of buffers (`b[name]` with a leading N). `batch`: the rows of each
    network call (the N rows padded to `batch` with empty ones), or 0: the rows that need actions one at a time."""

    def __init__(self, model: LeRobotModel, buffers: Mapping[str, torch.Tensor], keys: tuple[str, ...],
                 batch: int = 0) -> None:
        self.model, self.b, self.keys, self.batch = model, buffers, keys, batch
        self.rows = buffers["rng"].shape[0]
        self.calls = 0  # network calls made

    def push(self, i: int, obs: Mapping[str, np.ndarray]) -> None:
        """Row i's new observation into its history (`populate_queues`: the first fills every position)."""
        b, first = self.b, int(self.b["hist_len"][i, 0]) == 0
        for key in self.keys:
            hist, frame = b[f"hist_{key}"][i], torch.from_numpy(obs[key])
            if first:
                hist.copy_(frame.expand_as(hist))
            else:
                hist[:-1] = hist[1:].clone()
                hist[-1].copy_(frame)
        b["hist_len"][i, 0] = self.model.n_obs_steps

    def _call(self, rows: Sequence[int], size: int) -> torch.Tensor:
        """The network on `rows`' histories, padded with empty rows to `size`: `(len(rows), n_action_steps, A)`."""
        b, model = self.b, self.model
        history = {}
        for key in self.keys:
            hist = b[f"hist_{key}"][list(rows)]
            pad = size - len(rows)
            history[key] = torch.cat([hist, hist.new_zeros((pad, *hist.shape[1:]))]) if pad else hist
        generators = None
        if model.samples:
            seeds = b["rng"][list(rows)].tolist() + [[0, 0]] * (size - len(rows))
            generators = [row_generator(s, c) for s, c in seeds]
        self.calls += 1
        return model.chunk_rows(history, generators)[: len(rows)]

    def refill(self, rows: Sequence[int]) -> None:
        """New actions for `rows` (their queues empty): one call over every row padded to `batch` rows, or one call
        per row; their counters advance."""
        b, model = self.b, self.model
        if self.batch:
            chunks = self._call(range(self.rows), self.batch)[list(rows)]
        else:
            chunks = torch.cat([self._call([i], 1) for i in rows])
        want = (len(rows), model.n_action_steps, model.action_dim)
        if tuple(chunks.shape) != want:
            raise ValueError(f"{model.path}: the network answered actions of shape {tuple(chunks.shape)}, not {want} "
                             "(rows x n_action_steps x action_dim)")
        for k, i in enumerate(rows):
            b["queue"][i].copy_(chunks[k])
            b["queue_left"][i, 0] = model.n_action_steps
            b["rng"][i, 1] += 1

    def act(self, obs: Sequence[Mapping[str, np.ndarray] | None], active: Sequence[int], out: torch.Tensor) -> None:
        """`select_action` for each active row: `out[i]` `(1, A)` its next action."""
        b = self.b
        for i in active:
            if obs[i] is None:
                raise ValueError(f"slot {i} acts before loading an observation")
            self.push(i, obs[i])
        empty = [i for i in active if int(b["queue_left"][i, 0]) == 0]
        if empty:
            self.refill(empty)
        n = self.model.n_action_steps
        for i in active:
            left = int(b["queue_left"][i, 0])
            out[i, 0].copy_(b["queue"][i, n - left])
            b["queue_left"][i, 0] = left - 1


def _loaded(obs: Mapping[str, Any], keys: tuple[str, ...], shapes) -> dict[str, np.ndarray]:
    require_keys(obs, keys, "policy")
    loaded = {}
    for key in keys:
        value = np.asarray(obs[key])
        shape, dtype = shapes[key]
        if value.shape != shape:
            raise ValueError(f"observation {key!r} has shape {value.shape}; this LeRobot policy reads {shape}")
        loaded[key] = np.array(value, dtype=dtype)  # a copy: the env may reuse its arrays
    return loaded


class LeRobotPolicy(BufferComponent):
    """One slot of a LeRobot policy (see the module docstring), reading the observations `model.keys` names
    (shaped as `model.env_shapes()`: an image `(H, W, 3)` uint8 for a `(3, H, W)` feature)."""

    batches = True  # `batched(n)`: one model serves every slot of a host

    def __init__(self, model: LeRobotModel, *, seed: int = 0, name: str = "policy") -> None:
        super().__init__()
        self.model, self.name, self.seed = model, name, int(seed)
        self.shapes = model.env_shapes()
        self.spec = PolicySpec(1, model.action_dim, tuple(self.shapes))
        self.device = model.device
        self._obs: dict[str, np.ndarray] | None = None
        self._fingerprint = {"policy": KIND, **model.fingerprint}

    def buffer_specs(self) -> list[BufferSpec]:
        return [*state_specs(self.model, self.shapes),
                BufferSpec("chunk", (1, self.model.action_dim), torch.float32, "cpu", Role.IO)]

    def bind(self, buffers: Mapping[str, torch.Tensor]) -> None:
        super().bind(buffers)
        self.buffers["rng"].copy_(torch.tensor([self.seed, 0]))
        self._engine = _Engine(self.model, {k: v.unsqueeze(0) for k, v in self.buffers.items()},
                               self.spec.observation_keys, batch=1)

    def fingerprint(self) -> Mapping[str, str]:
        return self._fingerprint

    def reset(self, episode_seed: int) -> None:
        """A new episode: its noise seeded from `episode_seed`, the history and the queue emptied."""
        self.reseed(episode_seed)
        self.buffers["hist_len"].zero_()
        self.buffers["queue_left"].zero_()

    def reseed(self, seed: int) -> None:
        """New noise (a branch's); the history and the queued actions stay as the capsule has them."""
        self.buffers["rng"].copy_(torch.tensor([int(seed), 0]))

    def load_observation(self, obs: Mapping[str, Any]) -> None:
        self._obs = _loaded(obs, self.spec.observation_keys, self.shapes)

    def act(self) -> torch.Tensor:
        """The next action `(1, A)` (a network call when the queue is empty)."""
        self._engine.act([self._obs], [0], self._engine.b["chunk"])
        return self.buffers["chunk"]

    @property
    def calls(self) -> int:
        return self._engine.calls

    def batched(self, n: int) -> LeRobotPolicyRows:
        """This policy for a host of n slots: one network call over n rows, the same model."""
        return LeRobotPolicyRows(self, n)


class _Rows(BufferComponent):
    def __init__(self, template: LeRobotPolicy, n: int) -> None:
        super().__init__()
        self.name, self.n, self.template = template.name, n, template

    def buffer_specs(self) -> list[BufferSpec]:
        t = self.template
        return [*state_specs(t.model, t.shapes, (self.n,)),
                BufferSpec("active", (self.n,), torch.int64, "cpu", Role.IO),
                BufferSpec("chunk", (self.n, 1, t.model.action_dim), torch.float32, "cpu", Role.IO)]

    def bind(self, buffers) -> None:
        super().bind(buffers)
        self.buffers["rng"].copy_(torch.tensor([self.template.seed, 0]).expand(self.n, 2))


class LeRobotPolicyRows:
    """N slots of one `LeRobotPolicy`: one model serves them all. A step's network call takes every row, padded to
    the next power of two, when the network gives a row the same actions wherever it sits in such a batch
    (`position_free`, checked when the rows are made); else each row that needs actions is computed alone. Either
    way a slot's actions do not depend on which slot it is or what the others hold, so a capsule restores into any
    slot (a row computed alone is also what a host of one slot computes)."""

    instances = 1

    def __init__(self, template: LeRobotPolicy, n: int) -> None:
        if n < 1:
            raise ValueError(f"a batched policy has at least one row, got {n}")
        self.template, self.rows, self.spec, self.device = template, n, template.spec, template.device
        self.model = template.model
        self._rows = _Rows(template, n)
        self.arena = Arena([self._rows]).allocate()
        self.buffers = self._rows.buffers
        batch = 1 << (n - 1).bit_length()
        self.batch = batch if n == 1 or position_free(self.model, template.shapes, batch) else 0
        self.mode = f"batched ({self.batch} rows a call)" if self.batch else "row by row"
        self._engine = _Engine(self.model, self.buffers, self.spec.observation_keys, self.batch)
        self._obs: list[dict[str, np.ndarray] | None] = [None] * n
        one_row = [s for s in template.buffer_specs() if s.role == Role.STATE]
        self.slots = [LeRobotPolicySlot(self, i, one_row) for i in range(n)]

    def slot(self, i: int) -> LeRobotPolicySlot:
        return self.slots[i]

    @property
    def calls(self) -> int:
        return self._engine.calls

    def act_rows(self, active: Sequence[int]) -> torch.Tensor:
        """Each active row's next action `(N, 1, A)` (rows not in `active` are left as they were)."""
        set_active(self.buffers["active"], active)
        self._engine.act(self._obs, active, self.buffers["chunk"])
        return self.buffers["chunk"]


class LeRobotPolicySlot(RowSlot):
    """Slot i of a `LeRobotPolicyRows`: the rollout protocol's policy, acting through row i."""

    def __init__(self, owner: LeRobotPolicyRows, index: int, specs) -> None:
        super().__init__(owner.template.name, owner.buffers, index, specs, owner.template.fingerprint())
        self.owner, self.spec, self.device = owner, owner.spec, owner.device

    def reset(self, episode_seed: int) -> None:
        self.reseed(episode_seed)
        self.rows["hist_len"][self.index].zero_()
        self.rows["queue_left"][self.index].zero_()

    def reseed(self, seed: int) -> None:
        self.row("rng").copy_(torch.tensor([[int(seed), 0]]))

    def load_observation(self, obs: Mapping[str, Any]) -> None:
        self.owner._obs[self.index] = _loaded(obs, self.spec.observation_keys, self.owner.template.shapes)

    def act(self) -> torch.Tensor:
        return self.owner.act_rows([self.index])[self.index]
