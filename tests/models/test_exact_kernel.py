"""The compiled exact linear operator (`models.exact_kernel`) gives `exact_linear`'s Python path's bits."""

from __future__ import annotations

import pytest
import torch

from capsule_rollout.capsules import Arena
from capsule_rollout.models import exact_kernel
from capsule_rollout.models.exact_sums import ExactWeights, exact_linear, shift_scale
from capsule_rollout.tabletop.flow_policy import load_policy
from capsule_rollout.tabletop.policy_runtime import PolicyRuntime
from tests.policies.tiny import random_obs

SHIPPED = "capsule_rollout/checkpoints"


@pytest.fixture(scope="module")
def kernel():
    """The operator, built here if it was not (`make install` builds it); skipped where it cannot be built."""
    if not exact_kernel.available():
        exact_kernel.main()
        exact_kernel._loaded = None
        if not exact_kernel.available():
            pytest.skip("the exact kernel could not be built here (no compiler or ninja): the Python path serves")
    yield
    exact_kernel._loaded = True


def _python(x, w):
    loaded, exact_kernel._loaded = exact_kernel._loaded, False
    try:
        return exact_linear(x, w.t, w.bias, w.bits_in, w.t32)
    finally:
        exact_kernel._loaded = loaded


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.view(torch.int32).equal(b.view(torch.int32))


@pytest.mark.parametrize("k, out, bias", [(272, 256, True), (256, 512, True), (48, 3, False), (1, 7, True),
                                          (100, 37, True), (33, 130, False), (256, 96, True)])
def test_the_operator_gives_the_python_paths_bits(kernel, k, out, bias):
    g = torch.Generator().manual_seed(k + out)
    layer = torch.nn.Linear(k, out, bias=bias)
    w = ExactWeights(layer.weight * torch.logspace(-3, 3, k)[None, :], layer.bias)
    for rows in [*range(1, 18), exact_kernel.most_rows(), 300]:  # blocks of 8 and 4, what is left; a narrow product's
        x = torch.randn(rows, k, generator=g) * torch.logspace(-40, 30, rows)[:, None]
        assert _same_bits(exact_linear(x, w.t, w.bias, w.bits_in, w.t32), _python(x, w)), rows
    edge = torch.randn(3, k, generator=g)
    edge[0, : min(k, 3)] = torch.tensor([1e-45, -1e-40, -0.0])[: min(k, 3)]  # subnormals and a negative zero
    edge[1] = -0.0  # a zero row: every product zero
    edge[2, 0] = float("nan") if k > 1 else 1.0
    y, p = exact_linear(edge, w.t, w.bias, w.bits_in), _python(edge, w)
    assert _same_bits(y[:2], p[:2]) and torch.equal(y[2].isnan(), p[2].isnan())
    ones = torch.full((1, k), float("inf"))  # an infinite entry: the row's outputs NaN, as torch's
    assert exact_linear(ones, w.t, w.bias, w.bits_in).isnan().all() and _python(ones, w).isnan().all()
    leading = torch.randn(1, 2, k, generator=g)  # leading dimensions are rows
    assert _same_bits(exact_linear(leading, w.t, w.bias, w.bits_in), _python(leading, w))


@pytest.mark.parametrize("rows", [1, 3, 4, 5, 8, 9, 13, 16, 19])
def test_every_kernel_this_cpu_runs_gives_the_same_bits_from_either_copy_of_the_weights(kernel, rows):
    g = torch.Generator().manual_seed(rows)
    for k, out in [(256, 256), (64, 136), (40, 12), (37, 5), (16, 3)]:  # tiles of vectors, the columns left over
        layer = torch.nn.Linear(k, out)
        w = ExactWeights(layer.weight, layer.bias)
        t32 = w.t.to(torch.float32)
        assert torch.equal(t32.to(torch.float64), w.t)  # this layer's grid is float32's: both copies are its values
        x = torch.randn(rows, k, generator=g) * torch.logspace(-20, 20, rows)[:, None]
        expected = _python(x, w)
        for isa in exact_kernel.kernels():
            for weights in (w.t, t32):
                y = torch.ops.capsule_rollout.exact_linear(x, weights, w.bias, shift_scale(w.bits_in), isa)
                assert _same_bits(y, expected), (k, out, isa, weights.dtype)


def test_a_kernel_the_cpu_lacks_is_refused_and_the_products_served_are_the_cpus(kernel):
    w = ExactWeights(torch.randn(4, 4), None)
    with pytest.raises(RuntimeError, match="kernel 7 is not one this CPU runs"):
        torch.ops.capsule_rollout.exact_linear(torch.randn(1, 4), w.t, None, shift_scale(w.bits_in), 7)
    assert 0 in exact_kernel.kernels()
    if max(exact_kernel.kernels()) > 0:  # vector kernels: few rows of any width, any rows of few columns
        assert exact_kernel.most_rows() == exact_kernel.VECTOR_ROWS
        assert exact_kernel.serves(64, 4096) and exact_kernel.serves(10_000, 8) and not exact_kernel.serves(65, 9)
    else:
        assert exact_kernel.most_rows() == exact_kernel.BASELINE_ROWS and not exact_kernel.serves(5, 1)


def test_the_shipped_policy_acts_the_same_bits_with_and_without_the_operator(kernel):
    def chunk(with_kernel: bool) -> torch.Tensor:
        loaded, exact_kernel._loaded = exact_kernel._loaded, with_kernel
        try:
            policy = PolicyRuntime(load_policy(f"{SHIPPED}/policy"))  # traced: the operator is in the trace
            Arena([policy]).allocate()
            policy.set_language("pick")
            policy.reset(7)
            return policy.act(random_obs(policy.config, 1)).clone()
        finally:
            exact_kernel._loaded = loaded

    assert _same_bits(chunk(True), chunk(False))


def test_a_run_never_builds_it_and_can_be_told_not_to_load_it(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing built there
    monkeypatch.setattr(exact_kernel, "_loaded", None)
    assert not exact_kernel.available() and not any(tmp_path.iterdir())
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("CAPSULE_ROLLOUT_EXACT_KERNEL", "0")
    monkeypatch.setattr(exact_kernel, "_loaded", None)
    assert not exact_kernel.available()


def test_where_it_cannot_be_built_the_build_says_why_and_install_goes_on(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))

    def no_compiler():
        raise RuntimeError("Ninja is required to load C++ extensions\nno c++ here")

    monkeypatch.setattr(exact_kernel, "build", no_compiler)
    assert exact_kernel.main() == 0
    assert "not built (RuntimeError: no c++ here); exact sums run their Python path" in capsys.readouterr().out


def test_a_traced_invariant_layer_of_few_rows_calls_the_operator_and_of_more_rows_the_library(kernel):
    from capsule_rollout.models.graph_runner import trace_on_cpu
    from capsule_rollout.models.runtime import invariant_copy

    model = invariant_copy(torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.SiLU()).eval())
    cpu, most = torch.device("cpu"), exact_kernel.most_rows()
    with torch.no_grad():
        one = trace_on_cpu(model, (torch.randn(1, 32),), cpu, True)
        more = trace_on_cpu(model, (torch.randn(most + 1, 32),), cpu, True)
    assert "capsule_rollout::exact_linear" in str(one.inlined_graph)
    assert "capsule_rollout::exact_linear" not in str(more.inlined_graph)
    x = torch.randn(most + 1, 32)
    with torch.no_grad():
        assert _same_bits(torch.cat([one(x[i: i + 1]) for i in range(most + 1)]), more(x))
