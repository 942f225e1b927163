"""The driver's call deadlines: derived from the steps and seconds the actors report, fixed, or off."""

import pytest

from capsule_rollout.rollout.branching import BranchItem
from capsule_rollout.rollout.deadlines import (
    FIRST_CALL_S,
    FLOOR_S,
    MARGIN,
    DerivedDeadlines,
    FixedDeadlines,
    call_deadlines,
)
from capsule_rollout.rollout.rollout_actor import ActorReport, WorkItem


def _report(steps: int, busy_s: float, step_limit: int = 1000) -> ActorReport:
    return ActorReport(None, "cold", 0.0, 0.0, "", 1, steps=steps, busy_s=busy_s, step_limit=step_limit)


ITEM = WorkItem("e", 1)


def test_before_any_step_is_measured_every_call_gets_the_first_call_allowance():
    deadlines = DerivedDeadlines()
    assert deadlines.call_s([ITEM], first_call=False) == FIRST_CALL_S
    deadlines.observe([_report(0, 2.0)])  # failed before its first step: no rate yet
    assert deadlines.call_s([ITEM, ITEM], first_call=False) == FIRST_CALL_S


def test_the_deadline_scales_with_the_step_limit_and_the_measured_step_time():
    deadlines = DerivedDeadlines()
    deadlines.observe([_report(500, 10.0), _report(1000, 20.0)])  # 20 ms a step, nothing besides
    assert deadlines.seconds_per_step == pytest.approx(0.02) and deadlines.extra_s == 0
    assert deadlines.call_s([ITEM], first_call=False) == pytest.approx(MARGIN * 1000 * 0.02)
    assert deadlines.call_s([ITEM] * 3, first_call=False) == pytest.approx(3 * MARGIN * 1000 * 0.02)  # per item
    assert deadlines.call_s([ITEM], first_call=True) == FIRST_CALL_S  # a fresh process: its first compile
    branch = BranchItem("b", 1, steps=(4, 8), branches=3)  # the episode, the replay, 3 x 2 branches
    assert deadlines.call_s([branch], first_call=False) == pytest.approx(MARGIN * 1000 * 8 * 0.02)


def test_an_item_slow_besides_its_steps_raises_every_deadline_by_that_time():
    deadlines = DerivedDeadlines()
    deadlines.observe([_report(1000, 10.0), _report(1000, 10.0)])
    deadlines.observe([_report(1000, 30.0)])  # a cold reset of 20 s beyond its steps at 10 ms
    expected = MARGIN * (1000 * deadlines.seconds_per_step + 20.0)
    assert deadlines.extra_s == pytest.approx(20.0)
    assert deadlines.call_s([ITEM], first_call=False) == pytest.approx(expected)


def test_short_episodes_get_the_floor_and_the_largest_step_limit_counts():
    deadlines = DerivedDeadlines()
    deadlines.observe([_report(6, 0.06, step_limit=6), _report(6, 0.06, step_limit=8)])
    assert deadlines.step_limit == 8
    assert deadlines.call_s([ITEM], first_call=False) == FLOOR_S


def test_a_number_is_a_fixed_deadline_per_item_and_zero_none():
    assert isinstance(call_deadlines(None), DerivedDeadlines)
    fixed = call_deadlines(10.0)
    fixed.observe([_report(1000, 500.0)])  # measurements change nothing
    assert isinstance(fixed, FixedDeadlines) and fixed.call_s([ITEM, ITEM], first_call=True) == 20.0
    assert call_deadlines(0).call_s([ITEM], first_call=False) is None
