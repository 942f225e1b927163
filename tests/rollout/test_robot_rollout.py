"""RolloutHost over a RobotClient talking to a SimRobotServer on loopback."""

import time

import numpy as np
import pytest

from capsule_rollout.envs.robot_bridge import RobotClient
from capsule_rollout.envs.robot_env import RobotEnv
from capsule_rollout.robot_side.operator_input import Kind, OperatorEvent, ScriptedOperator
from capsule_rollout.rollout.rollout_host import HostConfig, RolloutHost
from capsule_rollout.tabletop.critic_runtime import CriticRuntime
from capsule_rollout.tabletop.policy_runtime import PolicyRuntime
from capsule_rollout.tabletop.sim_robot import SimRobotServer
from tests.policies.tiny import tiny_critic, tiny_policy


@pytest.fixture
def robot():
    # 0.5 s: the watchdog checks every 50 ms on its own timer (it used to run only at 0.15 s polls of an idle
    # connection), and a loaded machine leaves up to ~0.4 s between a heartbeat-less client's requests.
    # 60 s of silence allowed: making the host (tracing two models) can take seconds on a loaded machine before
    # the first request, and dropping idle clients is not what these tests are about (test_robot_bridge is)
    with SimRobotServer(image_size=16, heartbeat_timeout_s=0.5, idle_timeout_s=60.0) as server:
        client = RobotClient(*server.address, heartbeat_s=None)
        yield server, client
        client.close()


def _host(client, **kw):
    env = RobotEnv(client, max_steps=12)
    return RolloutHost(env=env, policy=PolicyRuntime(tiny_policy()), critic=CriticRuntime(tiny_critic()),
                       config=HostConfig(n_exec=2), **kw)


def test_episodes_over_the_bridge_with_takeover_from_the_robot_side(robot):
    server, client = robot
    host = _host(client, teleop=client.teleop_action,
                 operator=ScriptedOperator({3: OperatorEvent(Kind.TAKEOVER_ON), 6: OperatorEvent(Kind.TAKEOVER_OFF),
                                            9: OperatorEvent(Kind.END_SUCCESS)}))
    r = host.run_episode(5)
    assert r.reset_kind == "physical" and host.task == "pick_place"
    assert (r.meta.stop_reason, r.meta.success, r.meta.length) == ("operator_end", True, 10)
    assert r.episode.steps["intervention"].tolist() == [False] * 3 + [True] * 3 + [False] * 4
    assert r.episode.steps["image_front"].shape == (10, 16, 16, 3) and r.meta.subtask_texts[0].startswith("pick")
    assert server.backend.env.steps == 10  # every recorded step happened on the robot
    host.operator.reset()
    again = host.run_episode(5)  # the robot is homed again; the same seed gives the same first observation
    assert np.array_equal(again.episode.steps["image_front"][0], r.episode.steps["image_front"][0])


def test_heartbeat_loss_aborts_the_episode_and_keeps_its_steps(robot):
    server, client = robot
    host = _host(client)

    def stall(obs, action):
        if host.env.steps == 3:
            time.sleep(0.8)  # the rollout side hangs longer than the robot's heartbeat timeout

    host.safety_check = stall
    r = host.run_episode(0)
    assert r.meta.stop_reason == "aborted" and "heartbeat_timeout" in r.error
    assert r.meta.length == 3 and server.episode_state == "aborted" and server.backend.held
