import pytest
import torch

from capsule_rollout.capsules import digest, digest_slab, digest_tensors, snapshot
from capsule_rollout.capsules.digest import choose_backend, pack, triton_available
from tests.capsules.fakes import fill_state, make_arena
from tests.conftest import HAS_CUDA

SIZES = [0, 1, 7, 8, 9, 63, 64, 1000, 8191, 8 * 1024 + 3, 20000]


def _random_tensors(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g) for n in SIZES]


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
def test_triton_kernel_equals_torch_fallback_bit_for_bit():
    # Runs the real kernel on a GPU, or the Triton interpreter on the CPU
    # (tests/conftest.py sets TRITON_INTERPRET=1 without CUDA).
    device = "cuda" if HAS_CUDA else "cpu"
    slab, slots = pack([t.to(device) for t in _random_tensors(0)])
    assert digest_slab(slab, slots, backend="triton") == digest_slab(slab, slots, backend="torch")
    # many blocks per buffer and many buffers in one launch
    big, big_slots = pack([t.to(device) for t in _random_tensors(1) * 3])
    assert digest_slab(big, big_slots, backend="triton") == digest_slab(big, big_slots, backend="torch")


def test_digest_ignores_padding_and_position():
    tensors = _random_tensors(2)
    slab, slots = pack(tensors)
    ref = digest_slab(slab, slots)
    dirty = slab.clone()
    for (offset, nbytes), (next_offset, _) in zip(slots, slots[1:]):
        dirty[offset + nbytes : next_offset] = 0xAB  # padding between buffers
    assert digest_slab(dirty, slots) == ref
    assert digest_tensors(list(reversed(tensors))) == list(reversed(ref))


def test_digest_detects_every_single_bit_flip_in_a_buffer():
    t = torch.randint(0, 256, (37,), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    (ref,) = digest_tensors([t])
    for byte in range(t.numel()):
        for bit in range(8):
            flipped = t.clone()
            flipped[byte] ^= 1 << bit
            assert digest_tensors([flipped]) != [ref], (byte, bit)


def test_digest_of_typed_buffers_matches_arena_snapshot():
    arena, _ = make_arena()
    fill_state(arena, 4)
    cap = snapshot(arena)
    tensors = cap.tensors()
    assert digest_tensors(list(tensors.values())) == [cap.digests[k] for k in tensors]


def test_backend_choice(monkeypatch):
    assert choose_backend(torch.device("cpu")) == "torch"
    monkeypatch.setenv("CAPSULES_DIGEST_BACKEND", "torch")
    assert choose_backend(torch.device("cuda")) == "torch"
    monkeypatch.setenv("CAPSULES_DIGEST_BACKEND", "fast")
    with pytest.raises(ValueError, match="unknown"):
        choose_backend(torch.device("cpu"))


def test_bad_slabs_are_refused():
    with pytest.raises(ValueError, match="uint8"):
        digest_slab(torch.zeros(8, dtype=torch.float32), [(0, 4)])
    with pytest.raises(ValueError, match="multiples of 8"):
        digest_slab(torch.zeros(12, dtype=torch.uint8), [(0, 4)])
    with pytest.raises(ValueError, match="8-aligned region"):
        digest_slab(torch.zeros(16, dtype=torch.uint8), [(4, 4)])


# -- backend choice: Triton only where a first launch works, with the reason ---------------------


class _BrokenTriton:
    """A Triton backend that imports but cannot launch (no C compiler or Python headers for its launcher)."""

    @staticmethod
    def digest_words(words, slots):
        raise RuntimeError("failed to build the kernel launcher: Python.h: No such file or directory\nmore")


@pytest.fixture
def fresh_status(monkeypatch):
    digest._triton_status.cache_clear()
    monkeypatch.setattr(digest, "_warned", set())
    yield
    digest._triton_status.cache_clear()


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
def test_triton_status_is_a_real_launch_checked_against_torch(fresh_status, monkeypatch):
    ok, why = digest.triton_status("cpu")  # the interpreter stands in for a device here
    assert ok and "reference digest" in why
    monkeypatch.setattr(digest, "_triton_import", lambda: (_BrokenTriton, ""))
    digest._triton_status.cache_clear()
    ok, why = digest.triton_status("cpu")
    assert not ok and "launch on cpu failed" in why and "Python.h" in why and "more" not in why


def test_unusable_triton_falls_back_to_torch_with_the_reason(fresh_status, monkeypatch):
    monkeypatch.delenv("CAPSULES_DIGEST_BACKEND", raising=False)
    monkeypatch.setattr(digest, "triton_status", lambda device: (False, "a first Triton launch failed (X)"))
    with pytest.warns(RuntimeWarning, match="fall back to the torch digest"):
        choice = digest.digest_backend(torch.device("cuda:0"))
    assert choice == digest.BackendChoice("torch", "fallback: a first Triton launch failed (X)")
    assert choose_backend(torch.device("cuda:0")) == "torch"  # warned once per device, chosen every time
    with pytest.raises(RuntimeError, match=r"'triton' was requested but a first Triton launch failed \(X\)"):
        digest.digest_backend(torch.device("cuda:0"), "triton")


def test_usable_triton_serves_cuda_buffers_and_says_why(fresh_status, monkeypatch):
    monkeypatch.delenv("CAPSULES_DIGEST_BACKEND", raising=False)
    calls = []
    monkeypatch.setattr(digest, "triton_status", lambda device: calls.append(device) or (True, "it works"))
    assert digest.digest_backend(torch.device("cuda:1")).to_json() == {"backend": "triton", "reason": "it works"}
    assert digest.digest_backend(torch.device("cpu")).backend == "torch" and len(calls) == 1  # no probe for CPU
    monkeypatch.setenv("CAPSULES_DIGEST_BACKEND", "torch")
    assert digest.digest_backend(torch.device("cuda:1")).reason == "torch digest CAPSULES_DIGEST_BACKEND=torch"


def test_triton_launches_with_the_buffers_device_current(monkeypatch):
    """Triton launches on the current CUDA device, not the tensors': a slab on cuda:1 must make cuda:1 current."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tests.fake_cuda import FakeCuda

    digest_triton = pytest.importorskip("capsule_rollout.capsules.digest_triton")
    fake = FakeCuda(monkeypatch)
    launched = []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launched.append((grid, torch.cuda.current_device()))

    monkeypatch.setattr(digest_triton, "_digest_blocks", Kernel())
    try:
        with FakeTensorMode():
            words = torch.empty(2048, dtype=torch.int64, device="cuda:1")
            sums = digest_triton.digest_sums(words, [(0, 8000), (8000, 100)])
        assert sums.device == torch.device("cuda:1") and sums.shape == (2,)
    finally:
        digest_triton._plan.cache_clear()  # it holds fake tensors now
    assert launched == [((2,), 1)]  # one launch, 2 blocks, with cuda:1 current
    assert fake.current_device == 0  # and the caller's device current again
