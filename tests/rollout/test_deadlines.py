"""The deadlines: per phase, learned from the longest times the actors measure (first occurrences apart, the
first-call allowance for what nothing measured), the driver's deadline of a whole call, fixed, or off."""

import math

import pytest

from capsule_rollout.rollout.branching import BranchItem
from capsule_rollout.rollout.deadlines import (
    FIRST_CALL_S,
    FLOOR_S,
    MARGIN,
    CallDeadlines,
    DeadlineSettings,
    FixedDeadlines,
    PhaseDeadlines,
    call_deadlines,
)
from capsule_rollout.rollout.phase_clock import CHUNK, COLD_RESET, HOST, RESTORE, STEP, Hang, PhaseClock
from capsule_rollout.rollout.rollout_actor import ActorReport, WorkItem

NAN = math.nan
ITEM = WorkItem("e", 1)


def _report(steps: int, busy_s: float, step_limit: int = 1000, phases=None) -> ActorReport:
    return ActorReport(None, "cold", 0.0, 0.0, "", 1, steps=steps, busy_s=busy_s, step_limit=step_limit,
                       phases=phases or {})


def test_the_defaults_are_the_documented_ones():
    settings = DeadlineSettings()
    assert (settings.margin, settings.floor_s, settings.first_call_s) == (MARGIN, FLOOR_S, FIRST_CALL_S) == (3.0, 30.0,
                                                                                                            600.0)


def test_a_phase_never_measured_gets_the_first_call_allowance_and_a_measured_one_margin_times_its_longest():
    deadlines = PhaseDeadlines(DeadlineSettings(floor_s=1.0, first_call_s=50.0))
    assert deadlines.phase_s(STEP, first=False) == deadlines.phase_s(STEP, first=True) == 50.0
    deadlines.merge({STEP: (0.9, 0.5), CHUNK: (4.0, 0.1)})  # the first chunk compiles
    assert deadlines.phase_s(STEP, first=False) == pytest.approx(1.5)  # 3 x the longest later step
    assert deadlines.phase_s(STEP, first=True) == pytest.approx(2.7)
    assert deadlines.phase_s(CHUNK, first=False) == 1.0  # the floor
    assert deadlines.phase_s(CHUNK, first=True) == pytest.approx(12.0)  # a fresh process's first chunk: learned
    deadlines.merge({CHUNK: (40.0, NAN)})  # a compile of 40 s: 3 x 40 is past the allowance
    assert deadlines.phase_s(CHUNK, first=True) == 50.0  # bounded by it
    assert deadlines.merge({CHUNK: (1.0, 0.05)}) is False  # nothing longer: no deadline grew
    assert deadlines.merge({CHUNK: (1.0, 0.2)}) is False  # longer, but 3 x 0.2 s is still under the floor
    assert deadlines.merge({CHUNK: (1.0, 0.5)}) is True


def test_a_slow_cold_reset_keeps_its_own_deadline_after_restores():
    """The issue's case: cold resets of 35 s (a generated scene) between restores of milliseconds; the cold
    reset's deadline is learned from the first one (an actor's first call included), never the restore's."""
    deadlines = PhaseDeadlines()
    deadlines.merge({COLD_RESET: (35.0, NAN)})  # the first call: one cold reset
    deadlines.merge({RESTORE: (0.002, 0.001)})
    assert deadlines.phase_s(COLD_RESET, first=False) == pytest.approx(105.0)  # later ones: as long as the first
    assert deadlines.phase_s(RESTORE, first=False) == FLOOR_S
    assert deadlines.phase_s(COLD_RESET, first=True) == pytest.approx(105.0)


def test_settings_refuse_what_makes_no_deadline():
    for bad in (dict(floor_s=0), dict(floor_s=math.inf), dict(first_call_s=math.nan), dict(margin=-1)):
        with pytest.raises(ValueError, match="must be a finite number > 0"):
            DeadlineSettings(**bad)
    with pytest.raises(ValueError, match="exceeds the first-call allowance"):
        DeadlineSettings(floor_s=60, first_call_s=30)


def test_the_clock_records_the_longest_time_per_phase_its_first_apart_and_hands_them_over_once():
    clock = PhaseClock(lambda: 7)
    clock.enter(RESTORE)
    clock.switch(COLD_RESET)  # nothing kept: it was a cold reset
    assert clock.now[0] == COLD_RESET and clock.now[2] is True
    for _ in range(3):
        clock.enter(STEP)
        clock.enter(HOST)
    clock.enter(None)
    assert clock.now[0] is None and clock.step() == 7
    times = clock.take_times()
    assert set(times) == {COLD_RESET, STEP, HOST}
    assert not math.isnan(times[STEP][0]) and not math.isnan(times[STEP][1])  # the first step, and the later ones
    assert math.isnan(times[COLD_RESET][1])  # one cold reset: no later one
    clock.enter(RESTORE)  # a restore miss before did not count: this is the first
    assert clock.now[2] is True
    assert clock.take_times() == {}  # handed over already


def test_a_hang_says_where_and_its_place_is_what_repeats():
    hang = Hang(STEP, 3, 2.04, 2.0, False)
    assert str(hang) == "hung: env step 3 ran 2.0 s, past its 2.0 s deadline" and hang.place == (STEP, 3)
    assert "its first in the process" in str(Hang(CHUNK, 0, 601.0, 600.0, True))


def test_the_call_deadline_covers_the_expected_work_and_the_longest_phase_deadline():
    deadlines = CallDeadlines(DeadlineSettings(floor_s=1.0, first_call_s=50.0))
    assert deadlines.call_s([ITEM, ITEM], first_call=False) == 100.0  # nothing measured: the allowance per item
    deadlines.learn([_report(500, 10.0, phases={COLD_RESET: (5.0, NAN)})], rate=False)  # an actor's first call
    assert not deadlines.measured and deadlines.phases.phase_s(COLD_RESET, False) == pytest.approx(15.0)
    deadlines.learn([_report(500, 10.0), _report(1000, 20.0)], rate=True)  # 20 ms a step
    one = MARGIN * (1000 * 0.02 + 5.0)  # the step limit at that rate, plus the longest reset
    assert deadlines.item_s(ITEM) == pytest.approx(one)
    longest = deadlines.phases.longest_s()
    assert longest == 50.0  # the allowance is the longest a phase may take here
    assert deadlines.call_s([ITEM] * 3, first_call=False) == pytest.approx(3 * one + longest)
    assert deadlines.call_s([ITEM], first_call=True) == pytest.approx(one + longest + 50.0)
    branch = BranchItem("b", 1, steps=(4, 8), branches=3)  # the episode, the replay, 3 x 2 branches
    assert deadlines.item_s(branch) == pytest.approx(MARGIN * (1000 * 8 * 0.02 + 5.0))


def test_a_number_is_a_fixed_deadline_per_item_and_zero_none():
    assert isinstance(call_deadlines(None), CallDeadlines) and call_deadlines(None).watches_phases
    fixed = call_deadlines(10.0)
    assert fixed.learn([_report(1000, 500.0)], rate=True) is False  # measurements change nothing
    assert isinstance(fixed, FixedDeadlines) and fixed.call_s([ITEM, ITEM], first_call=True) == 20.0
    assert not fixed.watches_phases
    assert call_deadlines(0).call_s([ITEM], first_call=False) is None
