"""The generic gymnasium-MuJoCo capsule adapter on gymnasium's own v5 envs (no extra needed)."""

from __future__ import annotations

import gymnasium as gym
import mujoco
import numpy as np
import pytest

from capsule_rollout.capsules import Arena, restore, snapshot, verify_steppable
from capsule_rollout.envs.hidden_state_scan import scan_env
from capsule_rollout.envs.mujoco_capsule import Attr, CaptureSpec, MujocoCapsuleEnv, MujocoCapsuleError, memory_view
from capsule_rollout.envs.mujoco_capsule_steppable import MujocoCapsuleSteppable
from capsule_rollout.envs.rollout_env import RolloutEnv
from capsule_rollout.envs.suites import make_env, parse_env_id


@pytest.mark.parametrize("env_id", ["gymnasium:Pusher-v5", "gymnasium:Ant-v5", "gymnasium:Hopper-v5"])
def test_verify_bit_exact(env_id):
    """Observations, rewards, the whole MjData and images after warm-up, dirty restore, fork, idempotence."""
    report = verify_steppable(lambda: MujocoCapsuleSteppable(env_id), steps=6, warmup=3)
    assert report.bit_exact, report.failures
    assert set(report.checks) >= {"restore_after_dirty", "restore_idempotent", "fork_branch_exact"}


def _rollout(env, arena, capsule, actions):
    restore(arena, capsule)
    out = []
    for a in actions:
        obs, reward, *_ = env.step(a)
        out.append((obs["state"].copy(), reward, obs["image_free"].copy()))
    return out


def test_restore_needs_the_derived_mjdata():
    """Ant's reward reads the torso position (xpos) before mj_step: restoring the integration state and
    calling mj_forward, as usual, changes the reward; the adapter's whole-buffer restore does not."""
    env = make_env("gymnasium:Ant-v5")
    arena = Arena([env]).allocate()
    env.reset(seed=3)
    actions = np.random.default_rng(0).uniform(-1, 1, (4, 8)).astype(np.float32)
    env.step(actions[0])
    capsule = snapshot(arena, step=1, force=True)
    ref = _rollout(env, arena, capsule, actions)
    again = _rollout(env, arena, capsule, actions)
    assert all(np.array_equal(a[0], b[0]) and a[1] == b[1] and np.array_equal(a[2], b[2]) for a, b in zip(ref, again))
    restore(arena, capsule)
    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    state = np.empty(mujoco.mj_stateSize(env.model, spec))
    mujoco.mj_getState(env.model, env.data, state, spec)
    mujoco.mj_setState(env.model, env.data, state, spec)
    mujoco.mj_forward(env.model, env.data)  # the usual restore: derived arrays recomputed from qpos
    reward = env.step(actions[0])[1]
    assert reward != ref[0][1]
    env.close()


def test_fresh_fork_renders_the_same_image():
    a, b = make_env("gymnasium:Ant-v5"), make_env("gymnasium:Ant-v5")
    arena_a, arena_b = Arena([a]).allocate(), Arena([b]).allocate()
    a.reset(seed=5)
    for _ in range(3):
        a.step(np.full(8, 0.3, np.float32))
    capsule = snapshot(arena_a, step=3, force=True)
    restore(arena_b, capsule)
    assert np.array_equal(a.observe()["image_free"], b.observe()["image_free"])
    assert np.array_equal(a.render("free"), b.render("free"))
    qpos = b.data.qpos.copy()
    b.render("free")
    assert np.array_equal(b.data.qpos, qpos)  # rendering reads MjData only
    a.close(), b.close()


def test_protocol_and_registry():
    env = make_env("gymnasium:Reacher-v5", cameras=())
    assert isinstance(env, RolloutEnv)
    obs, _ = env.reset(seed=0)
    env.observation_spec.check(obs)
    assert env.task == "gymnasium:Reacher-v5" and env.steps == 0
    env.step(np.zeros(2, np.float32))
    assert env.steps == 1
    env.close()
    with pytest.raises(ValueError, match="did you mean Pusher-v5"):
        make_env("gymnasium:Pushr-v5")
    with pytest.raises(ValueError, match="no suite"):
        parse_env_id("gymnasiom:Pusher-v5")
    with pytest.raises(ValueError, match="unknown camera"):
        make_env("gymnasium:Pusher-v5", cameras=("nope",))


def test_import_path_env():
    env = make_env("tests.envs.test_mujoco_capsule:inverted_pendulum", cameras=())
    arena = Arena([env]).allocate()
    env.reset(seed=1)
    capsule = snapshot(arena)
    first = env.step(np.array([0.5], np.float32))[0]["state"]
    restore(arena, capsule)
    assert np.array_equal(env.step(np.array([0.5], np.float32))[0]["state"], first)


def inverted_pendulum() -> gym.Env:
    return gym.make("InvertedPendulum-v5", disable_env_checker=True)


class _Counting(gym.Wrapper):
    def __init__(self, env):
        super().__init__(env)
        self.calls = 0


def test_unknown_stateful_wrapper_refused_by_the_declared_capture_held_by_the_graph_capture():
    env = _Counting(gym.make("Reacher-v5", disable_env_checker=True))
    with pytest.raises(MujocoCapsuleError, match=r"_Counting keeps state .*calls"):
        MujocoCapsuleEnv(env, CaptureSpec(task="x", graph=False))
    with pytest.raises(MujocoCapsuleError, match="PassiveEnvChecker keeps state"):
        MujocoCapsuleEnv(gym.make("Reacher-v5"), CaptureSpec(task="x", graph=False))
    ok = MujocoCapsuleEnv(
        _Counting(gym.make("Reacher-v5", disable_env_checker=True)),
        CaptureSpec(task="x", wrapper_state={"_Counting": ("calls",)}, graph=False),
    )
    assert any(name == "calls" for _, name, _ in ok._wrapper_attrs)
    # with nothing declared, the wrapper's counter is part of the object graph
    graph = MujocoCapsuleEnv(_Counting(gym.make("Reacher-v5")), CaptureSpec(task="x"))
    arena = Arena([graph]).allocate()
    graph.reset(seed=0)
    graph.env.calls = 7
    capsule = snapshot(arena)
    graph.env.calls = 0
    graph.step(np.zeros(2, np.float32))
    restore(arena, capsule)
    assert graph.env.calls == 7 and graph.env.env._elapsed_steps == 0  # TimeLimit, as at the snapshot


def test_declared_attributes_and_live_views():
    env = gym.make("Reacher-v5", disable_env_checker=True)
    u = env.unwrapped
    u.goal_note, u.visited = np.zeros(2), ["a"]
    capture = CaptureSpec(
        task="t", attributes=(Attr("goal_note", "array", (2,)), Attr("visited", "list", universe=("a", "b"))),
        graph=False,
    )
    adapter = MujocoCapsuleEnv(env, capture)
    arena = Arena([adapter]).allocate()
    adapter.reset(seed=0)
    u.goal_note, u.visited = np.array([1.0, 2.0]), ["b", "a"]
    capsule = snapshot(arena)
    u.goal_note, u.visited = None, []
    restore(arena, capsule)
    assert np.array_equal(u.goal_note, [1.0, 2.0]) and u.visited == ["b", "a"]
    u.goal_note = u.data.qpos[:2]  # a live view into MjData is refused as a declared value
    with pytest.raises(MujocoCapsuleError, match="live view"):
        snapshot(arena)


def test_scan_finds_state_and_live_views():
    def make():
        env = gym.make("Reacher-v5", disable_env_checker=True)
        original = env.unwrapped.step

        def step(action):
            env.unwrapped.counter = getattr(env.unwrapped, "counter", 0) + 1
            return original(action)

        env.unwrapped.step = step
        env.unwrapped.tip = env.unwrapped.data.xpos[3]  # a live view
        return env

    report = scan_env(make, steps=5)
    text = "\n".join(report.lines())
    assert "Attr('counter', 'int')" in text
    assert any(v.startswith("tip (MjData.xpos") for v in report.live_views)
    assert "TimeLimit._elapsed_steps" in text and report.seed_honoured and report.reset_deterministic
    assert ".env.env.goal" in report.graph_paths and ".env.env.counter" in report.graph_paths


def test_scan_judges_the_seed_on_the_whole_state():
    """A seed that places an object the observation does not show is honoured (gym-aloha's box), not ignored."""
    from tests.envs.broken_envs import make_seed_out_of_sight

    report = scan_env(make_seed_out_of_sight, steps=3)
    assert report.seed_honoured and report.seed_shows_in == "MjData"
    assert "IGNORES" not in "\n".join(report.lines())


def test_seeded_resets_do_not_pile_up_generators():
    """gymnasium makes a new generator at every seeded reset; the adapter keeps the last one per slot."""
    env = make_env("gymnasium:Hopper-v5", cameras=())
    arena = Arena([env]).allocate()
    env.reset(seed=0)
    initial = snapshot(arena)
    for seed in range(1, 50):
        env.reset(seed=seed)
        restore(arena, initial)
        snapshot(arena)
    assert len(env._rng_ptrs) <= len(env._rng_rows)  # nothing holds the 49 replaced generators alive
    env.close()


def test_an_observation_that_breaks_its_own_space_is_named():
    env = make_env("tests.envs.broken_envs:make_image_of_its_own_size", cameras=())
    with pytest.raises(MujocoCapsuleError, match=r"6,912 values \(pixels \(48, 48, 3\)\) where its observation_space "
                                                 r"says 3,072"):
        env.reset(seed=0)


def test_graph_capture_follows_an_env_that_rebuilds_its_simulation():
    """A new MjModel / MjData at every reset (as robosuite compiles one), with a size drawn into the model:
    restores land in whatever simulation the env holds now, the model's values included."""

    env = make_env("tests.envs.broken_envs:make_rebuilds_model", cameras=())
    arena = Arena([env]).allocate()
    env.reset(seed=1)
    size = env.model.geom_size[1].copy()
    capsule = snapshot(arena)
    first = [env.step(np.array([0.3, -0.2], np.float32))[0]["observation"] for _ in range(3)]
    env.reset(seed=2)
    assert not np.array_equal(env.model.geom_size[1], size)
    restore(arena, capsule)
    assert np.array_equal(env.model.geom_size[1], size) and env.data is env.env.unwrapped.sim_data
    again = [env.step(np.array([0.3, -0.2], np.float32))[0]["observation"] for _ in range(3)]
    assert all(np.array_equal(a, b) for a, b in zip(first, again))


def test_graph_capture_leaves_excluded_attributes_alone():
    from tests.envs.broken_envs import make_counter

    env = MujocoCapsuleEnv(make_counter(), CaptureSpec(task="counter", exclude=("count",)))
    arena = Arena([env]).allocate()
    env.reset(seed=0)
    env.step(np.zeros(2, np.float32))
    capsule = snapshot(arena)
    for _ in range(3):
        env.step(np.zeros(2, np.float32))
    restore(arena, capsule)
    assert env.env.unwrapped.count == 4  # excluded: as the env had it, not as the capsule saw it (1)
    assert env.steps == 1  # everything else came back


@pytest.mark.parametrize("env_id", ["gymnasium:Ant-v5", "tests.envs.broken_envs:make_rebuilds_model"])
def test_a_restore_copies_mjdata_and_the_model_straight_from_the_capsule(env_id, monkeypatch):
    """MjData's image (and with graph capture the model's runs) go from the capsule into MjData and MjModel, not
    through the arena, from `DIRECT_BYTES` of MjData on (these envs' are smaller: set to 0 here): whatever the
    arena's copies hold, the restored simulation is the capsule's, byte for byte, and a capsule taken next holds it
    again."""
    from capsule_rollout.envs import mujoco_capsule

    assert make_env(env_id, cameras=()).direct_buffers == ()  # smaller than DIRECT_BYTES: through the arena
    monkeypatch.setattr(mujoco_capsule, "DIRECT_BYTES", 0)
    env = make_env(env_id, cameras=())
    arena = Arena([env]).allocate()
    assert set(env.direct_buffers) == ({"mjdata", "model"} if env._graph is not None else {"mjdata"})
    env.reset(seed=1)
    space = env.action_space
    space.seed(0)
    env.step(space.sample())
    capsule = snapshot(arena, step=1, force=True)
    for _ in range(3):
        env.step(space.sample())
    for name in env.direct_buffers:  # garbage in the arena's copies: a restore must not read them
        arena.numpy(f"env/{name}")[...] = 0xAB
    restore(arena, capsule)
    assert np.array_equal(memory_view(env._buffer_ptr, env._buffer_bytes), capsule.buffer("env/mjdata").numpy())
    assert np.all(arena.numpy("env/mjdata") == 0xAB)  # left as it was: the copy went straight into MjData
    again = snapshot(arena, step=1, force=True)
    for key, tensor in capsule.tensors().items():
        assert np.array_equal(again.buffer(key).numpy(), tensor.numpy()), key
    env.close()
