"""CUDA paths: device slabs, mixed CPU+CUDA arenas, pinned host tier, the Triton digest on GPU."""

import pytest
import torch

from capsule_rollout.capsules import Arena, CapsuleStore, Tier, digest_slab, restore, snapshot, verify_steppable
from capsule_rollout.capsules.buffer_spec import Role
from capsule_rollout.capsules.digest import choose_backend, digest_backend, triton_available
from capsule_rollout.capsules.reference_components import NoisyChunkSteppable
from capsule_rollout.capsules.slab_copy import HOST
from tests.capsules.fakes import SpecComponent, basic_specs, fill_state, same_bytes, state_copy

pytestmark = pytest.mark.gpu


def _mixed_arena() -> Arena:
    return Arena([SpecComponent("env", basic_specs("cpu")), SpecComponent("policy", basic_specs("cuda"))]).allocate()


def test_mixed_arena_has_one_state_slab_per_device_and_restores_in_place():
    arena = _mixed_arena()
    assert sorted(lay.device.split(":")[0] for lay in arena.state_layouts) == ["cpu", "cuda"]
    fill_state(arena, 1)
    expected = state_copy(arena)
    ptrs = [s.data_ptr() for _, s in arena.slabs()]
    cap = snapshot(arena)
    fill_state(arena, 2)
    restore(arena, cap)
    torch.cuda.synchronize()
    for k, v in expected.items():
        assert same_bytes(arena.buffer(k), v), k
    assert [s.data_ptr() for _, s in arena.slabs()] == ptrs


def test_host_tier_capsule_is_pinned_and_restores_into_cuda():
    arena = _mixed_arena()
    fill_state(arena, 3)
    cap = snapshot(arena)
    store = CapsuleStore(device_bytes=0)
    store.put("k", cap)
    assert store.tier_of("k") is Tier.HOST
    host = store._entries["k"].capsule
    assert host.on_host and all(s.is_pinned() for _, s in host.slabs())
    fill_state(arena, 4)
    restore(arena, host)  # host -> device copy, non-blocking from pinned memory
    torch.cuda.synchronize()
    for k in cap.specs:
        assert same_bytes(arena.buffer(k), cap.buffer(k))
    assert dict(store.get("k").digests) == dict(cap.digests)


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
def test_triton_digest_is_chosen_on_cuda_and_matches_torch():
    choice = digest_backend(torch.device("cuda"))
    assert choice.backend == "triton", choice.reason  # the reason says why Triton could not launch
    assert choose_backend(torch.device("cuda")) == "triton"
    arena = _mixed_arena()
    fill_state(arena, 5)
    cap = snapshot(arena)
    cuda_slabs = [(lay, slab) for lay, slab in cap.slabs() if slab.is_cuda]  # Triton reads device memory only
    assert cuda_slabs
    for lay, slab in cuda_slabs:
        slots = [(s.offset, s.nbytes) for s in lay.slots]
        assert digest_slab(slab, slots, backend="triton") == digest_slab(slab, slots, backend="torch")


def test_cuda_standin_is_bit_exact():
    report = verify_steppable(lambda: NoisyChunkSteppable("cuda"))
    assert report.bit_exact, report.failures
    assert report.device == "cpu+cuda"  # generator state is a CPU tensor


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_triton_digest_of_a_slab_on_the_second_gpu_with_the_first_current():
    from capsule_rollout.capsules.digest import pack

    torch.cuda.set_device(0)
    g = torch.Generator().manual_seed(9)
    slab, slots = pack([torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).to("cuda:1")
                        for n in (5, 8000, 70000)])
    assert digest_slab(slab, slots, backend="triton") == digest_slab(slab, slots, backend="torch")
    assert torch.cuda.current_device() == 0


def test_a_mixed_restore_sends_only_the_device_slab_through_torch(monkeypatch):
    arena = _mixed_arena()
    places = sorted(place for _, _, place in arena.slab_places())
    assert places == [HOST, torch.cuda.current_device()]
    fill_state(arena, 6)
    cap = snapshot(arena)
    fill_state(arena, 7)
    torch_copies = []
    real_copy = torch.Tensor.copy_
    counting = lambda self, *a, **k: torch_copies.append(self.device) or real_copy(self, *a, **k)
    monkeypatch.setattr(torch.Tensor, "copy_", counting)
    restore(arena, cap)
    monkeypatch.undo()
    torch.cuda.synchronize()
    assert [d.type for d in torch_copies] == ["cuda"]  # the host slab was one memmove
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(arena.slabs(Role.STATE), cap.slabs()))
