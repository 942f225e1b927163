import pytest
import torch

from capsule_rollout.capsules import BufferSpec, Role, SpecError


def test_spec_normalises_and_sizes():
    spec = BufferSpec("q", [2, 3], "bfloat16", "cpu", "state", alignment=4)
    assert spec.shape == (2, 3) and spec.dtype is torch.bfloat16 and spec.role is Role.STATE
    assert spec.numel == 6 and spec.itemsize == 2 and spec.nbytes == 12
    assert BufferSpec("s", (), torch.int64).nbytes == 8
    assert BufferSpec("z", (0, 5), torch.float32).nbytes == 0


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(name="a/b"), "no '/'"),
        (dict(name=""), "invalid"),
        (dict(name="1abc"), "invalid"),
        (dict(shape=(2, -1)), "negative"),
        (dict(shape=("x",)), "tuple of ints"),
        (dict(dtype=torch.complex64), "not supported"),
        (dict(dtype="float8"), "unsupported dtype"),
        (dict(device="tpu:0"), "not a torch device"),
        (dict(role="cache"), "role"),
        (dict(alignment=0), "positive int"),
        (dict(alignment=True), "positive int"),
        (dict(role=Role.IO, alignment=4), "only applies to role 'state'"),
    ],
)
def test_bad_specs_say_what_to_fix(kwargs, fragment):
    args = dict(name="buf", shape=(2,), dtype=torch.float32)
    args.update(kwargs)
    with pytest.raises(SpecError, match=fragment):
        BufferSpec(**args)


def test_json_round_trip_every_dtype():
    from capsule_rollout.capsules.buffer_spec import DTYPES

    for name, dtype in DTYPES.items():
        spec = BufferSpec(f"b_{name}", (3, 1), dtype, "cpu", Role.STATE, alignment=2)
        assert BufferSpec.from_json(spec.to_json()) == spec


def test_malformed_json_is_a_spec_error():
    with pytest.raises(SpecError, match="malformed"):
        BufferSpec.from_json({"name": "x"})
