"""An env's capsule in the scenarios rollouts put it through (`envs.env_scenarios`, `verify_capsule --env`): right
after a reset, after a reset to another seed, many restores in a row, restored into an env built from scratch in
another process; and the report naming the first output that differs for envs broken on purpose."""

from __future__ import annotations

import json

import pytest

from capsule_rollout.envs.env_scenarios import SCENARIOS, verify_scenarios
from capsule_rollout.envs.suites.gymnasium_v5 import TASKS
from capsule_rollout.experiments.run import main
from capsule_rollout.tabletop.tasks import FAMILY_NAMES

BROKEN = "tests.envs.broken_envs"


@pytest.mark.parametrize("env_id", ["gymnasium:Pusher-v5", "tabletop:pick_place", f"{BROKEN}:make_boxes"])
def test_every_scenario_holds_bit_for_bit(env_id):
    report = verify_scenarios(env_id, steps=6)
    assert report.ok and set(report.checks) == set(SCENARIOS), report.failures()


@pytest.mark.slow
@pytest.mark.parametrize("env_id", [*(f"gymnasium:{t}" for t in TASKS), *(f"tabletop:{f}" for f in FAMILY_NAMES)])
def test_every_registered_env_holds_in_every_scenario(env_id):
    report = verify_scenarios(env_id, steps=6)
    assert report.ok, report.failures()


def test_a_counter_the_env_keeps_to_itself_is_named():
    report = verify_scenarios(f"{BROKEN}:make_counter", steps=4)
    assert not report.ok
    for scenario in ("after_reset", "other_seed", "many_restores"):
        # the step count is the observation's last element; the physics came back exactly
        assert report.divergences[scenario].startswith("step 0 obs.state[17]: ")
        assert report.divergences[scenario].endswith("(MjData identical: state kept outside MjData)")
    assert "has no attribute 'count'" in report.errors["fresh_process"]  # never set in a fresh env


def test_physics_stepped_mj_step2_first_is_named_by_its_mjdata_field():
    report = verify_scenarios(f"{BROKEN}:make_step2_first", steps=4)
    assert not report.ok
    assert report.divergences["after_reset"].startswith("step 0 MjData.qpos[")


def test_verify_capsule_reports_the_scenarios_and_fails_on_a_broken_env(tmp_path):
    assert main(["verify_capsule", "--env", f"{BROKEN}:make_counter", "--steps", "4",
                 "--json", str(tmp_path / "v.json")]) == 1
    scenarios = json.loads((tmp_path / "v.json").read_text())["scenarios"]
    assert not scenarios["ok"] and "obs.state[17]" in scenarios["divergences"]["after_reset"]
