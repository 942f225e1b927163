"""Slab places and the per-slab copy a restore makes (a mixed host + CUDA restore is in test_cuda.py)."""

import torch

from capsule_rollout.capsules import Arena, restore, snapshot
from capsule_rollout.capsules.buffer_spec import Role
from capsule_rollout.capsules.slab_copy import HOST, copy_slabs, slab_places
from tests.capsules.fakes import SpecComponent, basic_specs, fill_state


def test_host_slabs_are_found_once_and_restored_in_place():
    arena = Arena([SpecComponent("env", basic_specs("cpu"))]).allocate()
    fill_state(arena, 1)
    cap = snapshot(arena)
    fill_state(arena, 2)
    places = arena.slab_places()
    assert [place for _, _, place in places] == [HOST] * len(places)
    assert [addr for addr, _, _ in places] == [slab.data_ptr() for _, slab in arena.slabs(Role.STATE)]
    restore(arena, cap)
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(arena.slabs(Role.STATE), cap.slabs()))
    assert arena.slab_places() is places


def test_slabs_of_no_single_place_go_through_torch():
    base = torch.arange(64, dtype=torch.uint8)
    strided = base[::2]  # not contiguous: no address range to copy
    assert slab_places([(None, strided)]) == ((strided.data_ptr(), 32, None),)
    dst = torch.zeros(32, dtype=torch.uint8)
    copy_slabs(slab_places([(None, dst)]), slab_places([(None, strided)]), [(None, dst)], [(None, strided)])
    assert torch.equal(dst, strided)
