"""`capsules.rng_state`: a PCG64 generator's state set by copying its 40 bytes of C state is the state numpy's own
setter sets, whatever the state holds (a pending 32-bit half included); anything else goes through the fallback."""

from __future__ import annotations

import numpy as np
import pytest

from capsule_rollout.capsules.rng_state import PCG64Setter, pcg64_bytes


def _draws(g) -> list:
    g = g if isinstance(g, np.random.Generator) else np.random.Generator(g)
    return [*g.integers(0, 2**32, 3, dtype=np.uint32).tolist(), *g.random(3).tolist()]


@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize("bare", [False, True])
def test_a_pcg64_state_set_by_its_bytes_is_the_state_numpy_sets(half, bare):
    source = np.random.default_rng(7)
    if half:
        source.integers(0, 2**32, dtype=np.uint32)  # one half of a 64-bit draw kept: has_uint32 = 1
    state = source.bit_generator.state
    assert state["has_uint32"] == int(half)
    calls = []
    setter = PCG64Setter(lambda g, s: calls.append((g, s)))
    target = np.random.default_rng(123)
    for _ in range(3):  # again from the addresses and bytes it found the first time
        target.random(5)
        setter.set(target.bit_generator if bare else target, state)
        assert target.bit_generator.state == state
        expected = np.random.default_rng()
        expected.bit_generator.state = state
        assert _draws(target) == _draws(expected)
    assert not calls


def test_other_generators_and_states_go_through_the_fallback():
    calls = []
    setter = PCG64Setter(lambda g, s: calls.append((type(g).__name__, s)))
    legacy = np.random.RandomState(0)
    setter.set(legacy, legacy.get_state(legacy=False))
    philox = np.random.Generator(np.random.Philox(0))
    setter.set(philox, philox.bit_generator.state)
    bad = {**np.random.default_rng(0).bit_generator.state, "has_uint32": 2}
    setter.set(np.random.default_rng(0), bad)
    assert [name for name, _ in calls] == ["RandomState", "Generator", "Generator"]
    assert pcg64_bytes(bad) is None and pcg64_bytes({"bit_generator": "PCG64"}) is None
    assert len(pcg64_bytes(np.random.default_rng(0).bit_generator.state)) == 40
