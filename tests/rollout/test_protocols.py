"""The rollout protocols: a host drives a user's 7-DoF env and policy, with and without a critic."""

import numpy as np
import pytest
import torch

from capsule_rollout.capsules import BufferComponent, BufferSpec, Role
from capsule_rollout.critics.rollout_critic import CriticSpec, RolloutCritic
from capsule_rollout.envs.rollout_env import ObservationSpec, RolloutEnv
from capsule_rollout.policies.rollout_policy import RolloutPolicy
from capsule_rollout.rollout.host_factory import RunSpec
from capsule_rollout.rollout.ray_rollout import run_rollouts
from capsule_rollout.rollout.rollout_actor import WorkItem
from capsule_rollout.rollout.rollout_host import HostConfig, RolloutHost
from capsule_rollout.tabletop.policy_runtime import PolicyRuntime
from capsule_rollout.tabletop.tabletop_env import TabletopEnv
from tests.policies.tiny import tiny_policy
from tests.rollout.protocol_fakes import DOF, GreedyPolicy, ReachEnv


class DistanceCritic(BufferComponent):
    """Value = -max joint error: a critic of the user's own (state in, value out)."""

    name = "critic"

    def __init__(self) -> None:
        super().__init__()
        self.spec = CriticSpec(observation_keys=("state",))

    def buffer_specs(self):
        return [BufferSpec("obs", (2 * DOF,), torch.float32, role=Role.IO),
                BufferSpec("value", (1,), torch.float32, role=Role.IO)]

    def load_observation(self, obs, step: int) -> None:
        self.buffers["obs"].copy_(torch.as_tensor(obs["state"]))

    def evaluate(self) -> torch.Tensor:
        o = self.buffers["obs"]
        self.buffers["value"].fill_(float(-(o[:DOF] - o[DOF:]).abs().max()))
        return self.buffers["value"]


def test_the_fakes_and_the_project_parts_implement_the_protocols():
    assert isinstance(ReachEnv(), RolloutEnv) and isinstance(TabletopEnv(cameras=()), RolloutEnv)
    assert isinstance(GreedyPolicy(), RolloutPolicy) and isinstance(PolicyRuntime(tiny_policy()), RolloutPolicy)
    assert isinstance(DistanceCritic(), RolloutCritic)


def test_a_host_drives_a_7_dof_env_without_a_critic():
    host = RolloutHost(env=ReachEnv(), policy=GreedyPolicy(), critic=None, config=HostConfig(n_exec=3))
    assert host.state.buffers["queue"].shape == (5, DOF)  # sized from the policy's spec, not the tabletop's 4
    result = host.run_episode(4)
    steps = result.episode.steps
    assert result.meta.success and result.meta.stop_reason == "success" and result.meta.task == "reach7"
    assert steps["action"].shape == (result.meta.length, DOF) and np.isnan(steps["value"]).all()
    # every executed action is the proposal clipped to the env's own (asymmetric) bounds
    assert np.array_equal(steps["action"], np.clip(steps["policy_action"], -0.5, 1.0))
    assert (steps["policy_action"] > 1.0).any()  # the clip really happened
    # no subtasks: the instruction is the language, published once
    assert host.channel.read().text == "reach the target" and result.meta.subtasks == ""
    # a restore of the initial capsule replays the episode bit for bit
    again = host.run_episode(4)
    assert again.reset_kind == "restore" and np.array_equal(again.episode.steps["action"], steps["action"])
    host.close()


def test_a_critic_of_ones_own_runs_on_the_critic_lane_and_can_stop_the_episode():
    host = RolloutHost(env=ReachEnv(max_steps=20), policy=GreedyPolicy(gain=-1.0), critic=DistanceCritic(),
                       config=HostConfig(n_exec=2, value_threshold=-0.4, value_patience=2))
    result = host.run_episode(1)  # the policy walks away from the target: the value drops
    values = result.episode.steps["value"]
    assert np.isfinite(values[::2]).all() and np.isnan(values[1::2]).all()
    assert result.meta.stop_reason == "low_value" and result.meta.length < 20
    host.close()


def test_the_same_seed_gives_the_same_actions_with_or_without_a_critic_and_in_any_order():
    def actions(critic, seeds):
        host = RolloutHost(env=ReachEnv(), policy=GreedyPolicy(), critic=critic, config=HostConfig(n_exec=3))
        out = {seed: host.run_episode(seed).episode.steps["action"] for seed in seeds}
        host.close()
        return out

    a = actions(None, [1, 2, 3])
    b = actions(DistanceCritic(), [3, 9, 2, 1])
    assert all(np.array_equal(a[s], b[s]) for s in (1, 2, 3))


def test_bad_combinations_are_refused_with_what_to_fix():
    with pytest.raises(ValueError, match="value_threshold needs a critic"):
        RolloutHost(env=ReachEnv(), policy=GreedyPolicy(), config=HostConfig(n_exec=2, value_threshold=-0.5))
    with pytest.raises(ValueError, match="acts with 4 numbers, the env's action space has 7"):
        RolloutHost(env=ReachEnv(), policy=PolicyRuntime(tiny_policy()), config=HostConfig(n_exec=2))
    with pytest.raises(ValueError, match="exceeds the policy's chunk length"):
        RolloutHost(env=ReachEnv(), policy=GreedyPolicy(chunk_length=2), config=HostConfig(n_exec=3))
    with pytest.raises(ValueError, match="'state' must be a 1-d float array"):
        ObservationSpec({})


def test_a_reset_that_raises_fails_that_episode_not_the_run():
    env = ReachEnv()
    original = env.reset

    def reset(*, seed=None):
        if seed == 2:
            raise RuntimeError("the gripper did not home")
        return original(seed=seed)

    env.reset = reset
    host = RolloutHost(env=env, policy=GreedyPolicy(), config=HostConfig(n_exec=3))
    reports, stats = run_rollouts(RunSpec(), [WorkItem(f"e{s}", s) for s in (1, 2, 3)], actors=0, host=host)
    assert [r.item.seed for r in reports] == [1, 2, 3]
    assert reports[1].episode is None and "the gripper did not home" in reports[1].error
    assert stats.failed_before_first_step == 1 and stats.episodes == 2
    assert reports[2].episode.meta.success  # the host is usable after the failed reset
    host.close()
