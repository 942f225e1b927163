"""Meta-World and gymnasium-robotics through the adapter: bit-exact capsules, the scan, the scripted policy.

These need the suites' extra (`make suites-venv`: mujoco 3.3.0, Meta-World, gymnasium-robotics); where a
suite is missing or cannot run on this MuJoCo they skip, saying why. `make test-slow` runs them in that venv.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from capsule_rollout.capsules import Arena, restore, snapshot, verify_steppable
from capsule_rollout.envs.env_scenarios import verify_scenarios
from capsule_rollout.envs.suites import SUITES, SuiteUnavailableError, expert_for, make_env
from capsule_rollout.rollout.host_config import episode_id

pytestmark = pytest.mark.slow


def _need(suite: str) -> None:
    try:
        SUITES[suite].load()
    except SuiteUnavailableError as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize("env_id", ["metaworld:pick-place-v3", "metaworld:door-open-v3", "metaworld:drawer-close-v3",
                                    "metaworld:lever-pull-v3", "metaworld:basketball-v3",
                                    "robotics:FetchPickAndPlace-v4", "robotics:FrankaKitchen-v1"])
def test_verify_bit_exact(env_id):
    from capsule_rollout.envs.mujoco_capsule_steppable import MujocoCapsuleSteppable

    _need(env_id.split(":")[0])
    report = verify_steppable(lambda: MujocoCapsuleSteppable(env_id), steps=6, warmup=3)
    assert report.bit_exact, report.failures
    scenarios = verify_scenarios(env_id, steps=6)  # as rollouts use the capsule (a fresh process included)
    assert scenarios.ok, scenarios.failures()


def test_metaworld_seed_instruction_expert():
    _need("metaworld")
    env = make_env("metaworld:pick-place-v3", cameras=())
    assert env.instruction == "pick place"
    a = env.reset(seed=1)[0]["state"]
    b = env.reset(seed=2)[0]["state"]
    c = env.reset(seed=1)[0]["state"]
    assert not np.array_equal(a, b) and np.array_equal(a, c)  # the seed decides the task, Meta-World's reset does not
    act = expert_for(env)
    info = {}
    for _ in range(env.max_steps):
        _, _, terminated, truncated, info = env.step(act())
        if terminated or truncated:
            break
    assert env.success(info)
    env.close()


def test_collect_demos_records_the_suites_scripted_policy(tmp_path):
    from capsule_rollout.cli.run import main
    from capsule_rollout.stores.zarr_reader import ZarrEpisodeReader

    _need("metaworld")
    store, summary = tmp_path / "mw.zarr", tmp_path / "s.json"
    assert main(["collect_demos", "--env", "metaworld:pick-place-v3", "--episodes", "2", "--cameras", "--out",
                 str(store), "--no-progress", "--json", str(summary)]) == 0
    reader = ZarrEpisodeReader(store)
    assert len(reader) == 2 and all(reader.meta(i).instruction == "pick place" for i in range(2))
    assert json.loads(summary.read_text())["plan_completed"] is None  # no coaching outside the tabletop


def test_metaworld_restore_into_fresh_env_moves_the_goal_site():
    """A fresh Meta-World env starts on another task (its goal site elsewhere): a restore brings the
    model field back, so the episode goes on identically."""
    _need("metaworld")
    a, b = make_env("metaworld:pick-place-v3", cameras=()), make_env("metaworld:pick-place-v3", cameras=())
    arena_a, arena_b = Arena([a]).allocate(), Arena([b]).allocate()
    a.reset(seed=7)
    b.reset(seed=8)
    assert not np.array_equal(a.model.site_pos, b.model.site_pos)
    capsule = snapshot(arena_a)
    restore(arena_b, capsule)
    assert np.array_equal(a.model.site_pos, b.model.site_pos)
    actions = np.random.default_rng(0).uniform(-1, 1, (5, 4)).astype(np.float32)
    ra = [a.step(x)[1] for x in actions]
    rb = [b.step(x)[1] for x in actions]
    assert ra == rb


def test_kitchen_scan_and_noise_generator():
    _need("robotics")
    from capsule_rollout.envs.hidden_state_scan import scan_env
    from capsule_rollout.envs.suites import robotics

    env, capture = robotics.make("FrankaKitchen-v1")
    report = scan_env(lambda: robotics.make("FrankaKitchen-v1")[0], capture=capture, steps=5)
    assert any("robot_env._last_robot_qpos" in c for c in report.declared)
    assert any("robot_env._np_random" in g for g in report.generators)  # the per-step observation noise


USER = "tests.envs.user_factories"


def _need_module(name: str, extra: str) -> None:
    import importlib.util

    if importlib.util.find_spec(name) is None:
        pytest.skip(f"{name} is not installed: pip install -e \".[{extra}]\" (make suites-venv)")


@pytest.mark.parametrize("factory", ["so101", "so101_random_block"])
def test_so101_as_its_users_make_it_holds_with_nothing_declared(factory):
    _need_module("lerobot_env_so101", "so101")
    report = verify_scenarios(f"{USER}:{factory}", cameras=(), steps=6)
    assert report.ok, report.failures()
    assert report.capture["kinds"]["generator"] >= 2  # its Generator and its legacy RandomState


def test_aloha_as_its_users_make_it_holds_with_nothing_declared():
    """dm_control physics (mj_step2 first), its named indexers, GL contexts and PassiveEnvChecker's last
    observation: bit-exact in every scenario, a fresh process included."""
    _need_module("gym_aloha", "aloha")
    report = verify_scenarios(f"{USER}:aloha_insertion", cameras=(), steps=3, restores=2)
    assert report.ok, report.failures()
    assert report.capture["after_mj_step1"]
    assert any("_warnings" in path for path in report.capture["aliases"])  # dm_control's view of MjData.warning


@pytest.mark.parametrize("factory", ["dm_control_finger", "dm_control_humanoid"])
def test_dm_control_through_shimmy_holds_in_every_scenario(factory):
    """dm_control's suite as gymnasium users make it (shimmy): every scenario, the fresh process included (its last
    time step holds a `dm_env.StepType`, a class of a package dm_control imports, absent from a fresh env)."""
    _need_module("shimmy", "dmcontrol")
    report = verify_scenarios(f"{USER}:{factory}", cameras=(), steps=3, restores=2)
    assert report.ok, report.failures()


@pytest.mark.parametrize("factory", ["robosuite_lift", "robosuite_stack", "robosuite_door"])
def test_robosuite_as_its_users_make_it_holds_with_nothing_declared(factory):
    """robosuite's own env in its GymWrapper: a new MjModel / MjData at every reset (object sizes and poses drawn
    into the model), controllers and observables rebuilt, a generator shared with the placement sampler,
    aliases of MjData in the robot: bit-exact in every scenario, a fresh process (another build) included."""
    _need_module("robosuite", "robosuite: make suites-venv")
    report = verify_scenarios(f"{USER}:{factory}", cameras=(), steps=4, restores=2)
    assert report.ok, report.failures()
    assert "env.env.robots[0].base_pos" in report.capture["aliases"]


@pytest.mark.parametrize("factory", ["robosuite_lift_camera", "aloha_insertion", "pendulum_pixels"])
def test_camera_observations_hold_bit_for_bit_and_replay(factory, tmp_path):
    """Cameras on, the image is the observation: robosuite's camera observation (as robomimic- and LIBERO-style
    policies read it), gym-aloha's default 480x640 picture, gymnasium's `AddRenderObservation`; the framework's
    camera rendered too. The harness, every scenario (another env dropped beside it, a fresh process), and a
    recorded episode replayed bit for bit."""
    from capsule_rollout.envs.mujoco_capsule_steppable import MujocoCapsuleSteppable

    _need_module({"robosuite_lift_camera": "robosuite", "aloha_insertion": "gym_aloha"}.get(factory, "gymnasium"),
                 "make suites-venv")
    env_id = f"{USER}:{factory}"
    report = verify_steppable(lambda: MujocoCapsuleSteppable(env_id), steps=3, warmup=2)
    assert report.bit_exact, report.failures
    scenarios = verify_scenarios(env_id, steps=3, restores=2)
    assert scenarios.ok, scenarios.failures()
    _rolls_out_and_replays(env_id, tmp_path, actors=0, max_steps=6)


@pytest.mark.parametrize("env_id", ["so101:SO101PickCube-v0", "aloha:AlohaTransferCube-v0", "robosuite:Lift"])
def test_registered_suite_holds_and_rolls_out_on_ray_and_replays(env_id, tmp_path):
    """The registered suite (its default camera rendered by the framework): every scenario bit-exact, then
    `sim_rollout --actors 2` with a policy given by import path, and `replay` of a recorded episode."""

    _need(env_id.split(":")[0])
    report = verify_scenarios(env_id, steps=3, restores=2)
    assert report.ok, report.failures()
    # the episode named with its task as written (`so101:SO101PickCube-v0-s1000001-r1`): replay finds its file-safe id
    _rolls_out_and_replays(env_id, tmp_path, actors=2, max_steps=16, episode=f"{env_id}-s1000001-r1")


def _rolls_out_and_replays(env_id: str, tmp_path, *, actors: int, max_steps: int, episode: str = "") -> None:
    """`sim_rollout` of 2 seeds x 2 repeats with a noise policy given by import path, then `replay` of seed 1's
    repeat, bit-identical."""
    from capsule_rollout.cli.run import main

    out = tmp_path / "run"
    assert main(["sim_rollout", "--env", env_id, "--policy", f"{USER}:make_noise_policy", "--actors", str(actors),
                 "--seeds.count", "2", "--repeats", "2", "--max_steps", str(max_steps), "--out", str(out),
                 "--no-progress", "--json", str(tmp_path / "s.json")]) == 0
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["episodes"] == 4 and summary["reset_kinds"] == {"cold": 2, "restore": 2}, summary
    assert main(["replay", "--store", str(out / "episodes.zarr"), "--episode",
                 episode or f"{episode_id(env_id, 1000001)}-r1", "--json", str(tmp_path / "r.json")]) == 0, env_id
    assert json.loads((tmp_path / "r.json").read_text())["exact"]


def test_collect_demos_records_so101s_own_scripted_controller(tmp_path):
    from capsule_rollout.cli.run import main
    from capsule_rollout.stores.zarr_reader import ZarrEpisodeReader

    _need("so101")
    store = tmp_path / "so101.zarr"
    assert main(["collect_demos", "--env", "so101:SO101PickCube-v0", "--episodes", "1", "--out", str(store),
                 "--no-progress"]) == 0
    reader = ZarrEpisodeReader(store)
    assert len(reader) == 1 and reader.meta(0).instruction == "pick up the cube"


@pytest.mark.parametrize(("env_id", "module", "as_data"), [
    ("metaworld:pick-place-v3", "metaworld", "bit-exact"),
    ("robotics:FetchPickAndPlace-v4", "gymnasium_robotics", "bit-exact"),
    (f"{USER}:point_maze", "gymnasium_robotics", "bit-exact"),
    (f"{USER}:adroit_door", "gymnasium_robotics", "bit-exact"),
    (f"{USER}:dm_control_finger", "shimmy", "bit-exact"),
    ("so101:SO101PickCube-v0", "lerobot_env_so101", "bit-exact"),
    ("robosuite:Lift", "robosuite", "bit-exact"),
    ("aloha:AlohaTransferCube-v0", "gym_aloha", "PassthroughRenderExecutor"),
])
def test_a_suite_restores_its_own_capsule_and_another_key_s_as_data_or_names_what_it_needs(env_id, module, as_data,
                                                                                           tmp_path):
    """BENCHMARKS' survey of capsules from elsewhere (`tests/reliability/trust_survey.py`), for the suites."""
    from tests.reliability.trust_survey import survey

    _need_module(module, "make suites-venv")
    row = survey(env_id, tmp_path)
    assert row["own"]["outcome"] == "bit-exact", row
    if as_data == "bit-exact":
        assert row["data"]["outcome"] == "bit-exact", row
    else:
        assert row["data"]["outcome"] == "refused" and as_data in row["data"]["why"], row
