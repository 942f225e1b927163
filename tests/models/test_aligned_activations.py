"""Activations in the batch-invariant copy: ATen runs a tensor's elements through a vector loop and the rest
through a scalar loop that rounds exp and the sigmoid apart, so a narrow row's activation depends on how many rows
there are; the copy pads each row to whole vectors (`models.runtime.ACTIVATIONS`)."""

import pytest
import torch

from capsule_rollout.models.runtime import ACTIVATIONS, invariant_copy


class Narrow(torch.nn.Module):
    """Rows of 20 features (a multiple of no vector width) through each activation the copy aligns."""

    def __init__(self, act: torch.nn.Module) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(6, 20)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.inp(x))


def _rows_alone(model, x):
    return torch.cat([model(x[i: i + 1]) for i in range(x.shape[0])])


@pytest.mark.parametrize("act", [torch.nn.SiLU(), torch.nn.Sigmoid()], ids=["silu", "sigmoid"])
def test_a_narrow_row_s_activation_is_the_batch_of_one_s_in_the_copy_and_differs_as_is(act):
    torch.manual_seed(0)
    model = Narrow(act).eval()
    x = torch.randn(512, 6) * 3
    with torch.no_grad():
        as_is = model(x) != _rows_alone(model, x)
        copy = invariant_copy(model)
        assert torch.equal(copy(x), _rows_alone(copy, x))
        for n in (2, 3, 5, 8, 17):
            assert torch.equal(copy(x[:n]), _rows_alone(copy, x[:n])), n
    # the hazard is real where the scalar loop computes differently (AVX2 and AVX-512 kernels here)
    assert as_is.any(), "the library's kernels agreed on every row: this CPU shows no hazard to guard"


def test_every_listed_activation_keeps_its_values_and_shape_through_the_padding():
    torch.manual_seed(1)
    x = torch.randn(3, 5, 7)
    for kind in ACTIVATIONS:
        act = kind()
        copy = invariant_copy(torch.nn.Sequential(act))
        torch.testing.assert_close(copy(x), act(x), rtol=0, atol=1e-6)
        assert copy(x).shape == x.shape
