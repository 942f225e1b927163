import pytest
import torch

from capsules import digest_slab, digest_tensors, snapshot
from capsules.digest import choose_backend, pack, triton_available
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
