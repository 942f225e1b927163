"""Fingerprint values for what a capsule is bound to (e.g. a model's weights)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch


def tensors_sha256(tensors: Mapping[str, torch.Tensor]) -> str:
    """sha256 (32 hex chars) over names, dtypes, shapes and bytes of `tensors`, in name order."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:32]


def module_sha256(module: torch.nn.Module) -> str:
    """Fingerprint of a module's parameters and buffers."""
    return tensors_sha256(module.state_dict())
