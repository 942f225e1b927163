"""Slab places and the per-slab copy a restore makes (a mixed host + CUDA restore is in test_cuda.py)."""

import pytest
import torch

from capsule_rollout.capsules import Arena, SpecError, fork, restore, snapshot
from capsule_rollout.capsules.buffer_spec import Role
from capsule_rollout.capsules.slab_copy import HOST, copy_runs, copy_slabs, slab_places
from tests.capsules.fakes import SpecComponent, basic_specs, fill_state, same_bytes


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


class Mirror(SpecComponent):
    """Copies its `img` and `h` from a capsule itself (`direct_buffers`), into a place of its own."""

    direct_buffers = ("img", "h")

    def __init__(self) -> None:
        super().__init__("env", basic_specs("cpu"))
        self.live: dict[str, torch.Tensor] = {}

    def restore_direct(self, view) -> None:
        self.calls.append("restore_direct")
        self.live = {name: view[name].clone() for name in self.direct_buffers}


def test_a_components_direct_buffers_are_given_to_it_and_every_other_byte_copied():
    env, policy = Mirror(), SpecComponent("policy", basic_specs("cpu"))
    arena = Arena([env, policy]).allocate()
    fill_state(arena, 1)
    cap = snapshot(arena)
    fill_state(arena, 2)
    before = {key: arena.buffer(key).clone() for key in ("env/img", "env/h")}
    env.calls.clear()
    restore(arena, cap)
    assert env.calls == ["restore_direct", "after_restore"]
    for name in env.direct_buffers:  # the capsule's, given to the component; the arena's copy left as it was
        assert torch.equal(env.live[name], cap.buffer(f"env/{name}"))
        assert torch.equal(arena.buffer(f"env/{name}"), before[f"env/{name}"])
        assert not torch.equal(arena.buffer(f"env/{name}"), cap.buffer(f"env/{name}"))
    for key, tensor in arena.buffers(Role.STATE).items():
        if key not in ("env/img", "env/h"):
            assert same_bytes(tensor, cap.buffer(key)), key
    (layout, _), = arena.slabs(Role.STATE)
    runs, = arena.copy_runs()
    slots = {s.key: s for s in layout.slots}
    copied = sum(n for _, n in runs)
    assert copied == layout.nbytes - slots["env/img"].nbytes - slots["env/h"].nbytes
    for key in ("env/img", "env/h"):  # no run touches a direct buffer
        s = slots[key]
        assert all(offset + n <= s.offset or offset >= s.offset + s.nbytes for offset, n in runs)


def test_a_direct_buffer_that_is_not_a_host_state_buffer_is_refused_at_allocation():
    class Wrong(SpecComponent):
        direct_buffers = ("x",)  # an IO buffer

    with pytest.raises(SpecError, match="'x' among its direct_buffers"):
        Arena([Wrong("env", basic_specs("cpu"))]).allocate()
    Wrong.direct_buffers = ("nothing",)
    with pytest.raises(SpecError, match="'nothing' among its direct_buffers"):
        Arena([Wrong("env", basic_specs("cpu"))]).allocate()


def test_copy_runs_cut_out_the_skipped_slots_only():
    arena = Arena([SpecComponent("env", basic_specs("cpu"))]).allocate()
    (layout, _), = arena.slabs(Role.STATE)
    assert copy_runs(layout, ()) == ((0, layout.nbytes),)
    first, last = layout.slots[0], layout.slots[-1]
    runs = copy_runs(layout, {first.key, last.key})
    assert runs == ((first.offset + first.nbytes, last.offset - first.offset - first.nbytes),) + (
        ((last.offset + last.nbytes, layout.nbytes - last.offset - last.nbytes),)
        if layout.nbytes > last.offset + last.nbytes else ())


def test_a_fork_gives_each_arenas_component_the_capsules_direct_buffers():
    source = Arena([Mirror()]).allocate()
    fill_state(source, 3)
    cap = snapshot(source)
    branches = [Mirror() for _ in range(3)]
    arenas = [Arena([b]).allocate() for b in branches]
    for i, arena in enumerate(arenas):
        fill_state(arena, 10 + i)
    fork(cap, arenas)
    for branch, arena in zip(branches, arenas):
        assert branch.calls[-2:] == ["restore_direct", "after_restore"]
        assert all(torch.equal(branch.live[name], cap.buffer(f"env/{name}")) for name in branch.direct_buffers)
        assert same_bytes(arena.buffer("env/count"), cap.buffer("env/count"))
    assert branches[0].live["img"].data_ptr() != branches[1].live["img"].data_ptr()
