"""`StateMLP`: a small state -> action-chunk network, an example of what `TorchPolicy` runs.

`forward(inputs, noise)` reads `inputs["state"]` `(B, D)`, normalises it with the
training set's mean and std (buffers, saved with the weights) and returns a chunk
`(B, T, A)` in [-1, 1] (tanh); it is deterministic and ignores `noise`.
"""

from __future__ import annotations

import torch
from torch import nn


class StateMLP(nn.Module):
    def __init__(self, state_dim: int, action_dim: int, chunk_length: int, hidden: int = 256, layers: int = 3) -> None:
        super().__init__()
        self.state_dim, self.action_dim, self.chunk_length = state_dim, action_dim, chunk_length
        dims = [state_dim] + [hidden] * layers
        blocks: list[nn.Module] = []
        for a, b in zip(dims[:-1], dims[1:]):
            blocks += [nn.Linear(a, b), nn.GELU()]
        self.body = nn.Sequential(*blocks, nn.Linear(dims[-1], action_dim * chunk_length))
        self.register_buffer("mean", torch.zeros(state_dim))
        self.register_buffer("std", torch.ones(state_dim))

    def set_normalization(self, states: torch.Tensor) -> None:
        """Mean and std of the training states (std floored, so constant inputs stay finite)."""
        self.mean.copy_(states.mean(0))
        self.std.copy_(states.std(0).clamp_min(1e-3))

    def forward(self, inputs: dict[str, torch.Tensor], noise: torch.Tensor | None = None) -> torch.Tensor:
        x = (inputs["state"].float() - self.mean) / self.std
        return torch.tanh(self.body(x)).view(-1, self.chunk_length, self.action_dim)
