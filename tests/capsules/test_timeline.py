import pytest

from capsule_rollout.capsules import Timeline, snapshot
from tests.capsules.fakes import fill_state, make_arena, same_bytes


def _record_steps(arena, timeline, steps):
    for s in steps:
        fill_state(arena, s)
        timeline.record(snapshot(arena, step=s))


def test_rewind_restores_an_earlier_boundary_and_forgets_later_ones():
    arena, _ = make_arena()
    tl = Timeline(8)
    _record_steps(arena, tl, [0, 4, 8, 12])
    expected = tl.at_or_before(5)
    restored = tl.rewind(arena, back=2)
    assert restored is expected and restored.step == 4
    assert tl.steps == [0, 4]
    for k in restored.specs:
        assert same_bytes(arena.buffer(k), restored.buffer(k))
    _record_steps(arena, tl, [5])  # the episode continues from the rewound boundary
    assert tl.steps == [0, 4, 5]


def test_rewind_to_step_and_errors():
    arena, _ = make_arena()
    tl = Timeline(4)
    _record_steps(arena, tl, [0, 3, 6])
    assert tl.rewind(arena, to_step=4).step == 3
    with pytest.raises(LookupError):
        tl.rewind(arena, back=5)
    with pytest.raises(ValueError, match="must increase"):
        tl.record(snapshot(arena, step=3))
    with pytest.raises(LookupError):
        Timeline(2).latest()


def test_bounded_with_first_boundary_kept():
    arena, _ = make_arena()
    tl = Timeline(3, keep_first=True)
    _record_steps(arena, tl, [0, 1, 2, 3, 4])
    assert tl.steps == [0, 3, 4] and tl.dropped == 2
    ring = Timeline(3, keep_first=False)
    _record_steps(arena, ring, [0, 1, 2, 3, 4])
    assert ring.steps == [2, 3, 4]
    assert ring.nbytes == 3 * ring.latest().nbytes


def test_bad_capacity():
    with pytest.raises(ValueError):
        Timeline(0)
    with pytest.raises(ValueError, match="keep_first"):
        Timeline(1)
