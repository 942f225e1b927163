"""The finiteness checks every slot's observation goes through at every step: the same answer as torch's own
`isfinite`, whatever the tensor (dtype, layout, device-free views, a tensor that requires grad)."""

import numpy as np
import pytest
import torch

from capsule_rollout.models.inputs import all_counts, all_finite, as_state_tensor, load_observation


def _cases():
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        base = torch.randn(6, 5, generator=g).to(dtype)
        yield base
        yield base.t()  # not contiguous
        yield base[::2, 1:]  # strided, offset
        yield base.abs()
        yield torch.zeros(0, dtype=dtype)
        yield torch.tensor([-0.0, 0.0], dtype=dtype)
        for bad in (float("nan"), float("inf"), float("-inf")):
            t = base.clone()
            t[3, 2] = bad
            yield t
            yield t.t()
    yield torch.randn(4, requires_grad=True)
    yield torch.tensor([1.0, float("nan")], requires_grad=True)


@pytest.mark.parametrize("t", list(_cases()), ids=lambda t: f"{t.dtype}-{tuple(t.shape)}")
def test_the_checks_answer_as_torch_does(t):
    assert all_finite(t) == bool(torch.isfinite(t).all())
    assert all_counts(t) == bool(torch.isfinite(t).all() and not (t < 0).any())


def test_a_non_finite_state_is_refused_by_name():
    with pytest.raises(ValueError, match="non-finite"):
        as_state_tensor(np.array([[0.0, np.inf]], np.float32), (1, 2))
    assert as_state_tensor(np.zeros((1, 2), np.float32), (1, 2)).shape == (1, 2)


def _buffers(batch: int) -> dict[str, torch.Tensor]:
    return {"image_front": torch.zeros(batch, 4, 5, 3, dtype=torch.uint8), "state": torch.zeros(batch, 3)}


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("kind", ["numpy", "torch", "numpy float64", "numpy strided", "numpy big-endian"])
def test_an_observation_loads_the_same_bits_through_numpy_or_torch(batch, kind):
    """Numpy arrays are checked and copied through numpy (no torch dispatch); the buffers hold what torch's own
    copy would have put there, a float64 state rounded the same."""
    rng = np.random.default_rng(batch)
    shape = (batch, 4, 5, 3) if batch > 1 else (4, 5, 3)
    img = rng.integers(0, 256, shape, dtype=np.uint8)
    state = rng.standard_normal((batch, 3) if batch > 1 else (3,))
    if kind == "numpy":
        state = state.astype(np.float32)
    elif kind == "numpy strided":
        img, state = np.ascontiguousarray(img.swapaxes(-2, -3)).swapaxes(-2, -3), state.astype(np.float32)
    elif kind == "numpy big-endian":
        state = state.astype(">f4")
    obs = {"image_front": torch.from_numpy(img.copy()) if kind == "torch" else img,
           "state": torch.from_numpy(state.astype(np.float32)) if kind == "torch" else state}
    got = _buffers(batch)
    load_observation(got, obs, cameras=("front",), who="policy")
    want = _buffers(batch)
    for key, value in (("image_front", img), ("state", state)):
        want[key].copy_(torch.as_tensor(np.asarray(value, dtype=value.dtype.newbyteorder("="))).reshape(
            want[key].shape))
    assert torch.equal(got["image_front"], want["image_front"]) and torch.equal(got["state"], want["state"])


@pytest.mark.parametrize("bad, match", [
    ({"state": np.array([0.0, np.nan, 1.0], np.float32)}, "non-finite"),
    ({"state": np.array([0, 1, 2])}, "state must be float32"),
    ({"state": np.zeros(4, np.float32)}, "expected shape"),
    ({"image_front": np.zeros((4, 5, 3), np.float32)}, "must be uint8"),
    ({"image_front": np.zeros((5, 4, 3), np.uint8)}, "expected shape"),
])
def test_a_bad_observation_is_refused_by_name_and_nothing_is_copied(bad, match):
    obs = {"image_front": np.full((4, 5, 3), 7, np.uint8), "state": np.ones(3, np.float32), **bad}
    buffers = _buffers(1)
    with pytest.raises(ValueError, match=match):
        load_observation(buffers, obs, cameras=("front",), who="policy")
    assert not buffers["image_front"].any() and not buffers["state"].any()
