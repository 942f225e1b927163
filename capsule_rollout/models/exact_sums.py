"""Layers whose sums are exact: a row's result cannot depend on the batch, its position or the CPU's kernels.

A matrix product's rounding depends on the order of its sums, and the order is the library's choice: it picks
kernels by the number of rows, the instruction set (AVX2, AVX-512, AMX), split-K, the tile a row falls in. Here
the order does not matter because no sum rounds:

- each input row is put on a grid of its own: rounded to a multiple of `2^(e - bits_in)`, where `2^e` bounds
  the row's largest magnitude (the row alone decides its grid), at most `2^(bits_in + 1)` steps;
- each weight column (one output feature) is put on its grid once, at most `2^bits_w` steps;
- so every product is an integer times the product of the two grid steps, and a sum of `K` of them is an
  integer of at most `log2(K) + bits_in + 1 + bits_w <= 53` bits times that step: float64 holds every partial
  sum exactly, in any order, with or without fused multiply-add.

The exact sum is then rounded once, to float64 with the bias added, then to float32. The grid costs the input a
few bits below float32's 24 near a row's largest entry (21 bits for the widest layer of the shipped models): a
perturbation of the order of float32's own rounding, the same on every machine. What is left to the library is
what never mixes rows: element-wise operations, and norms and softmax over one row.

`exact_linear` computes with weights prepared once (`ExactWeights`, held as a module's buffers; a constant matrix
`m` that multiplies from the right is `ExactWeights(m.T, None)`). A weight grid of at most 24 bits is also held in
float32 (every value on it is a float32): a product of `NARROW_ROWS` rows or more streams half the bytes and widens
them at the call, the same values and so the same sums; below, the widening costs more than the bytes it saves, and
so it does on a CPU whose ATen kernels run scalar (`widens`).
"""

from __future__ import annotations

import math
import platform
from collections.abc import Sequence

import torch

from capsule_rollout.models import exact_kernel

NARROW_ROWS, NARROW_SIZE = 4, 2 ** 15
"""Rows from which `exact_linear` takes a float32 copy of the weights and widens it, and the weights (elements, 256 KiB
in float64) that have one: measured on the shipped policy, whose 256x256 layers stream from memory at every call,
12% faster at 8 rows, 8% at 4, 7% slower at 2 and 11% at 1; a smaller matrix stays in the cache either way."""
_SMALLEST = 2.0 ** -126  # float32's smallest normal: a row of smaller values shares its grid


def widens(device: torch.device) -> bool:
    """Whether a product on `device` widens the float32 copy of its weights (from `NARROW_ROWS` rows): on a GPU and
    on a CPU whose ATen kernels are vectorized. With ATen's scalar kernels on x86 (`ATEN_CPU_CAPABILITY=default`, a
    CPU without AVX2) the widening of a 256x256 matrix costs more than the float64 bytes it saves: the shipped
    policy's act at 8 rows took 25.3 ms widening and 18.7 ms not (measured), the same values either way. (An ARM
    build's `DEFAULT` kernels use NEON: not measured, left widening.)"""
    return device.type != "cpu" or _VECTOR_CPU


_VECTOR_CPU = (torch.backends.cpu.get_cpu_capability() != "DEFAULT"
               or platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"))


def split_bits(k: int) -> tuple[int, int]:
    """Bits of the input and weight grids for sums of `k` products: an input row's integers stay within
    `2^(bits_in + 1)` (`round_row`), a weight column's within `2^bits_w` (`on_grid`), and
    `ceil(log2 k) + bits_in + 1 + bits_w = 53`."""
    if k < 1:
        raise ValueError(f"a sum of {k} products has nothing to add")
    free = 53 - math.ceil(math.log2(k)) - 1
    return free // 2, free - free // 2


def on_grid(x: torch.Tensor, bits: int, dims: int | Sequence[int]) -> torch.Tensor:
    """`x` (float64) rounded to multiples of `2^(e - bits)`, where `2^(e-1) <= max |x| < 2^e` over `dims`, so
    at most `2^bits` steps each (for weights, once). `2^e` is `max |x|` over its mantissa: a quotient that is a
    power of two, so exact; adding and taking away `1.5 * 2^(e + 52 - bits)` rounds to the step, the sum staying
    in one binade whose spacing is the step."""
    top = torch.linalg.vector_norm(x, ord=float("inf"), dim=dims, keepdim=True).clamp_min(_SMALLEST)
    mantissa, _ = torch.frexp(top)
    shift = (top / mantissa) * (0.75 * 2.0 ** (53 - bits))
    return (x + shift) - shift


def round_row(x: torch.Tensor, bits: int, dims: int | Sequence[int]) -> torch.Tensor:
    """`x` (float64) rounded to multiples of a step `q = 2^(e - bits)` (`2^(e-1) <= max |x| < 2^e` over `dims`),
    at most `2^(bits + 1)` steps each: the cheap rounding of inputs, three operations on a row. With
    `t = max |x|` and `c = t (1 + 2^(54 - bits))`: `x + c` lies at or above `t 2^(53 - bits)`, where float64's spacing
    is a multiple of `q`, and so is `c`'s; `(x + c) - c` is exact (Sterbenz), a multiple of `q` within
    `t + 2q`. A zero row stays zero, a non-finite entry makes its row non-finite."""
    top = x.abs().amax(dim=dims, keepdim=True)  # max |x|, exact (a third of `vector_norm`'s time at 8 rows)
    shift = top * shift_scale(bits)
    return (x + shift) - shift


def shift_scale(bits: int) -> float:
    """`1 + 2^(54 - bits)`: a row's largest magnitude times it is the shift that rounds the row to its grid
    (`round_row`; the compiled operator takes it as it is)."""
    return 1.0 + 2.0 ** (54 - bits)


class ExactWeights:
    """A weight matrix `(out, k)` put on its grid once: `t`, float64 `(k, out)` ready for `x @ t`; `t32`, the same
    in float32 for a matrix of `NARROW_SIZE` elements or more where every value on the grid is one (at most 24 bits,
    no float32 subnormal), else None; `bias` float64 or None; `bits_in`, the grid of the inputs it takes."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        w = weight.detach().reshape(weight.shape[0], -1).to(torch.float64)
        self.bits_in, bits_w = split_bits(w.shape[1])
        self.t = on_grid(w, bits_w, 1).t().contiguous()
        narrow = self.t.to(torch.float32) if self.t.numel() >= NARROW_SIZE else None
        self.t32 = narrow if narrow is not None and torch.equal(narrow.to(torch.float64), self.t) else None
        self.bias = None if bias is None else bias.detach().to(torch.float64)

    def register(self, module: torch.nn.Module, prefix: str = "exact") -> None:
        """Hold `t`, `t32` and `bias` as `module`'s buffers `<prefix>_t`, `<prefix>_t32`, `<prefix>_bias` (not in its
        state dict, so not in its weights' hash): they move with it (`.to(device)`, copies)."""
        module.register_buffer(f"{prefix}_t", self.t, persistent=False)
        module.register_buffer(f"{prefix}_t32", self.t32, persistent=False)
        module.register_buffer(f"{prefix}_bias", self.bias, persistent=False)


def exact_linear(x: torch.Tensor, t: torch.Tensor, bias: torch.Tensor | None, bits_in: int,
                 t32: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ t + bias` over the last dimension of `x` (`t`, `bias`, `t32` from `ExactWeights`), every sum exact, then
    rounded to `x`'s dtype. With `t32`, from `NARROW_ROWS` rows the product widens it instead of reading `t` where
    that is cheaper (`widens`): the same values, so the same result at any number of rows. A float32 CPU input
    without a gradient whose product `exact_kernel.serves` (few rows, or few columns) goes through the compiled
    operator where it was built (`models.exact_kernel`, given `t32` where there is one): the same bits in one call."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if (x.dtype == torch.float32 and x.device.type == "cpu" and not (x.requires_grad and torch.is_grad_enabled())
            and exact_kernel.serves(rows, t.shape[1])):
        return torch.ops.capsule_rollout.exact_linear(x, t if t32 is None else t32, bias, shift_scale(bits_in))
    weights = t32.to(torch.float64) if t32 is not None and rows >= NARROW_ROWS and widens(x.device) else t
    y = round_row(x.to(torch.float64), bits_in, -1) @ weights
    if bias is not None:
        y = y + bias
    return y.to(x.dtype)
