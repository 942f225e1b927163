from importlib import metadata

import pytest
import torch

from capsule_rollout.capsules import (
    Arena,
    BufferSpec,
    CapsuleAlignmentError,
    CapsuleIntegrityError,
    CapsuleMismatchError,
    Mismatch,
    Role,
    fork,
    host_arrays,
    restore,
    snapshot,
)
from tests.capsules.fakes import SpecComponent, basic_specs, fill_state, make_arena, same_bytes, state_copy


def test_snapshot_restore_round_trip_in_place():
    arena, comp = make_arena()
    fill_state(arena, 1)
    expected = state_copy(arena)
    ptrs = {k: v.data_ptr() for k, v in arena.buffers().items()}
    cap = snapshot(arena, label="boundary", step=5, episode="ep-1", extra={"seed": 7})
    fill_state(arena, 2)
    restore(arena, cap)
    for k, v in expected.items():
        assert same_bytes(arena.buffer(k), v), k
    assert {k: v.data_ptr() for k, v in arena.buffers().items()} == ptrs
    assert cap.meta.step == 5 and cap.meta.episode == "ep-1" and cap.meta.extra["seed"] == "7"
    assert comp.calls == ["before_snapshot", "after_restore"]


def test_capsule_carries_only_state_buffers_with_digests():
    arena, _ = make_arena()
    cap = snapshot(arena)
    assert set(cap.specs) == {"comp/h", "comp/bf", "comp/mask", "comp/count", "comp/img"}
    assert set(cap.digests) == set(cap.specs)
    assert all(len(d) == 16 for d in cap.digests.values())
    assert cap.meta.fingerprint["comp/weights"] == "w0"


def test_capsule_does_not_see_later_writes():
    arena, _ = make_arena()
    fill_state(arena, 1)
    cap = snapshot(arena)
    held = {k: v.clone() for k, v in cap.tensors().items()}
    fill_state(arena, 2)
    for k, v in held.items():
        assert same_bytes(cap.buffer(k), v)


def test_fingerprint_mismatch_names_each_key_and_leaves_arena_untouched():
    src, _ = make_arena(fingerprint={"weights": "w0", "model": "m0"})
    dst, dst_comp = make_arena(fingerprint={"weights": "w1", "model": "m0", "extra": "e"})
    fill_state(src, 1)
    fill_state(dst, 2)
    before = state_copy(dst)
    cap = snapshot(src, label="from-src")
    with pytest.raises(CapsuleMismatchError) as err:
        restore(dst, cap)
    keys = {(m.kind, m.key) for m in err.value.mismatches}
    assert keys == {("fingerprint", "comp/weights"), ("fingerprint", "comp/extra")}
    assert "comp/weights" in str(err.value) and "from-src" in str(err.value)
    for k, v in before.items():
        assert same_bytes(dst.buffer(k), v)
    assert "after_restore" not in dst_comp.calls


@pytest.mark.parametrize(
    "change, key",
    [
        (lambda s: BufferSpec("h", (2, 4), torch.float32), "comp/h"),
        (lambda s: BufferSpec("h", (2, 3), torch.float64), "comp/h"),
        (lambda s: BufferSpec("h", (2, 3), torch.float32, alignment=2), "comp/h"),
        (lambda s: BufferSpec("h2", (2, 3), torch.float32), "comp/h"),
    ],
)
def test_spec_mismatch_is_refused(change, key):
    specs = basic_specs()
    other = [change(s) if s.name == "h" else s for s in specs]
    src, _ = make_arena(specs=specs)
    dst, _ = make_arena(specs=other)
    with pytest.raises(CapsuleMismatchError) as err:
        restore(dst, snapshot(src))
    assert key in {m.key for m in err.value.mismatches if m.kind == "spec"}


def test_a_fingerprint_of_another_package_version_says_which_to_install():
    installed = metadata.version("numpy")
    other = Mismatch("fingerprint", "env/numpy", "1.0.0", installed)
    assert str(other).endswith(f"arena has {installed} (the capsule was made with numpy 1.0.0: "
                               "`pip install numpy==1.0.0` restores it)")
    # no hint where the entry is not the installed package's version, or not a package, or not a fingerprint
    for plain in (Mismatch("fingerprint", "env/numpy", "1.0.0", "9.9.9"),
                  Mismatch("fingerprint", "env/numpy", "<missing>", installed),
                  Mismatch("fingerprint", "env/task", "pick", "place"),
                  Mismatch("spec", "env/numpy", "1.0.0", installed)):
        assert "pip install" not in str(plain)


def test_io_and_scratch_changes_do_not_block_restore():
    specs = basic_specs()
    other = [BufferSpec("x", (30,), torch.float32, role=Role.IO) if s.name == "x" else s for s in specs]
    src, _ = make_arena(specs=specs)
    dst, _ = make_arena(specs=other)
    fill_state(src, 4)
    restore(dst, snapshot(src))
    assert same_bytes(dst.buffer("comp/h"), src.buffer("comp/h"))


def test_unaligned_boundary_is_refused_unless_forced():
    specs = basic_specs() + [BufferSpec("queue", (4, 2), torch.float32, alignment=4)]
    arena, _ = make_arena(specs=specs)
    with pytest.raises(CapsuleAlignmentError, match="comp/queue"):
        snapshot(arena, step=6)
    assert snapshot(arena, step=8).meta.forced is False
    forced = snapshot(arena, step=6, force=True)
    assert forced.meta.forced is True
    with pytest.raises(ValueError, match="non-negative int"):
        snapshot(arena, step=-1)


def test_fork_gives_independent_branches_and_never_writes_the_capsule():
    a, _ = make_arena()
    b, _ = make_arena()
    fill_state(a, 1)
    cap = snapshot(a)
    digests = dict(cap.digests)
    fork(cap, [a, b])
    for k in cap.specs:
        assert same_bytes(a.buffer(k), b.buffer(k))
        assert a.buffer(k).data_ptr() != b.buffer(k).data_ptr() or a.buffer(k).numel() == 0
    a.buffer("comp/h").fill_(99.0)
    assert not torch.equal(b.buffer("comp/h"), a.buffer("comp/h"))
    assert cap.compute_digests() == digests


def test_fork_checks_every_arena_before_copying():
    a, _ = make_arena()
    bad, _ = make_arena(fingerprint={"weights": "other"})
    fill_state(a, 1)
    cap = snapshot(a)
    fill_state(a, 2)
    before = state_copy(a)
    with pytest.raises(CapsuleMismatchError):
        fork(cap, [a, bad])
    for k, v in before.items():
        assert same_bytes(a.buffer(k), v)
    with pytest.raises(ValueError, match="distinct arenas"):
        fork(cap, [a, a])


def test_integrity_check_detects_a_written_capsule():
    arena, _ = make_arena()
    cap = snapshot(arena)
    cap.buffer("comp/h").add_(1.0)  # breaking the read-only contract
    with pytest.raises(CapsuleIntegrityError, match="comp/h"):
        cap.check_integrity()
    with pytest.raises(CapsuleIntegrityError):
        restore(arena, cap, check_integrity=True)


def test_deferred_digests_are_computed_on_first_use():
    arena, _ = make_arena()
    fill_state(arena, 1)
    lazy = snapshot(arena, digest=False)
    eager = snapshot(arena)
    assert dict(lazy.digests) == dict(eager.digests)


def test_to_host_and_back_keeps_bytes_and_restores():
    arena, _ = make_arena()
    fill_state(arena, 1)
    cap = snapshot(arena)
    host = cap.to_host()
    assert host.on_host and dict(host.digests) == dict(cap.digests)
    fill_state(arena, 2)
    restore(arena, host.to_devices())
    for k in cap.specs:
        assert same_bytes(arena.buffer(k), cap.buffer(k))


def test_multi_component_arena_restores_all_components():
    c1, c2 = SpecComponent("env", basic_specs()), SpecComponent("policy", basic_specs(), {"weights": "p"})
    arena = Arena([c1, c2]).allocate()
    fill_state(arena, 5)
    expected = state_copy(arena)
    cap = snapshot(arena)
    fill_state(arena, 6)
    restore(arena, cap)
    for k, v in expected.items():
        assert same_bytes(arena.buffer(k), v)
    assert c1.calls[-1] == c2.calls[-1] == "after_restore"


class _Picky(SpecComponent):
    """Refuses any capsule whose `count` buffer is negative (a component's own restore check)."""

    def check_restore(self, view):
        if int(view["count"]) < 0:
            raise ValueError(f"count {int(view['count'])} is negative")


def test_a_component_refusal_comes_before_any_byte_is_copied():
    arena = Arena([_Picky("comp", basic_specs())]).allocate()
    comp = arena.components["comp"]
    arena.buffer("comp/count").fill_(-5)
    refused = snapshot(arena)
    fill_state(arena, 3)
    arena.buffer("comp/count").fill_(7)
    before = state_copy(arena)
    other = Arena([_Picky("comp", basic_specs())]).allocate()
    with pytest.raises(CapsuleMismatchError, match="component 'comp' refused the capsule: count -5 is negative"):
        restore(arena, refused)
    with pytest.raises(CapsuleMismatchError, match="refused"):
        fork(refused, [other, arena])
    for k, v in before.items():
        assert same_bytes(arena.buffer(k), v), k
    assert "after_restore" not in comp.calls
    accepted = snapshot(arena)
    restore(other, accepted)
    assert int(other.buffer("comp/count")) == 7


def test_a_check_reads_the_capsules_host_buffers_as_arrays_kept_with_the_capsule():
    """`check_restore` is given the capsule's `BufferViews`: its `arrays()` are numpy views of the same memory (no
    copy: what the capsule holds), made once per capsule and component, as `host_arrays` gives them."""
    arena = Arena([_Picky("comp", basic_specs())]).allocate()
    arena.buffer("comp/count").fill_(4)
    capsule = snapshot(arena)
    view = capsule.component_tensors("comp")
    arrays = view.arrays()
    assert capsule.component_tensors("comp") is view and view.arrays() is arrays and host_arrays(view) is arrays
    assert set(arrays) == {k for k, v in view.items() if v.dtype is not torch.bfloat16}
    for k, a in arrays.items():
        assert a.ctypes.data == view[k].data_ptr() and a.tobytes() == view[k].numpy().tobytes()
    plain = {k: v.clone() for k, v in view.items()}
    assert {k: a.tobytes() for k, a in host_arrays(plain).items()} == {k: a.tobytes() for k, a in arrays.items()}
