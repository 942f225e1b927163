"""`ValueCritic`: a distributional value over 201 bins in [-1, 0].

Inputs: camera images `(B, H, W, 3) uint8`, state `(B, S) float32`, a language
embedding `(B, lang_dim)` (computed once per subtask) and, when `episode_limit` is set,
the control step within the episode `(B,)`: episodes end in failure at the step
limit, so the value of a state depends on how much time is left (Pardo et al.,
"Time Limits in Reinforcement Learning", 2018), and a critic that cannot see the
clock cannot tell a slow failure from an on-time success; and, when `actor_input`
is set, who acts from this state on (`ACTOR_DEMONSTRATOR` or `ACTOR_POLICY`): a
demonstrator and the policy reach different returns from the same state, and a
critic fitted to both at once predicts neither; and, when `plan_steps` is set, the
actions the actor is about to execute (a Q on the plan; with no plan given the same
network values the state alone); and, when `privileged_dim` is set, the simulator's
privileged state `(B, P)` (an env's `privileged` observation: object poses a robot does
not sense; in sim, for labels and takeovers, while the policy sees only what a robot
sees). Output: logits
`(B, bins)`; the scalar value is the expectation over the bin centres. Values are
normalised returns: -(steps left to success) / max episode length, failures -1.
Trained with cross-entropy against a two-hot target (the return split between its
two neighbouring bins).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

# who acts from a state on (CriticConfig.actor_input), as the recorded episodes say
from capsule_rollout.critics.returns import ACTOR_DEMONSTRATOR, ACTOR_POLICY
from capsule_rollout.models.json_config import JsonConfig
from capsule_rollout.tabletop.encoders import LanguageEncoder, VisionEncoder
from capsule_rollout.tabletop.tokenizer import Tokenizer


@dataclass(frozen=True)
class CriticConfig(JsonConfig):
    WHAT: ClassVar[str] = "critic config"
    RENAMED: ClassVar[dict[str, str]] = {"horizon": "episode_limit"}  # checkpoints written before the rename

    cameras: tuple[str, ...] = ("front",)
    image_size: int = 64
    state_dim: int = 8
    channels: tuple[int, ...] = (32, 64, 64)
    vision_dim: int = 128
    lang_dim: int = 64
    max_tokens: int = 24
    hash_buckets: int = 256
    hidden: int = 256
    bins: int = 201
    v_min: float = -1.0
    v_max: float = 0.0
    episode_limit: int = 0
    """Episode step limit the value is conditioned on (the input is step / episode_limit); 0: no time
    input, as in checkpoints written before it existed."""
    actor_input: bool = False
    """The critic also reads who acts from the state on (0: a demonstrator, 1: the policy, with any
    operator takeovers), so demonstrations and rollouts train one critic without mixing their returns;
    at run time it judges the policy. False: as in checkpoints written before it existed."""
    plan_steps: int = 0
    """The critic can also read the first `plan_steps` actions the actor is about to execute from the
    state (a Q on the plan, `(B, plan_steps, action_dim)`); without a plan (a row of NaN, or none at all)
    it gives the value of the state alone, so one network serves both (trained with the plan dropped
    out). 0: the state alone, as in checkpoints written before it existed."""
    action_dim: int = 4
    """Size of one action of the plan."""
    privileged_dim: int = 0
    """The critic also reads the env's `privileged` observation, a vector of this size (the sim's object and
    gripper poses); 0: what a robot senses only, as in checkpoints written before it existed."""

    def __post_init__(self) -> None:
        if self.bins < 2 or self.v_min >= self.v_max:
            raise ValueError("need bins >= 2 and v_min < v_max")
        if self.episode_limit < 0:
            raise ValueError(f"episode_limit must be >= 0 (0: no time input), got {self.episode_limit}")
        if self.privileged_dim < 0:
            raise ValueError(f"privileged_dim must be >= 0 (0: no privileged input), got {self.privileged_dim}")
        if self.plan_steps < 0 or self.action_dim < 1:
            raise ValueError(f"plan_steps must be >= 0 (0: no plan input) and action_dim >= 1, "
                             f"got {self.plan_steps} and {self.action_dim}")



class ValueCritic(nn.Module):
    def __init__(self, config: CriticConfig = CriticConfig()) -> None:
        super().__init__()
        self.config = c = config
        self.tokenizer = Tokenizer(max_tokens=c.max_tokens, hash_buckets=c.hash_buckets)
        self.language = LanguageEncoder(self.tokenizer.vocab_size, max_tokens=c.max_tokens, out_dim=c.lang_dim)
        self.vision = nn.ModuleDict({
            cam: VisionEncoder(image_size=c.image_size, channels=c.channels, cond_dim=c.lang_dim, out_dim=c.vision_dim)
            for cam in c.cameras
        })
        self.state_in = nn.Sequential(nn.Linear(c.state_dim + int(c.episode_limit > 0) + int(c.actor_input), 64), nn.SiLU())
        width = len(c.cameras) * c.vision_dim + 64 + c.lang_dim
        if c.plan_steps:
            self.plan_in = nn.Sequential(nn.Linear(c.plan_steps * c.action_dim, 64), nn.SiLU())
            self.no_plan = nn.Parameter(torch.zeros(64))  # stands in for the plan where none is given
            width += 64
        if c.privileged_dim:
            self.privileged_in = nn.Sequential(nn.Linear(c.privileged_dim, 128), nn.SiLU(), nn.Linear(128, 64),
                                               nn.SiLU())
            width += 64
        self.head = nn.Sequential(
            nn.Linear(width, c.hidden), nn.SiLU(), nn.LayerNorm(c.hidden),
            nn.Linear(c.hidden, c.hidden), nn.SiLU(), nn.Linear(c.hidden, c.bins),
        )
        self.register_buffer("support", torch.linspace(c.v_min, c.v_max, c.bins))
        self.register_buffer("state_mean", torch.zeros(c.state_dim))
        self.register_buffer("state_std", torch.ones(c.state_dim))
        if c.privileged_dim:
            self.register_buffer("privileged_mean", torch.zeros(c.privileged_dim))
            self.register_buffer("privileged_std", torch.ones(c.privileged_dim))

    def set_normalization(self, states: torch.Tensor, privileged: torch.Tensor | None = None) -> None:
        self.state_mean.copy_(states.mean(0))
        self.state_std.copy_(states.std(0).clamp(min=1e-3))
        if self.config.privileged_dim:
            self.privileged_mean.copy_(privileged.mean(0))
            self.privileged_std.copy_(privileged.std(0).clamp(min=1e-3))

    def load_backbone(self, policy: nn.Module) -> list[str]:
        """Start the vision encoders (cameras both models see) and the language encoder from a policy's.

        The policy's encoders were trained on every demonstration and rollout to act; a critic
        fitted on noisy Monte-Carlo returns learns faster from those features than from scratch
        (pi*0.6 starts its value function from the VLA's backbone). Returns the modules copied.
        """
        mine, theirs = self.tokenizer.to_json(), getattr(policy, "tokenizer", None)
        if theirs is None or theirs.to_json() != mine:
            raise ValueError("the policy's tokenizer differs from the critic's (vocabulary, max_tokens or "
                             "hash_buckets): its language encoder would read other token ids")
        pairs = [("language", self.language, getattr(policy, "language", None))]
        shared = [cam for cam in self.config.cameras if cam in getattr(policy, "vision", {})]
        if not shared:
            raise ValueError(f"the policy sees none of the critic's cameras {list(self.config.cameras)}")
        pairs += [(f"vision.{cam}", self.vision[cam], policy.vision[cam]) for cam in shared]
        for name, dst, src in pairs:
            want = {k: tuple(v.shape) for k, v in dst.state_dict().items()}
            have = {k: tuple(v.shape) for k, v in src.state_dict().items()} if src is not None else {}
            if want != have:
                diff = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
                raise ValueError(f"the policy's {name} encoder does not fit the critic's (differs at {diff[:4]}): "
                                 "give both the same channels, vision_dim, lang_dim and image_size")
            dst.load_state_dict(src.state_dict())
        return [name for name, _, _ in pairs]

    def embed_language(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.language(tokens)

    def logits(self, images: dict[str, torch.Tensor], state: torch.Tensor, lang: torch.Tensor,
               step: torch.Tensor | None = None, actor: torch.Tensor | None = None,
               plan: torch.Tensor | None = None, privileged: torch.Tensor | None = None) -> torch.Tensor:
        """`step` `(B,)`: control steps since the episode started (needed when `episode_limit` is set);
        `actor` `(B,)`: who acts from the state on, ACTOR_DEMONSTRATOR or ACTOR_POLICY (needed when
        `actor_input` is set); `plan` `(B, plan_steps, action_dim)`: the actions about to be executed
        (read when `plan_steps` is set; None, or a row holding any NaN: the value of the state alone);
        `privileged` `(B, privileged_dim)`: the env's privileged observation (needed when `privileged_dim` is set)."""
        feats = [self.vision[cam](images[cam], lang) for cam in self.config.cameras]
        s = (state - self.state_mean) / self.state_std
        if self.config.episode_limit:
            if step is None:
                raise ValueError(f"this critic reads the episode step (limit {self.config.episode_limit}); "
                                 "pass step= (control steps since the episode started)")
            s = torch.cat([s, (step.to(s.dtype) / self.config.episode_limit)[:, None]], dim=-1)
        if self.config.actor_input:
            if actor is None:
                raise ValueError("this critic reads who acts (actor_input); pass actor= "
                                 f"({ACTOR_DEMONSTRATOR}: a demonstrator, {ACTOR_POLICY}: the policy)")
            s = torch.cat([s, actor.to(s.dtype)[:, None]], dim=-1)
        parts = [*feats, self.state_in(s), lang]
        if self.config.plan_steps:
            parts.append(self.plan_features(plan, state.shape[0]))
        elif plan is not None:
            raise ValueError("this critic reads no plan (plan_steps 0); train one with --plan_steps to give it one")
        if self.config.privileged_dim:
            if privileged is None:
                raise ValueError(f"this critic reads the sim's privileged state ({self.config.privileged_dim} "
                                 "numbers, the env's `privileged` observation); pass privileged=")
            parts.append(self.privileged_in((privileged - self.privileged_mean) / self.privileged_std))
        return self.head(torch.cat(parts, dim=-1))

    def plan_features(self, plan: torch.Tensor | None, batch: int) -> torch.Tensor:
        """`(B, 64)` features of the plan; the learned no-plan vector for rows without one."""
        c = self.config
        if plan is None:
            return self.no_plan.expand(batch, -1)
        if plan.dim() != 3 or plan.shape[1:] != (c.plan_steps, c.action_dim):
            raise ValueError(f"plan must be (B, {c.plan_steps}, {c.action_dim}): the first {c.plan_steps} "
                             f"actions about to be executed; got {tuple(plan.shape)}")
        given = torch.isfinite(plan).flatten(1).all(dim=1)
        feats = self.plan_in(torch.nan_to_num(plan, nan=0.0, posinf=0.0, neginf=0.0).flatten(1))
        return torch.where(given[:, None], feats, self.no_plan.expand_as(feats))

    def value(self, logits: torch.Tensor) -> torch.Tensor:
        """Expected value (B,) of the distribution given by `logits` (B, bins)."""
        return torch.softmax(logits, dim=-1) @ self.support

    def two_hot(self, target: torch.Tensor) -> torch.Tensor:
        """(B,) values -> (B, bins) probabilities on the two neighbouring bins (exact expectation)."""
        c = self.config
        pos = (target.clamp(c.v_min, c.v_max) - c.v_min) / (c.v_max - c.v_min) * (c.bins - 1)
        lo = pos.floor().long().clamp(max=c.bins - 2)
        frac = pos - lo
        out = torch.zeros(target.shape[0], c.bins, device=target.device)
        out.scatter_(1, lo[:, None], (1 - frac)[:, None])
        out.scatter_add_(1, (lo + 1)[:, None], frac[:, None])
        return out

    def loss(self, images: dict[str, torch.Tensor], state: torch.Tensor, lang: torch.Tensor,
             target: torch.Tensor, step: torch.Tensor | None = None,
             actor: torch.Tensor | None = None, plan: torch.Tensor | None = None,
             privileged: torch.Tensor | None = None) -> torch.Tensor:
        return self.loss_from_logits(self.logits(images, state, lang, step, actor, plan, privileged), target)

    def loss_from_logits(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of `logits` (B, bins) against the two-hot targets of `target` (B,)."""
        return torch.mean(torch.sum(-self.two_hot(target) * F.log_softmax(logits, dim=-1), dim=-1))


KIND = "value_critic"


def load_critic(directory: str, device: str = "cpu") -> ValueCritic:
    """A `ValueCritic` from a checkpoint directory (config and weights validated)."""
    from capsule_rollout.models.checkpoint import load_model

    return load_model(directory, kind=KIND, config_cls=CriticConfig, model_cls=ValueCritic, device=device)
