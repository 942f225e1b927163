"""`capsules.rng_state.GeneratorSetter`: a state set by copying its words into the generator's C state (a PCG64's 40
bytes, an MT19937 key of numpy's `RandomState` or of Python's `random.Random`, the global `numpy.random` and `random`
included) is the state the generator's own setter sets, whatever it holds (a pending 32-bit half, a pending
Gaussian); anything else goes through the fallback, the generator's own API."""

from __future__ import annotations

import random

import numpy as np
import pytest

from capsule_rollout.capsules.graph.read import set_generator_state
from capsule_rollout.capsules.rng_state import GeneratorSetter, pcg64_bytes


def _draws(g) -> list:
    if isinstance(g, random.Random):
        return [g.random(), g.gauss(0, 1), g.gauss(0, 1), g.getrandbits(40)]
    if isinstance(g, np.random.RandomState):
        return [*g.randint(0, 2**31, 3).tolist(), g.standard_normal(), g.standard_normal(), g.random_sample()]
    return [*g.integers(0, 2**32, 3, dtype=np.uint32).tolist(), *g.random(3).tolist()]


def _state(g):
    if isinstance(g, random.Random):
        return g.getstate()
    if isinstance(g, np.random.RandomState):
        return g.get_state(legacy=False)
    return g.bit_generator.state


def _pending(kind: str, seed: int):
    """A generator of `kind`, with what it keeps between draws pending: half of a 64-bit draw, a second Gaussian."""
    if kind == "pcg64":
        g = np.random.default_rng(seed)
        g.integers(0, 2**32, dtype=np.uint32)
    elif kind == "legacy":
        g = np.random.RandomState(seed)
        g.standard_normal()
    else:
        g = random.Random(seed)
        g.gauss(0, 1)
    return g


@pytest.mark.parametrize("kind", ["pcg64", "legacy", "python"])
def test_a_state_set_by_copying_its_words_is_the_state_its_own_setter_sets(kind):
    state = _state(_pending(kind, 7))
    calls = []
    setter = GeneratorSetter(lambda g, s: calls.append((g, s)))
    target = _pending(kind, 123)
    for _ in range(3):  # again from the addresses and bytes it found the first time
        _draws(target)
        setter.set(target, state)
        assert _state(target).__repr__() == state.__repr__()
        expected = _pending(kind, 0)
        set_generator_state(expected, state)
        assert _draws(target) == _draws(expected)
    assert not calls


def test_the_global_generators_are_set_by_their_words():
    numpy_state, python_state = _state(_pending("legacy", 3)), _state(_pending("python", 4))
    setter = GeneratorSetter(lambda g, s: pytest.fail("no fallback expected"))
    np.random.standard_normal(), random.gauss(0, 1)
    setter.set_globals(numpy_state, python_state)
    assert repr(np.random.get_state(legacy=False)) == repr(numpy_state) and random.getstate() == python_state
    legacy, python = _pending("legacy", 0), _pending("python", 0)
    legacy.set_state(numpy_state), python.setstate(python_state)
    assert [np.random.standard_normal(), np.random.random_sample()] == [legacy.standard_normal(), legacy.random_sample()]
    assert [random.gauss(0, 1), random.random()] == [python.gauss(0, 1), python.random()]


class OwnRandom(random.Random):
    pass


def test_other_generators_and_states_go_through_the_fallback():
    calls = []
    setter = GeneratorSetter(lambda g, s: calls.append(type(g).__name__))
    philox = np.random.Generator(np.random.Philox(0))
    setter.set(philox, philox.bit_generator.state)
    setter.set(np.random.default_rng(0), {**np.random.default_rng(0).bit_generator.state, "has_uint32": 2})
    over_pcg = np.random.RandomState(np.random.PCG64(0))
    setter.set(over_pcg, over_pcg.get_state(legacy=False))
    legacy = np.random.RandomState(0)
    far = legacy.get_state(legacy=False)
    setter.set(legacy, {**far, "state": {**far["state"], "pos": 10**7}})
    own = OwnRandom(0)
    setter.set(own, own.getstate())
    setter.set(random.Random(0), (2, random.Random(0).getstate()[1], None))
    assert calls == ["Philox", "PCG64", "RandomState", "RandomState", "OwnRandom", "Random"]
    assert pcg64_bytes({"bit_generator": "PCG64"}) is None
    assert len(pcg64_bytes(np.random.default_rng(0).bit_generator.state)) == 40
