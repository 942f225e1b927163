"""Counter-based Gaussian noise whose whole state is two int64 words in a buffer.

`normal_(state, out)` fills `out` with N(0, 1) draws that depend only on
(seed, counter) and bumps the counter in place, with tensor ops only: no host
sync and no hidden generator, so it can be captured in a CUDA graph, and a capsule
that holds `state` reproduces the noise exactly. `normal_rows_` gives each row of
a batch its own stream (slots of a batched host), each equal to `normal_`'s.
"""

from __future__ import annotations

import math

import torch

from capsule_rollout.capsules.digest import mix_words

SEED, COUNTER = 0, 1
_KEY_MULT = -4658895280553007687  # odd 64-bit multiplier that separates seeds
_MANTISSA = (1 << 53) - 1


def make_state(seed: int, device: str | torch.device = "cpu") -> torch.Tensor:
    return torch.tensor([seed, 0], dtype=torch.int64, device=device)


def _uniform(key: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    bits = (mix_words(key, index) >> 11) & _MANTISSA
    return (bits.to(torch.float64) + 0.5) * (1.0 / (1 << 53))  # in (0, 1)


def normal_(state: torch.Tensor, out: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Fill `out` (float) with standard normals; `index` is `arange(out.numel())` (a static buffer)."""
    key = state[SEED] * _KEY_MULT + state[COUNTER]
    u1 = _uniform(key, 2 * index)
    u2 = _uniform(key, 2 * index + 1)
    z = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos((2.0 * math.pi) * u2)
    out.copy_(z.view(out.shape))
    state[COUNTER].add_(1)
    return out


def normal_rows_(state: torch.Tensor, out: torch.Tensor, index: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """Per-row streams: row r of `out` (R, F) gets the draws `normal_` gives for `state[r]` (R, 2), bit for bit;
    `index` is `arange(F)`. Only the counters of rows with `active` (R,) int64 == 1 advance, so a row that did
    not act keeps its stream where it was."""
    key = (state[:, SEED] * _KEY_MULT + state[:, COUNTER])[:, None]
    u1 = _uniform(key, (2 * index)[None])
    u2 = _uniform(key, (2 * index + 1)[None])
    z = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos((2.0 * math.pi) * u2)
    out.copy_(z.view(out.shape))
    state[:, COUNTER].add_(active)
    return out
