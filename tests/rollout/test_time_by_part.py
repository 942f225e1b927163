"""Where a run's time goes (`time_by_part` in its summary): the seconds each host phase and part took, counted once
(each clock's totals are taken and zeroed), never more than the time the run took."""

import time

import pytest

from capsule_rollout.rollout.host_factory import RunSpec
from capsule_rollout.rollout.phase_clock import CAPSULE, HOST, RECORD_STEP, STEP, PhaseClock, combined_totals
from capsule_rollout.rollout.ray_rollout import run_rollouts, summarize_run
from capsule_rollout.rollout.rollout_actor import WorkItem
from capsule_rollout.rollout.rollout_host import HostConfig
from tests.policies.tiny import save_tiny_checkpoints


def test_a_clock_totals_its_phases_and_parts_and_each_second_is_taken_once():
    clock, other = PhaseClock(), PhaseClock()
    clock.enter(STEP)
    time.sleep(0.01)
    clock.enter(HOST)
    clock.add(RECORD_STEP, 0.002)
    clock.add(RECORD_STEP, 0.003)
    other.enter(STEP)
    other.enter(None)
    totals = combined_totals([clock, other])
    assert totals[STEP] >= 0.01 and totals[RECORD_STEP] == pytest.approx(0.005)
    assert HOST not in totals  # still in it: counted when it ends
    clock.enter(None)
    again = combined_totals([clock, other])
    assert set(again) == {HOST} and combined_totals([clock, other]) == {}
    clock.add(CAPSULE, 0.5)  # a part needs no phase
    assert clock.take_totals() == {CAPSULE: 0.5}


def test_a_run_says_where_its_time_went_in_its_summary(tmp_path):
    policy, critic = save_tiny_checkpoints(tmp_path / "ckpt")
    spec = RunSpec(env="tabletop:pick_place", policy=policy, critic=critic, host=HostConfig(n_exec=2, max_steps=8),
                   capsule_dir=str(tmp_path / "capsules"))
    t0 = time.perf_counter()
    reports, stats = run_rollouts(spec, [WorkItem(f"e{s}", s) for s in (1, 2)], actors=0, repeats=2)
    wall = time.perf_counter() - t0
    parts = summarize_run(reports, stats)["time_by_part"]
    seconds, steps = parts["seconds"], sum(r.episode.meta.length for r in reports)
    assert parts["steps"] == steps and len(reports) == 4
    # 2 cold resets (each making and keeping its capsule, then saving it), 2 restores (the repeats)
    assert {"env_step", "models", "host_loop", "record_step", "cold_reset", "capsule", "restore", "capsule_save",
            "driver_record"} <= set(seconds)
    assert all(v > 0 for v in seconds.values())
    assert seconds["record_step"] < seconds["host_loop"] and seconds["capsule"] < seconds["cold_reset"]
    phases = sum(seconds[k] for k in ("env_step", "models", "host_loop", "cold_reset", "restore"))
    assert phases < wall  # one thread: its phases fit in the time the run took
    assert parts["ms_per_step"]["env_step"] == pytest.approx(seconds["env_step"] * 1e3 / steps)
