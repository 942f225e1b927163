"""Exact sums (`models.exact_sums`): a row's product does not depend on the order of its sums, so neither on the
batch, the row's position, nor the kernels a CPU picks."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from capsule_rollout.models.exact_sums import ExactWeights, exact_linear, on_grid, round_row, split_bits


def _any_order(x: torch.Tensor, w: ExactWeights, order) -> torch.Tensor:
    """The same products as `exact_linear`, added one at a time in `order`."""
    rows = round_row(x.to(torch.float64), w.bits_in, -1)
    total = torch.zeros(x.shape[0], w.t.shape[1], dtype=torch.float64)
    for k in order:
        total = total + rows[:, k: k + 1] * w.t[k]
    return (total + w.bias).to(x.dtype)


@pytest.mark.parametrize("k", [1, 7, 96, 272, 576, 1024])
def test_every_order_of_the_sums_gives_the_same_bits(k):
    g = torch.Generator().manual_seed(k)
    layer = torch.nn.Linear(k, 9)
    w = ExactWeights(layer.weight, layer.bias)
    # rows from 1e-30 to 1e30, one of zeros: each on a grid of its own
    x = torch.randn(13, k, generator=g) * torch.logspace(-30, 30, 13)[:, None]
    x[6] = 0
    y = exact_linear(x, w.t, w.bias, w.bits_in)
    assert torch.equal(y, _any_order(x, w, range(k)))
    assert torch.equal(y, _any_order(x, w, reversed(range(k))))
    assert torch.equal(y, _any_order(x, w, torch.randperm(k, generator=g).tolist()))
    assert torch.equal(y[6], layer.bias.detach())
    with torch.no_grad():  # the grid costs about float32's own rounding
        plain = layer(x[7:8])
    assert torch.allclose(y[7:8], plain, rtol=0, atol=4e-6 * float(plain.abs().max() + 1))


def test_a_row_is_the_same_alone_and_in_any_position_of_any_batch():
    g = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(272, 256)
    w = ExactWeights(layer.weight, layer.bias)
    row = torch.randn(1, 272, generator=g)
    alone = exact_linear(row, w.t, w.bias, w.bits_in)
    for n in (2, 3, 5, 8, 16, 17, 64):
        batch = torch.randn(n, 272, generator=g) * 100
        for position in range(n):
            batch[position] = row[0]
            assert torch.equal(exact_linear(batch, w.t, w.bias, w.bits_in)[position], alone[0]), (n, position)
            batch[position] = torch.randn(272, generator=g)
    leading = torch.randn(3, 4, 272, generator=g)  # leading dimensions are rows too
    assert torch.equal(exact_linear(leading, w.t, w.bias, w.bits_in)[1, 2],
                       exact_linear(leading[1, 2:3], w.t, w.bias, w.bits_in)[0])
    # from NARROW_ROWS rows the product widens the float32 copy of the weights: the same values, the same rows
    assert w.t32 is not None and torch.equal(w.t32.double(), w.t)
    for n in (1, 2, 3, 4, 8, 17):
        batch = torch.randn(n, 272, generator=g)
        batch[n - 1] = row[0]
        assert torch.equal(exact_linear(batch, w.t, w.bias, w.bits_in, w.t32)[n - 1], alone[0]), n


@pytest.mark.parametrize("k", [1, 2, 8])
def test_a_grid_finer_than_float32_keeps_no_float32_copy(k):
    """Sums of at most 8 products put the weights on a grid of 25-26 bits: float64 weights keep values there
    that no float32 holds (float32 weights keep their own 24 bits or fewer, so they always have the copy)."""
    weight = torch.randn(2 ** 15, k, generator=torch.Generator().manual_seed(k), dtype=torch.float64)
    assert ExactWeights(weight.float(), None).t32 is not None
    w = ExactWeights(weight, None)
    assert w.t32 is None
    x = torch.randn(8, k)
    assert torch.equal(exact_linear(x, w.t, None, w.bits_in, w.t32)[3], exact_linear(x[3:4], w.t, None, w.bits_in)[0])
    assert ExactWeights(weight[:64].float(), None).t32 is None  # small: in the cache either way, no copy


def test_a_non_finite_entry_spoils_its_row_only():
    layer = torch.nn.Linear(8, 4)
    w = ExactWeights(layer.weight, layer.bias)
    x = torch.randn(3, 8)
    clean = exact_linear(x, w.t, w.bias, w.bits_in)
    for bad in (float("inf"), float("nan")):
        x2 = x.clone()
        x2[1, 3] = bad
        y = exact_linear(x2, w.t, w.bias, w.bits_in)
        assert not torch.isfinite(y[1]).any() and torch.equal(y[[0, 2]], clean[[0, 2]])


@given(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=1, max_size=40),
       st.integers(1, 40))
def test_the_grids_hold_what_the_sums_need(values, bits):
    x = torch.tensor([values], dtype=torch.float64)
    top = float(x.abs().max())
    for rounded, e, most in ((round_row(x, bits, -1), math.frexp(top)[1], 2.0 ** (bits + 1)),
                             (on_grid(x, bits, -1), math.frexp(max(top, 2.0 ** -126))[1], 2.0 ** bits)):
        step = 2.0 ** (e - bits)
        steps = rounded / step
        assert torch.equal(steps, steps.round()) and float(steps.abs().max()) <= most
        assert float((rounded - x).abs().max()) <= step  # rounded to the nearest step (or the one beside)


def test_the_bits_leave_no_sum_past_float64s_integers():
    for k in (1, 2, 3, 255, 256, 257, 4096):
        bits_in, bits_w = split_bits(k)
        assert math.ceil(math.log2(k)) + bits_in + 1 + bits_w == 53 and bits_in >= 20
    with pytest.raises(ValueError, match="nothing to add"):
        split_bits(0)
