import numpy as np
import pytest
import torch

from capsule_rollout.capsules import Arena, BufferSpec, Role, SpecError, snapshot
from capsule_rollout.capsules.layout import SLAB_ALIGN
from tests.capsules.fakes import SpecComponent, basic_specs, make_arena


def test_views_match_specs_and_state_is_one_slab():
    arena, comp = make_arena()
    for spec in basic_specs():
        view = arena.buffer(f"comp/{spec.name}")
        assert view.shape == spec.shape and view.dtype == spec.dtype and view.device.type == "cpu"
        assert comp.buffers[spec.name].data_ptr() == view.data_ptr()  # bound by local name
    (layout, slab), = arena.slabs(Role.STATE)
    for slot in layout.slots:
        assert slot.offset % SLAB_ALIGN == 0
        assert arena.buffer(slot.key).data_ptr() == slab.data_ptr() + slot.offset
    assert {s.key for s in layout.slots} == {"comp/h", "comp/bf", "comp/mask", "comp/count", "comp/img"}
    assert arena.state_nbytes == slab.numel()


def test_layout_does_not_depend_on_registration_order():
    a = Arena([SpecComponent("a", basic_specs()), SpecComponent("b", basic_specs())]).allocate()
    b = Arena([SpecComponent("b", basic_specs()), SpecComponent("a", basic_specs())]).allocate()
    assert a.state_signature == b.state_signature


def test_numpy_views_share_memory_both_ways():
    arena, _ = make_arena()
    arr = arena.numpy("comp/h")
    arr[1, 2] = 42.0
    assert arena.buffer("comp/h")[1, 2].item() == 42.0
    arena.buffer("comp/h")[0, 0] = -3.0
    assert arr[0, 0] == -3.0
    assert isinstance(arena.numpy("comp/mask"), np.ndarray)


def test_numpy_view_of_bf16_is_refused():
    arena, _ = make_arena()
    with pytest.raises(SpecError, match="bfloat16"):
        arena.numpy("comp/bf")


def test_allocation_happens_once():
    arena, _ = make_arena()
    with pytest.raises(SpecError, match="already allocated"):
        arena.allocate()
    with pytest.raises(SpecError, match="already allocated"):
        arena.add(SpecComponent("late", basic_specs()))


def test_registration_errors():
    with pytest.raises(SpecError, match="two components are named"):
        Arena([SpecComponent("x", basic_specs()), SpecComponent("x", basic_specs())])
    dup = [BufferSpec("a", (1,), torch.float32), BufferSpec("a", (2,), torch.float32)]
    with pytest.raises(SpecError, match="declares buffer 'a' twice"):
        Arena([SpecComponent("x", dup)])
    with pytest.raises(SpecError, match="not a CapsuleComponent"):
        Arena([object()])
    with pytest.raises(SpecError, match="no components"):
        Arena().allocate()
    with pytest.raises(SpecError, match="not allocated"):
        Arena([SpecComponent("x", basic_specs())]).buffer("x/h")
    arena, _ = make_arena()
    with pytest.raises(SpecError, match="no buffer 'comp/nope'"):
        arena.buffer("comp/nope")


def test_fingerprint_is_prefixed_and_merged():
    comp = SpecComponent("pol", basic_specs(), {"weights": "abc"})
    arena = Arena([comp], fingerprint={"host/code": "v1"}).allocate()
    fp = arena.fingerprint()
    assert fp["pol/weights"] == "abc" and fp["host/code"] == "v1" and "capsules/format" in fp


def test_a_remembered_fingerprint_match_follows_a_changed_component():
    comp = SpecComponent("pol", basic_specs(), {"weights": "abc"})
    arena = Arena([comp]).allocate()
    cap_fp = snapshot(arena).meta.fingerprint
    assert arena.fingerprint_matches(cap_fp) and arena.fingerprint_matches(cap_fp)  # the second: remembered
    comp._fp = {"weights": "new"}  # new weights loaded: a new mapping object
    assert not arena.fingerprint_matches(cap_fp)
    comp._fp = {"weights": "abc"}  # equal again, in another object
    assert arena.fingerprint_matches(cap_fp)
    plain = arena.fingerprint()  # a caller's own dict is compared every time, never remembered
    assert arena.fingerprint_matches(plain)
    plain["pol/weights"] = "edited"
    assert not arena.fingerprint_matches(plain)


def test_alignment_is_lcm_and_misaligned_lists_buffers():
    specs = [
        BufferSpec("q", (2,), torch.float32, alignment=4),
        BufferSpec("r", (2,), torch.float32, alignment=6),
        BufferSpec("s", (2,), torch.float32),
    ]
    arena = Arena([SpecComponent("c", specs)]).allocate()
    assert arena.alignment() == 12
    assert arena.misaligned(12) == []
    assert arena.misaligned(8) == [("c/r", 6)]


def test_fill_random_dirties_every_buffer_and_keeps_bools_valid():
    arena, _ = make_arena()
    before = {k: v.clone() for k, v in arena.buffers().items()}
    arena.fill_random_(torch.Generator().manual_seed(3))
    changed = [k for k, v in arena.buffers().items() if v.numel() and not torch.equal(v, before[k])]
    assert set(changed) == {k for k, v in before.items() if v.numel()}
    mask = arena.buffer("comp/mask")
    assert set(mask.view(torch.uint8).tolist()) <= {0, 1}
