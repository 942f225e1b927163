"""Bit-exactness harness for anything whose state lives in an arena.

For a `Steppable` (an arena plus `step(inputs) -> outputs`), `verify_steppable`
checks that restoring a capsule reproduces the same future bit for bit:

1. restore: snapshot -> step k -> dirty every live buffer -> restore -> step k;
2. idempotence: the same with the capsule restored twice in a row;
3. fork: the capsule restored into this arena and a second instance's arena; the
   branches step interleaved on different inputs and must not affect each other;
4. the capsule itself is never written (its digests are unchanged at the end);
5. restores happen in place (slab addresses unchanged).

A failed check names the first output that differs (`first_difference`): the step, the key and the element with
both values, an image (`(H, W, C)` uint8) by pixel and channel with the count of pixels that differ.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Protocol

import numpy as np
import torch

from capsule_rollout.capsules.arena import Arena
from capsule_rollout.capsules.capsule import Capsule, fork, restore, snapshot

Outputs = dict[str, torch.Tensor]


class Steppable(Protocol):
    """A component (or several) in one arena, driven one step at a time."""

    name: str
    arena: Arena

    def sample_inputs(self, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """Inputs for one step, drawn from `generator` (same generator -> same inputs)."""
        ...

    def step(self, inputs: Mapping[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
        """Advance one step; outputs may be views of io buffers (the harness copies them)."""
        ...

    def scramble(self, generator: torch.Generator) -> None:
        """Dirty live state kept outside the arena (no-op if there is none)."""
        ...


@dataclass
class VerifyReport:
    name: str
    bit_exact: bool
    max_abs_diff: float
    cosine: float
    capsule_bytes: int
    checks: dict[str, bool] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    steps: int = 0
    divergences: dict[str, str] = field(default_factory=dict)  # check -> the first output that differs
    device: str = "cpu"

    def to_json(self) -> dict:
        return asdict(self)


def is_image(a: np.ndarray) -> bool:
    """An `(H, W, C)` uint8 picture (C = 1, 3 or 4)."""
    return a.dtype == np.uint8 and a.ndim == 3 and a.shape[2] in (1, 3, 4)


def _value(x: np.generic) -> str:
    return repr(x.item()) if isinstance(x, np.generic) else repr(x)


def first_difference(key: str, ref: np.ndarray, got: np.ndarray) -> str | None:
    """Where `got` first differs from `ref` bit for bit (NaN-safe), as `key[i]: a vs b, n of m values differ`; an
    image by pixel: `key[row, column, channel]: a vs b, n of H x W pixels differ`. None when identical."""
    if ref.shape != got.shape or ref.dtype != got.dtype:
        return f"{key}: {ref.shape} {ref.dtype} vs {got.shape} {got.dtype}"
    a, b = ref.reshape(-1), got.reshape(-1)
    if a.dtype == np.bool_ or a.dtype.itemsize not in (1, 2, 4, 8):  # flags, text
        differ = a != b
    else:
        bits = np.dtype(f"u{a.itemsize}")
        differ = np.ascontiguousarray(a).view(bits) != np.ascontiguousarray(b).view(bits)
    where = np.flatnonzero(differ)
    if not where.size:
        return None
    i = int(where[0])
    if is_image(ref):
        row, col, channel = np.unravel_index(i, ref.shape)
        pixels = int(differ.reshape(ref.shape).any(axis=2).sum())
        return (f"{key}[{row}, {col}, {channel}]: {_value(a[i])} vs {_value(b[i])}, {pixels:,} of "
                f"{ref.shape[0] * ref.shape[1]:,} pixels differ")
    index = "" if ref.ndim == 0 else f"[{', '.join(str(int(n)) for n in np.unravel_index(i, ref.shape))}]"
    return f"{key}{index}: {_value(a[i])} vs {_value(b[i])}, {where.size:,} of {a.size:,} values differ"


class _Comparison:
    """Accumulates bit-exactness, max |diff| and cosine over many tensor pairs, and the first pair that
    differs (`first`, reset by whoever reads it)."""

    def __init__(self) -> None:
        self.max_abs_diff = 0.0
        self._dot = self._ref_sq = self._got_sq = 0.0
        self.first: str | None = None

    def same(self, ref: torch.Tensor, got: torch.Tensor, key: str = "") -> bool:
        if ref.shape != got.shape or ref.dtype != got.dtype:
            self.max_abs_diff = math.inf
            self.first = self.first or f"{key}: {tuple(ref.shape)} {ref.dtype} vs {tuple(got.shape)} {got.dtype}"
            return False
        r = ref.detach().to("cpu").reshape(-1)
        g = got.detach().to("cpu").reshape(-1)
        bitwise = _bits(r) == _bits(g)
        r64 = torch.nan_to_num(r.double(), nan=0.0, posinf=0.0, neginf=0.0)
        g64 = torch.nan_to_num(g.double(), nan=0.0, posinf=0.0, neginf=0.0)
        diff = torch.where(bitwise, 0.0, (r.double() - g.double()).abs().nan_to_num(nan=math.inf))
        if diff.numel():
            self.max_abs_diff = max(self.max_abs_diff, float(diff.max()))
        self._dot += float((r64 * g64).sum())
        self._ref_sq += float((r64 * r64).sum())
        self._got_sq += float((g64 * g64).sum())
        ok = bool(bitwise.all())
        if not ok and self.first is None and ref.dtype is not torch.bfloat16:
            self.first = first_difference(key, ref.detach().to("cpu").numpy(), got.detach().to("cpu").numpy())
        elif not ok and self.first is None:
            self.first = f"{key}: differs"
        return ok

    def same_all(self, ref: list[Outputs], got: list[Outputs], what: str | None = None) -> bool:
        """Every output of every step bit-identical; `what` names the outputs (default: `step i`)."""
        if len(ref) != len(got):
            return False
        ok = True
        for step, (r, g) in enumerate(zip(ref, got)):
            if r.keys() != g.keys():
                ok = False
                self.first = self.first or f"step {step}: outputs {sorted(r)} vs {sorted(g)}"
                continue
            # images first: the first difference named is a pixel rather than the state flattening it
            for k in sorted(r, key=lambda k: not (r[k].dtype == torch.uint8 and r[k].dim() == 3
                                                  and r[k].shape[2] in (1, 3, 4))):
                ok &= self.same(r[k], g[k], f"{what or f'step {step}'} {k}")
        return ok

    @property
    def cosine(self) -> float:
        if self._ref_sq == 0.0 and self._got_sq == 0.0:
            return 1.0
        if self._ref_sq == 0.0 or self._got_sq == 0.0:
            return 0.0
        return self._dot / math.sqrt(self._ref_sq * self._got_sq)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Elements reinterpreted as integers of the same width (NaN-safe equality)."""
    by_size = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    if t.dtype is torch.bool:
        return t.view(torch.uint8)
    return t.contiguous().view(by_size[t.element_size()])


def _run(target: Steppable, inputs: list[dict[str, torch.Tensor]]) -> list[Outputs]:
    return [{k: v.detach().clone() for k, v in target.step(x).items()} for x in inputs]


def _state(target: Steppable, step: int) -> Outputs:
    capsule = snapshot(target.arena, step=step, force=True, digest=False)
    return {k: v.clone() for k, v in capsule.tensors().items()}


def _addresses(arena: Arena) -> list[int]:
    return [slab.data_ptr() for _, slab in arena.slabs()]


def verify_steppable(
    factory: Callable[[], Steppable], *, steps: int = 8, warmup: int = 3, seed: int = 0
) -> VerifyReport:
    """Run every check on instances made by `factory`; never raises for a failed check."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    gen = torch.Generator().manual_seed(seed)
    a = factory()
    align = a.arena.alignment()
    boundary = math.ceil(warmup / align) * align
    warm = [a.sample_inputs(gen) for _ in range(boundary)]
    xs = [a.sample_inputs(gen) for _ in range(steps)]
    ys = [a.sample_inputs(gen) for _ in range(steps)]
    device = "+".join(sorted({torch.device(lay.device).type for lay, _ in a.arena.slabs()}))
    report = VerifyReport(a.name, False, math.inf, 0.0, 0, steps=steps, device=device)
    cmp = _Comparison()
    try:
        _run(a, warm)
        capsule: Capsule = snapshot(a.arena, label=f"verify:{a.name}", step=boundary)
        report.capsule_bytes = capsule.nbytes
        recorded = dict(capsule.digests)
        addresses = _addresses(a.arena)
        ref_out, ref_state = _run(a, xs), _state(a, boundary + steps)

        def replay() -> bool:
            return cmp.same_all(ref_out, _run(a, xs)) & cmp.same_all([ref_state], [_state(a, boundary + steps)],
                                                                     "the capsule's state after the steps:")

        def check(name: str, ok: bool) -> None:
            report.checks[name] = ok
            if not ok and cmp.first is not None:
                report.divergences[name] = cmp.first
            cmp.first = None

        a.arena.fill_random_(gen)
        a.scramble(gen)
        restore(a.arena, capsule)
        check("restore_after_dirty", replay())

        a.arena.fill_random_(gen)
        a.scramble(gen)
        restore(a.arena, capsule)
        restore(a.arena, capsule)
        check("restore_idempotent", replay())

        b = factory()
        fork(capsule, [a.arena, b.arena])
        outs_a, outs_b = [], []
        for x, y in zip(xs, ys):  # interleaved: aliasing between branches would show
            outs_a.append({k: v.detach().clone() for k, v in a.step(y).items()})
            outs_b.append({k: v.detach().clone() for k, v in b.step(x).items()})
        check("fork_branch_exact", cmp.same_all(ref_out, outs_b) & cmp.same_all(
            [ref_state], [_state(b, boundary + steps)], "the capsule's state after the steps:"))
        restore(a.arena, capsule)
        check("fork_branches_independent", cmp.same_all(_run(a, ys), outs_a))

        report.checks["capsule_untouched"] = capsule.compute_digests() == recorded
        report.checks["addresses_static"] = _addresses(a.arena) == addresses
    except Exception as exc:  # a verify report must say what broke, not crash the table
        report.failures.append(f"{type(exc).__name__}: {exc}")
    report.failures += [f"check failed: {name}" + (f" ({report.divergences[name]})" if name in report.divergences
                                                   else "") for name, ok in report.checks.items() if not ok]
    report.bit_exact = bool(report.checks) and not report.failures
    report.max_abs_diff = cmp.max_abs_diff
    report.cosine = cmp.cosine
    return report
