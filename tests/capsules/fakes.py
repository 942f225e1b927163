"""Fake components for capsule tests; fake contents come from each buffer's own spec."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from capsule_rollout.capsules import Arena, BufferComponent, BufferSpec


def random_like_spec(spec: BufferSpec, gen: torch.Generator) -> torch.Tensor:
    """Random contents valid for `spec`'s dtype (booleans stay 0/1)."""
    if spec.dtype is torch.bool:
        return torch.randint(0, 2, spec.shape, generator=gen).bool()
    if spec.dtype.is_floating_point:
        return torch.randn(spec.shape, generator=gen).to(spec.dtype)
    info = torch.iinfo(spec.dtype)
    return torch.randint(max(info.min, -(2**31)), min(info.max, 2**31 - 1), spec.shape, generator=gen).to(spec.dtype)


class SpecComponent(BufferComponent):
    """Declares the given specs; records hook calls; fingerprint is configurable."""

    def __init__(self, name: str, specs: Sequence[BufferSpec], fingerprint: Mapping[str, str] | None = None):
        super().__init__()
        self.name = name
        self._specs = list(specs)
        self._fp = dict(fingerprint or {"weights": "w0"})
        self.calls: list[str] = []

    def buffer_specs(self) -> list[BufferSpec]:
        return self._specs

    def fingerprint(self) -> Mapping[str, str]:
        return self._fp

    def before_snapshot(self) -> None:
        self.calls.append("before_snapshot")

    def after_restore(self) -> None:
        self.calls.append("after_restore")


def fill_state(arena: Arena, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for key, spec in arena.specs.items():
        arena.buffer(key).copy_(random_like_spec(spec, gen))


def state_copy(arena: Arena) -> dict[str, torch.Tensor]:
    from capsule_rollout.capsules import Role

    return {k: v.clone() for k, v in arena.buffers(Role.STATE).items()}


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN-safe) of two tensors of the same dtype/shape."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    flat = lambda t: t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)  # noqa: E731
    return torch.equal(flat(a), flat(b))


def basic_specs(device: str = "cpu") -> list[BufferSpec]:
    from capsule_rollout.capsules import Role

    return [
        BufferSpec("h", (2, 3), torch.float32, device),
        BufferSpec("bf", (5,), torch.bfloat16, device),
        BufferSpec("mask", (7,), torch.bool, device),
        BufferSpec("count", (), torch.int64, device),
        BufferSpec("img", (4, 4, 3), torch.uint8, device),
        BufferSpec("x", (3,), torch.float32, device, Role.IO),
        BufferSpec("tmp", (9,), torch.float64, device, Role.SCRATCH),
    ]


def make_arena(name: str = "comp", fingerprint: Mapping[str, str] | None = None, device: str = "cpu",
               specs: Sequence[BufferSpec] | None = None) -> tuple[Arena, SpecComponent]:
    comp = SpecComponent(name, specs if specs is not None else basic_specs(device), fingerprint)
    return Arena([comp]).allocate(), comp
