"""`FlowPolicy`: a small vision-language-action flow-matching policy.

Inputs: camera images `(B, H, W, 3) uint8` (one per camera), proprio state
`(B, S) float32`, a language embedding `(B, lang_dim)` (computed once per subtask
by `embed_language`), and a RECAP advantage indicator `(B,) int64` (0 = none /
dropped, 1 = positive, 2 = negative). Output: an action chunk `(B, T, A) float32`
made by K Euler steps of a learned velocity field from Gaussian noise
(flow matching: x_t = (1 - t) noise + t action, velocity target = action - noise).
Classifier-free guidance over the indicator: v = v_none + beta (v_cond - v_none).
State and action normalisation statistics are buffers, so they travel with the
weights in the checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from capsule_rollout.models.json_config import JsonConfig
from capsule_rollout.policies.rollout_policy import ADV_NEGATIVE, ADV_NONE, ADV_POSITIVE  # noqa: F401 (re-exported)
from capsule_rollout.tabletop.encoders import LanguageEncoder, VisionEncoder
from capsule_rollout.tabletop.tokenizer import Tokenizer


@dataclass(frozen=True)
class FlowPolicyConfig(JsonConfig):
    WHAT: ClassVar[str] = "policy config"
    RENAMED: ClassVar[dict[str, str]] = {"horizon": "chunk_length"}  # checkpoints written before the rename

    cameras: tuple[str, ...] = ("front",)
    image_size: int = 64
    state_dim: int = 8
    action_dim: int = 4
    chunk_length: int = 16  # T: actions per chunk
    denoise_steps: int = 10  # K: Euler steps per chunk
    channels: tuple[int, ...] = (32, 64, 64)
    vision_dim: int = 128
    lang_dim: int = 64
    max_tokens: int = 24
    hash_buckets: int = 256
    cond_dim: int = 256
    hidden: int = 256
    blocks: int = 3
    time_dim: int = 32
    subgoal_dim: int = 3  # auxiliary head: where the end effector will be when the subtask ends (0: none)

    def __post_init__(self) -> None:
        if not self.cameras:
            raise ValueError("the policy needs at least one camera")
        if self.chunk_length < 1 or self.denoise_steps < 1:
            raise ValueError("chunk_length and denoise_steps must be >= 1")


def time_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of t in [0, 1]: `(B,) -> (B, dim)`."""
    half = dim // 2
    freqs = torch.exp(torch.linspace(0.0, math.log(1000.0), half, device=t.device))
    angles = t[:, None] * freqs[None, :] * math.pi
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)


class _ResBlock(nn.Module):
    def __init__(self, hidden: int, cond_dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.film = nn.Linear(cond_dim, 2 * hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, hidden))

    def forward(self, h: torch.Tensor, film: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """`film`: `(gamma, beta)` of the conditioning (`self.film(cond).chunk(2, -1)`)."""
        gamma, beta = film
        return h + self.mlp(self.norm(h) * (1 + gamma) + beta)


class FlowPolicy(nn.Module):
    def __init__(self, config: FlowPolicyConfig = FlowPolicyConfig()) -> None:
        super().__init__()
        self.config = c = config
        self.tokenizer = Tokenizer(max_tokens=c.max_tokens, hash_buckets=c.hash_buckets)
        self.language = LanguageEncoder(self.tokenizer.vocab_size, max_tokens=c.max_tokens, out_dim=c.lang_dim)
        self.vision = nn.ModuleDict({
            cam: VisionEncoder(image_size=c.image_size, channels=c.channels, cond_dim=c.lang_dim, out_dim=c.vision_dim)
            for cam in c.cameras
        })
        self.state_in = nn.Sequential(nn.Linear(c.state_dim, 64), nn.SiLU())
        self.advantage = nn.Embedding(3, 16)
        cond_in = len(c.cameras) * c.vision_dim + 64 + c.lang_dim + 16
        self.cond = nn.Sequential(nn.Linear(cond_in, c.cond_dim), nn.SiLU(), nn.Linear(c.cond_dim, c.cond_dim))
        # Auxiliary subgoal head on the observation features: predicting where the
        # current subtask will end (e.g. the named block's position) gives the
        # vision encoder a direct, low-noise localisation signal during training.
        # It is not used to act.
        feat_dim = cond_in - 16
        self.subgoal = nn.Sequential(nn.Linear(feat_dim, c.cond_dim), nn.SiLU(), nn.Linear(c.cond_dim, c.subgoal_dim)) \
            if c.subgoal_dim else None
        flat = c.chunk_length * c.action_dim
        self.head_in = nn.Linear(flat + c.time_dim, c.hidden)
        self.blocks = nn.ModuleList([_ResBlock(c.hidden, c.cond_dim) for _ in range(c.blocks)])
        self.head_out = nn.Sequential(nn.LayerNorm(c.hidden), nn.Linear(c.hidden, flat))
        # normalisation statistics (set from data by `set_normalization`)
        self.register_buffer("state_mean", torch.zeros(c.state_dim))
        self.register_buffer("state_std", torch.ones(c.state_dim))
        self.register_buffer("action_low", -torch.ones(c.action_dim))
        self.register_buffer("action_high", torch.ones(c.action_dim))

    # -- normalisation ------------------------------------------------------------
    def set_normalization(self, states: torch.Tensor, actions: torch.Tensor) -> None:
        """Statistics from training data: states (N, S), actions (N, A)."""
        self.state_mean.copy_(states.mean(0))
        self.state_std.copy_(states.std(0).clamp(min=1e-3))
        low, high = actions.min(0).values, actions.max(0).values
        span = (high - low).clamp(min=1e-3)
        self.action_low.copy_(low)
        self.action_high.copy_(low + span)

    def normalize_actions(self, actions: torch.Tensor) -> torch.Tensor:
        return 2 * (actions - self.action_low) / (self.action_high - self.action_low) - 1

    def unnormalize_actions(self, x: torch.Tensor) -> torch.Tensor:
        return (x.clamp(-1, 1) + 1) / 2 * (self.action_high - self.action_low) + self.action_low

    # -- network ------------------------------------------------------------------
    def embed_language(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (B, L) int64 -> (B, lang_dim); computed once per subtask."""
        return self.language(tokens)

    def features(self, images: dict[str, torch.Tensor], state: torch.Tensor, lang: torch.Tensor) -> torch.Tensor:
        """Observation features (vision FiLM-ed by language, state, language): computed once per chunk."""
        feats = [self.vision[cam](images[cam], lang) for cam in self.config.cameras]
        s = self.state_in((state - self.state_mean) / self.state_std)
        return torch.cat([*feats, s, lang], dim=-1)

    def condition(self, features: torch.Tensor, advantage: torch.Tensor) -> torch.Tensor:
        """Conditioning vector for one advantage indicator (B,) int64."""
        return self.cond(torch.cat([features, self.advantage(advantage)], dim=-1))

    def films(self, cond: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each block's `(gamma, beta)` of `cond` `(B, cond_dim)`: constant over a chunk's integration steps."""
        return [tuple(block.film(cond).chunk(2, dim=-1)) for block in self.blocks]

    def velocity(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor, *,
                 films: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
                 t_embedding: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T*A) normalised actions at time t (B,) -> velocity (B, T*A). `films` (`self.films(cond)`) and
        `t_embedding` (`time_embedding(t)`), where given, are used instead of computing them again."""
        if t_embedding is None:
            t_embedding = time_embedding(t, self.config.time_dim)
        h = self.head_in(torch.cat([x, t_embedding], dim=-1))
        for block, film in zip(self.blocks, self.films(cond) if films is None else films):
            h = block(h, film)
        return self.head_out(h)

    def sample(self, cond: torch.Tensor, noise: torch.Tensor, *, cond_none: torch.Tensor | None = None,
               beta: torch.Tensor | float = 1.0) -> torch.Tensor:
        """Integrate from `noise` (B, T*A) to an action chunk (B, T, A) in K Euler steps.

        With `cond_none` (the same observation, indicator dropped) the velocity is
        guided: v_none + beta (v - v_none). The blocks' modulation of the conditioning is computed once per
        chunk, and each step's time embedding once for all rows (every row is at the same time): a row's
        numbers then never depend on how many rows there are.
        """
        k = self.config.denoise_steps
        x = noise
        b = x.shape[0]
        guided = cond_none is not None
        conds = torch.cat([cond, cond_none]) if guided else cond
        films = self.films(conds)
        for i in range(k):
            t = torch.full((1,), i / k, device=x.device, dtype=x.dtype)
            t_embedding = time_embedding(t, self.config.time_dim).expand(conds.shape[0], -1)
            t = t.expand(conds.shape[0])
            if not guided:
                v = self.velocity(x, t, cond, films=films, t_embedding=t_embedding)
            else:
                v_cond, v_none = self.velocity(torch.cat([x, x]), t, conds, films=films,
                                               t_embedding=t_embedding).chunk(2)
                v = v_none + beta * (v_cond - v_none)
            x = x + v / k
        return self.unnormalize_actions(x.view(b, self.config.chunk_length, self.config.action_dim))

    def loss(self, images: dict[str, torch.Tensor], state: torch.Tensor, lang: torch.Tensor, advantage: torch.Tensor,
             actions: torch.Tensor, *, samples_per_example: int = 4,
             generator: torch.Generator | None = None, subgoal: torch.Tensor | None = None,
             subgoal_weight: float = 1.0) -> torch.Tensor:
        """Flow-matching loss; each example's conditioning serves several (t, noise) draws.

        With `subgoal` (B, subgoal_dim): plus `subgoal_weight` times the mean squared
        error of the subgoal head, in units of the state's standard deviation.
        """
        features = self.features(images, state, lang)
        cond = self.condition(features, advantage)
        m, b = samples_per_example, actions.shape[0]
        x1 = self.normalize_actions(actions).reshape(b, -1).repeat(m, 1)
        cond = cond.repeat(m, 1)
        x0 = torch.randn(x1.shape, generator=generator, device=x1.device)
        t = torch.rand((x1.shape[0],), generator=generator, device=x1.device)
        xt = (1 - t[:, None]) * x0 + t[:, None] * x1
        loss = torch.mean((self.velocity(xt, t, cond) - (x1 - x0)) ** 2)
        if subgoal is not None and subgoal_weight and self.subgoal is not None:
            loss = loss + subgoal_weight * torch.mean((self.predict_subgoal(features) - subgoal) ** 2 /
                                                      self.state_std[: subgoal.shape[1]] ** 2)
        return loss

    def predict_subgoal(self, features: torch.Tensor) -> torch.Tensor:
        """Where the end effector will be when the current subtask ends (B, subgoal_dim), in state units."""
        if self.subgoal is None:
            raise ValueError("this policy was built without a subgoal head (subgoal_dim=0)")
        d = self.config.subgoal_dim
        return self.subgoal(features) * self.state_std[:d] + self.state_mean[:d]


KIND = "flow_policy"


def load_policy(directory: str, device: str = "cpu") -> FlowPolicy:
    """A `FlowPolicy` from a checkpoint directory (config and weights validated)."""
    from capsule_rollout.models.checkpoint import load_model

    return load_model(directory, kind=KIND, config_cls=FlowPolicyConfig, model_cls=FlowPolicy, device=device)
