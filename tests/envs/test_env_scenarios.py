"""An env's capsule in the scenarios rollouts put it through (`envs.env_scenarios`, `verify_capsule --env`): right
after a reset, after a reset to another seed, many restores in a row, restored into an env built from scratch in
another process; and the report naming the first output that differs for envs broken on purpose."""

from __future__ import annotations

import json

import numpy as np
import pytest

from capsule_rollout.cli.run import main
from capsule_rollout.envs.env_scenarios import SCENARIOS, verify_scenarios
from capsule_rollout.envs.suites.gymnasium_v5 import TASKS
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


@pytest.mark.parametrize("factory", ["make_counter", "make_reseeds_in_place", "make_rebuilds_at_reset", "make_alias",
                                     "make_step2_first", "make_user_style", "make_rebuilds_model"])
def test_the_graph_capture_holds_each_broken_env_with_nothing_declared(factory):
    """A counter kept to itself, a generator reseeded in place and shared, an object rebuilt at reset (with a list
    that grows), an alias into MjData, mj_step2-first physics, `gymnasium.make`'s default wrappers, a model
    compiled anew at every reset with a size drawn into it: bit-exact in every scenario, a fresh process
    included, with no declaration."""
    report = verify_scenarios(f"{BROKEN}:{factory}", steps=4)
    assert report.ok and set(report.checks) == set(SCENARIOS), report.failures()


def test_the_graph_capture_names_what_it_found():
    alias = verify_scenarios(f"{BROKEN}:make_alias", steps=3)
    assert alias.capture["aliases"] == {"env.env.puck": "alias of .env.data.qpos +56 B (2,)"}
    reseeded = verify_scenarios(f"{BROKEN}:make_reseeds_in_place", steps=3)
    assert "env.env.rng RandomState" in reseeded.capture["generators"]
    assert verify_scenarios(f"{BROKEN}:make_step2_first", steps=3).capture["after_mj_step1"]
    user = verify_scenarios(f"{BROKEN}:make_user_style", steps=3)
    assert user.capture["python_bytes"] < user.capture["python_capacity"]


def test_an_alias_is_relinked_in_a_fresh_env_not_copied():
    from capsule_rollout.capsules import Arena, restore, snapshot
    from capsule_rollout.envs.suites import make_env

    source, target = make_env(f"{BROKEN}:make_alias"), make_env(f"{BROKEN}:make_alias")
    arena, other = Arena([source]).allocate(), Arena([target]).allocate()
    source.reset(seed=1)
    capsule = snapshot(arena, label="s", step=0)
    target.reset(seed=2)
    restore(other, capsule)
    puck, data = target.env.unwrapped.puck, target.env.unwrapped.data
    assert np.shares_memory(puck, data.qpos) and np.array_equal(puck, source.env.unwrapped.data.qpos[7:9])
    data.qpos[7] += 1.0
    assert puck[0] == data.qpos[7]


def test_a_counter_the_env_keeps_to_itself_is_named():
    report = verify_scenarios(f"{BROKEN}:make_counter_declared", steps=4)
    assert not report.ok
    for scenario in ("after_reset", "other_seed", "many_restores"):
        # the step count is the observation's last element; the physics came back exactly
        assert report.divergences[scenario].startswith("step 0 obs.state[17]: ")
        assert report.divergences[scenario].endswith("(MjData identical: state kept outside MjData)")
        assert "env.env.count" in report.python_paths[scenario]
    assert "has no attribute 'count'" in report.errors["fresh_process"]  # never set in a fresh env


def test_a_generator_reseeded_in_place_is_named():
    report = verify_scenarios(f"{BROKEN}:make_reseeds_in_place_declared", steps=4)
    assert not report.ok
    assert report.divergences["after_reset"].startswith("step 0 MjData.qpos[")
    assert report.python_paths["after_reset"] == ["env.env.rng"]


def test_an_object_rebuilt_at_reset_is_named():
    report = verify_scenarios(f"{BROKEN}:make_rebuilds_at_reset_declared", steps=4)
    assert not report.ok
    paths = report.python_paths["other_seed"]
    assert "env.env.controller.goal" in paths and "env.env.controller.integral" in paths
    assert "has no attribute 'controller'" in report.errors["fresh_process"]


def test_physics_stepped_mj_step2_first_is_named_by_its_mjdata_field():
    report = verify_scenarios(f"{BROKEN}:make_step2_first_declared", steps=4)
    assert not report.ok
    assert report.divergences["after_reset"].startswith("step 0 MjData.qpos[")


def test_verify_capsule_reports_the_scenarios_and_fails_on_a_broken_env(tmp_path):
    assert main(["verify_capsule", "--env", f"{BROKEN}:make_counter_declared", "--steps", "4",
                 "--json", str(tmp_path / "v.json")]) == 1
    scenarios = json.loads((tmp_path / "v.json").read_text())["scenarios"]
    assert not scenarios["ok"] and "obs.state[17]" in scenarios["divergences"]["after_reset"]


@pytest.mark.parametrize("factory", ["make_rebuilds_at_reset", "make_rebuilds_model", "make_user_style"])
def test_verify_capsule_holds_graph_captured_envs_bit_for_bit(factory, tmp_path):
    """The harness's checks too: restore after the env was played elsewhere and its model perturbed, twice in a
    row, a fork into a fresh env; the capsule's bytes after the replay equal the first run's (the Python
    state's encoding depends on its values alone)."""
    assert main(["verify_capsule", "--env", f"{BROKEN}:{factory}", "--steps", "4",
                 "--json", str(tmp_path / "v.json")]) == 0
    assert json.loads((tmp_path / "v.json").read_text())["all_bit_exact"]
