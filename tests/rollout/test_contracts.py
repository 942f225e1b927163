"""What a user brings (`capsule_rollout.contracts`): a policy or critic missing a member, or giving one of the wrong
kind, is named in one line by the preflight, before any actor starts; the project's own examples meet the
contracts."""

from __future__ import annotations

import pytest

from capsule_rollout.contracts import BatchPolicy, Critic, Policy, StatefulPolicy, check_critic, check_policy
from capsule_rollout.rollout.host_factory import RunSpec
from capsule_rollout.rollout.preflight_checks import PreflightError, preflight
from tests.rollout.lab_parts import BROKEN_CRITICS, BROKEN_POLICIES

LAB = "tests.rollout.lab_parts"
ENV = "examples.own_env_and_policy:make_env"
POLICY = "examples.own_env_and_policy:make_policy"


@pytest.mark.parametrize("cls", list(BROKEN_POLICIES), ids=lambda c: c.__name__)
def test_a_policy_member_missing_or_wrong_is_one_line_before_any_actor_starts(cls):
    source = f'{LAB}:make_broken_policy={{"name": "{cls.__name__}"}}'
    with pytest.raises(PreflightError) as caught:
        preflight(RunSpec(env=ENV, policy=source), seed=1)
    message = caught.value.message
    assert message.startswith(BROKEN_POLICIES[cls]), message
    assert "\n" not in message


@pytest.mark.parametrize("cls", list(BROKEN_CRITICS), ids=lambda c: c.__name__)
def test_a_critic_member_missing_or_wrong_is_one_line_before_any_actor_starts(cls):
    source = f'{LAB}:make_broken_critic={{"name": "{cls.__name__}"}}'
    with pytest.raises(PreflightError) as caught:
        preflight(RunSpec(env=ENV, policy=POLICY, critic=source), seed=1)
    assert caught.value.message.startswith(BROKEN_CRITICS[cls]), caught.value.message


def test_the_examples_meet_the_contracts():
    from examples.own_env_and_policy import GoalDistance, PushTowardGoal, make_env
    from examples.stateful_policy import make_policy as make_stateful

    check_policy(PushTowardGoal())
    check_critic(GoalDistance())
    check_policy(make_stateful())
    assert isinstance(PushTowardGoal(), Policy) and isinstance(GoalDistance(), Critic)
    env = make_env()
    from capsule_rollout.contracts import Env

    assert isinstance(env, Env)
    env.close()


def test_the_protocols_name_the_optional_parts():
    class Batches:
        def infer(self, obs, *, noise=None):
            return obs

        def infer_batch(self, obs, *, noise=None):
            return obs

    class Keeps(Batches):
        def get_state(self):
            return {}

        def set_state(self, state):
            pass

    assert isinstance(Batches(), BatchPolicy) and not isinstance(Batches(), StatefulPolicy)
    assert isinstance(Keeps(), StatefulPolicy)
    check_policy(Keeps())
