import numpy as np
import torch

from capsule_rollout.capsules import verify_steppable
from capsule_rollout.capsules.reference_components import CombinedStandIn, NoisyChunkSteppable, NumpyWalkerSteppable


def test_standins_are_bit_exact_on_every_check():
    for factory in (NoisyChunkSteppable, NumpyWalkerSteppable, CombinedStandIn):
        report = verify_steppable(factory, steps=6, warmup=5)
        assert report.bit_exact, (report.name, report.failures)
        assert report.max_abs_diff == 0.0 and report.cosine == 1.0
        assert set(report.checks) == {
            "restore_after_dirty", "restore_idempotent", "fork_branch_exact",
            "fork_branches_independent", "capsule_untouched", "addresses_static",
        }
        assert report.capsule_bytes > 0
        assert report.device == "cpu"


def test_boundary_is_rounded_up_to_the_chunk_alignment():
    # the policy's queue declares alignment 4: warmup 5 -> boundary 8, no refusal
    report = verify_steppable(NoisyChunkSteppable, steps=3, warmup=5)
    assert report.bit_exact, report.failures


class _ForgetsGenerator(NoisyChunkSteppable):
    """Negative control: live generator state is not reloaded after a restore."""

    def __init__(self):
        super().__init__()
        self.policy.after_restore = lambda: None


class _HiddenState(NumpyWalkerSteppable):
    """Negative control: part of the state lives outside the arena."""

    def __init__(self):
        super().__init__()
        self.hidden = 0.0

    def step(self, inputs):
        out = super().step(inputs)
        self.hidden += float(np.abs(self.walker.pos).sum())
        return {**out, "hidden": torch.tensor(self.hidden)}


class _AliasedFork(NumpyWalkerSteppable):
    """Negative control: every instance shares one global array for velocity."""

    shared = np.zeros((4, 3), dtype=np.float32)

    def step(self, inputs):
        out = super().step(inputs)
        _AliasedFork.shared += self.walker.vel
        self.walker.vel[:] = _AliasedFork.shared
        return out


def test_harness_catches_broken_components():
    lost_rng = verify_steppable(_ForgetsGenerator)
    assert not lost_rng.bit_exact and not lost_rng.checks["restore_after_dirty"]
    assert lost_rng.max_abs_diff > 0 and lost_rng.cosine < 1.0
    hidden = verify_steppable(_HiddenState)
    assert not hidden.bit_exact and not hidden.checks["restore_after_dirty"]
    aliased = verify_steppable(_AliasedFork)
    assert not aliased.bit_exact


def test_a_crashing_component_is_reported_not_raised():
    class Crashes(NumpyWalkerSteppable):
        calls = 0

        def step(self, inputs):
            Crashes.calls += 1
            if Crashes.calls > 6:
                raise RuntimeError("sensor unplugged")
            return super().step(inputs)

    report = verify_steppable(Crashes, steps=4, warmup=0)
    assert not report.bit_exact
    assert any("sensor unplugged" in f for f in report.failures)


def test_a_failed_check_names_the_first_output_that_differs():
    hidden = verify_steppable(_HiddenState, steps=3)
    why = hidden.divergences["restore_after_dirty"]
    assert why.startswith("step 0 hidden: ") and why.endswith("1 of 1 values differ"), why
    assert f"check failed: restore_after_dirty ({why})" in hidden.failures


def test_an_image_differs_by_pixel_a_state_by_element():
    from capsule_rollout.capsules.verify import first_difference

    ref = np.zeros((4, 5, 3), np.uint8)
    got = ref.copy()
    got[2, 3, 1], got[3, 0, 2], got[3, 0, 0] = 7, 9, 1
    assert first_difference("obs.image_top", ref, got) == "obs.image_top[2, 3, 1]: 0 vs 7, 2 of 20 pixels differ"
    assert first_difference("obs.image_top", ref, ref.copy()) is None
    state = np.array([0.5, np.nan, 2.0], np.float32)
    assert first_difference("state", state, state.copy()) is None  # NaN-safe: the same bits
    other = state.copy()
    other[2] = 3.0
    assert first_difference("state", state, other) == "state[2]: 2.0 vs 3.0, 1 of 3 values differ"
    assert first_difference("state", state, state[:2]) == "state: (3,) float32 vs (2,) float32"
