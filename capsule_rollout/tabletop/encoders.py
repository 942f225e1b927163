"""Encoders shared by the policy and the critic.

- `LanguageEncoder`: token ids `(B, L) int64` -> `(B, out_dim) float32` (embeddings,
  one transformer layer, masked mean).
- `VisionEncoder`: image `(B, H, W, 3) uint8` + conditioning `(B, cond_dim)` ->
  `(B, out_dim)`; pixel coordinates appended as two channels, three conv blocks,
  each modulated by FiLM from the conditioning (language decides which block
  matters), then spatial-softmax keypoints and a global average.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from capsule_rollout.models.exact_sums import ExactWeights, exact_linear


class LanguageEncoder(nn.Module):
    def __init__(self, vocab_size: int, *, max_tokens: int, dim: int = 64, out_dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim, padding_idx=0)
        self.pos = nn.Parameter(torch.randn(max_tokens, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=2 * dim, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=False)
        self.out = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, out_dim))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        pad = tokens == 0
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        # A fully padded row (empty text) would make attention NaN: let it attend to position 0.
        safe_pad = pad.clone()
        safe_pad[:, 0] = False
        h = self.encoder(x, src_key_padding_mask=safe_pad)
        keep = (~pad).unsqueeze(-1).to(h.dtype)
        pooled = (h * keep).sum(1) / keep.sum(1).clamp(min=1.0)
        return self.out(pooled)


class FiLM(nn.Module):
    """Feature-wise affine modulation; starts as the identity."""

    def __init__(self, cond_dim: int, channels: int) -> None:
        super().__init__()
        self.proj = nn.Linear(cond_dim, 2 * channels)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        gamma, beta = self.proj(cond).chunk(2, dim=-1)
        shape = (x.shape[0], -1) + (1,) * (x.dim() - 2)
        return x * (1 + gamma.view(shape)) + beta.view(shape)


class SpatialSoftmax(nn.Module):
    """Expected (x, y) in [-1, 1] of each channel's activation: `(B, C, H, W) -> (B, 2C)`."""

    def __init__(self, height: int, width: int) -> None:
        super().__init__()
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, height), torch.linspace(-1, 1, width), indexing="ij")
        self.register_buffer("grid", torch.stack([xs.reshape(-1), ys.reshape(-1)], dim=-1), persistent=False)
        self.log_temperature = nn.Parameter(torch.zeros(()))
        self.exact_bits_in = 0  # set by `exact_sums`

    def exact_sums(self) -> None:
        """Sum the expectation over the grid exactly (`models.runtime.invariant_copy`): a row's keypoints then do
        not depend on the batch beside it."""
        weights = ExactWeights(self.grid.t(), None)
        weights.register(self, "exact_grid")
        self.exact_bits_in = weights.bits_in

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c = x.shape[:2]
        attn = torch.softmax(x.reshape(b, c, -1) / self.log_temperature.exp(), dim=-1)
        if self.exact_bits_in:
            points = exact_linear(attn, self.exact_grid_t, None, self.exact_bits_in)
        else:
            points = attn @ self.grid
        return points.reshape(b, 2 * c)


class VisionEncoder(nn.Module):
    def __init__(self, *, image_size: int, channels: tuple[int, ...] = (32, 64, 64), cond_dim: int = 64,
                 out_dim: int = 128) -> None:
        super().__init__()
        c0, c1, c2 = channels
        # two coordinate channels (x, y in [-1, 1]) help the convolutions localise
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, image_size), torch.linspace(-1, 1, image_size), indexing="ij")
        self.register_buffer("coords", torch.stack([xs, ys])[None], persistent=False)
        self.convs = nn.ModuleList([
            nn.Conv2d(5, c0, 5, stride=2, padding=2),
            nn.Conv2d(c0, c1, 3, stride=2, padding=1),
            nn.Conv2d(c1, c2, 3, stride=1, padding=1),
        ])
        self.norms = nn.ModuleList([nn.GroupNorm(8, c) for c in channels])
        self.films = nn.ModuleList([FiLM(cond_dim, c) for c in channels])
        self.act = nn.SiLU()  # a module: the batch-invariant copy aligns its rows (`models.runtime.ACTIVATIONS`)
        side = math.ceil(math.ceil(image_size / 2) / 2)
        self.keypoints = SpatialSoftmax(side, side)
        self.out = nn.Sequential(nn.Linear(3 * c2, out_dim), nn.LayerNorm(out_dim), nn.SiLU())

    def forward(self, images: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        x = images.permute(0, 3, 1, 2).to(torch.float32) / 255.0 - 0.5
        x = torch.cat([x, self.coords.expand(x.shape[0], -1, -1, -1)], dim=1)
        for conv, norm, film in zip(self.convs, self.norms, self.films):
            x = film(self.act(norm(conv(x))), cond)
        feats = torch.cat([self.keypoints(x), x.mean(dim=(2, 3))], dim=-1)
        return self.out(feats)


def random_shift(images: torch.Tensor, pad: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Shift each image by up to `pad` pixels (edges replicated): `(B, H, W, 3) uint8` in and out."""
    b, h, w, _ = images.shape
    x = F.pad(images.permute(0, 3, 1, 2).float(), (pad, pad, pad, pad), mode="replicate")
    dx = torch.randint(0, 2 * pad + 1, (b,), generator=generator)
    dy = torch.randint(0, 2 * pad + 1, (b,), generator=generator)
    rows = (dy[:, None] + torch.arange(h)[None, :]).to(images.device)  # (B, H)
    cols = (dx[:, None] + torch.arange(w)[None, :]).to(images.device)  # (B, W)
    idx_b = torch.arange(b, device=images.device)[:, None, None]
    out = x[idx_b, :, rows[:, :, None], cols[:, None, :]]  # (B, H, W, 3)
    return out.to(torch.uint8)
