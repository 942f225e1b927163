"""RolloutHost: transitions, every stop reason, reset by restore == cold reset, hand-off, recording."""

import numpy as np
import pytest
import torch

from capsule_rollout.rollout.rollout_host import HostConfig, Phase, RolloutHost, SafetyStop, capsule_key
from capsule_rollout.stores.npz_recorder import NpzRecorder, read_npz_episode
from capsule_rollout.tabletop.critic_runtime import CriticRuntime
from capsule_rollout.tabletop.policy_runtime import PolicyRuntime
from capsule_rollout.tabletop.scripted_expert import ScriptedExpert
from capsule_rollout.tabletop.tabletop_env import TabletopEnv
from tests.policies.tiny import tiny_critic, tiny_policy

CYCLE = ["reset->running", "running->stop_infer", "stop_infer->record"]


def make_host(**config) -> RolloutHost:
    env = TabletopEnv("pick_place", cameras=("front",), image_size=16)
    host = RolloutHost(env=env, policy=PolicyRuntime(tiny_policy()), critic=CriticRuntime(tiny_critic()),
                       config=HostConfig(**{"n_exec": 2, **config}))
    return host


@pytest.fixture
def host():
    h = make_host(max_steps=6)
    yield h
    h.close()


def drive_with_expert(host: RolloutHost) -> None:
    """Replace the policy lane by the scripted expert (every chunk = the expert's next action)."""
    expert = ScriptedExpert(host.env)
    chunk = host.policy.buffers["chunk"]

    def act():
        chunk.copy_(torch.from_numpy(expert.act()).expand_as(chunk))

    host.policy.runner = act


def test_timeout_and_the_transition_cycle(host):
    first = host.run_episode(3)
    assert first.meta.stop_reason == "timeout" and first.meta.length == 6 and not first.meta.success
    assert first.transitions == ["idle->reset", *CYCLE] and host.phase is Phase.RECORD
    second = host.run_episode(4)
    assert second.transitions == ["record->reset", *CYCLE]
    steps = first.episode.steps
    assert steps["image_front"].shape == (6, 16, 16, 3)
    # a value is recorded where the critic ran (every n_exec = 2 steps), NaN between
    assert np.isfinite(steps["value"][::2]).all() and np.isnan(steps["value"][1::2]).all()
    assert np.array_equal(steps["action"], np.clip(steps["policy_action"], -1, 1))


def test_success_with_an_expert_in_the_policy_lane():
    h = make_host(n_exec=1)
    drive_with_expert(h)
    result = h.run_episode(0)
    assert result.meta.stop_reason == "success" and result.meta.success
    # the planner handed over the second subtask during the episode
    assert set(result.episode.steps["subtask_id"]) == {0, 1}
    assert h.channel.read().index == 1 and h.channel.read().source == "planner"
    h.close()


def test_operator_end_low_value_safety_and_error_are_recorded():
    h = make_host(max_steps=30)

    def end_at_3(obs, action):
        if h.env.steps == 3:
            h.request_end(success=True)

    h.safety_check = end_at_3
    r = h.run_episode(0)
    assert (r.meta.stop_reason, r.meta.success, r.meta.length) == ("operator_end", True, 4)

    def unsafe_at_2(obs, action):
        if h.env.steps == 2:
            raise SafetyStop("workspace limit")

    h.safety_check = unsafe_at_2
    r = h.run_episode(0)
    assert (r.meta.stop_reason, r.error, r.meta.length) == ("safety", "workspace limit", 2)

    def broken(obs, action):
        if h.env.steps == 1:
            raise RuntimeError("camera unplugged")

    h.safety_check = broken
    r = h.run_episode(0)
    assert r.meta.stop_reason == "error" and "camera unplugged" in r.error and r.meta.length == 1
    h.safety_check = None
    assert h.run_episode(0).meta.stop_reason == "timeout"  # the host is still usable
    h.close()

    low = make_host(max_steps=30, value_threshold=0.5, value_patience=2)  # values are <= 0: always low
    r = low.run_episode(0)
    assert r.meta.stop_reason == "low_value" and r.meta.length == 2  # chunk 1 ran, chunk 2 made the count
    low.close()


def test_non_finite_policy_output_is_a_safety_stop():
    h = make_host(max_steps=30)
    chunk = h.policy.buffers["chunk"]
    calls = []

    def act():
        calls.append(1)
        chunk.fill_(float("nan") if len(calls) == 2 else 0.0)

    h.policy.runner = act
    r = h.run_episode(0)
    assert r.meta.stop_reason == "safety" and "non-finite" in r.error and r.meta.length == 2
    h.close()


def test_reset_by_restore_equals_a_cold_reset_bit_for_bit():
    a = make_host(max_steps=12)
    cold = a.run_episode(5)
    a.run_episode(6)  # something else in between
    again = a.run_episode(5)
    assert (cold.reset_kind, again.reset_kind) == ("cold", "restore")
    b = make_host(max_steps=12)
    fresh = b.run_episode(5)  # a new host, cold
    for other in (again, fresh):
        for key in ("image_front", "state", "action", "policy_action", "value", "reward", "subtask_id"):
            assert np.array_equal(cold.episode.steps[key], other.episode.steps[key], equal_nan=True), key
    assert cold.meta.initial_capsule_id == again.meta.initial_capsule_id != fresh.meta.initial_capsule_id
    a.close()
    b.close()


def test_coaching_overwrites_the_subtask_and_asks_for_a_new_chunk():
    h = make_host(max_steps=8, n_exec=4)
    coach_text = "no, take the blue block"

    def coach_at_1(obs, action):
        if h.env.steps == 1:
            h.channel.coach(coach_text)

    h.safety_check = coach_at_1
    r = h.run_episode(0)
    with torch.no_grad():  # as the runtime encodes it (`models.inputs.write_language`)
        expected = h.policy.model.embed_language(torch.from_numpy(h.policy.model.tokenizer.encode(coach_text))[None])
    assert torch.equal(h.policy.buffers["lang"], expected)
    # chunks at steps 0, 2 (the coach's text arrived after step 1) and 6
    assert np.flatnonzero(np.isfinite(r.episode.steps["value"])).tolist() == [0, 2, 6]
    h.close()


def test_pinned_seeds_and_recording(tmp_path):
    h = make_host(max_steps=3, pin_seeds=(7,))
    h.recorder = NpzRecorder(tmp_path)
    h.run_episode(7)
    h.run_episode(8, episode_id="custom-id")
    assert h.store.is_pinned(capsule_key("pick_place", 7)) and not h.store.is_pinned(capsule_key("pick_place", 8))
    ep = read_npz_episode(tmp_path / "custom-id.npz")
    assert ep.meta.seed == 8 and ep.meta.length == 3 and ep.meta.stop_reason == "timeout"
    h.close()


def test_bad_configuration_is_refused():
    with pytest.raises(ValueError, match="n_exec"):
        make_host(n_exec=99)
    env = TabletopEnv("pick_place", cameras=(), image_size=16)
    with pytest.raises(ValueError, match=r"the policy reads observation key\(s\) \['image_front'\]"):
        RolloutHost(env=env, policy=PolicyRuntime(tiny_policy()), critic=CriticRuntime(tiny_critic()),
                    config=HostConfig(n_exec=2))
    with pytest.raises(ValueError, match=">= 1"):
        HostConfig(value_patience=0)


def test_operator_takeover_is_recorded_as_intervention_and_the_policy_replans():
    from capsule_rollout.robot_side.operator_input import Kind, OperatorEvent, ScriptedOperator

    h = make_host(max_steps=10, n_exec=4)
    expert = ScriptedExpert(h.env)
    h.teleop = expert.act
    h.operator = ScriptedOperator({2: OperatorEvent(Kind.TAKEOVER_ON), 5: OperatorEvent(Kind.TAKEOVER_OFF)})
    r = h.run_episode(0)
    steps = r.episode.steps
    assert steps["intervention"].tolist() == [False, False, True, True, True] + [False] * 5
    assert np.isnan(steps["policy_action"][2:5]).all() and np.isfinite(steps["policy_action"][5:]).all()
    # chunks at steps 0 and 5 (right after the takeover) and 9
    assert np.flatnonzero(np.isfinite(steps["value"])).tolist() == [0, 5, 9]
    assert h.events == ["2:takeover_on", "5:takeover_off"]
    assert r.meta.operator_events == "2:takeover_on\n5:takeover_off"  # recorded with the episode
    h.close()


def test_operator_end_coach_and_estop():
    from capsule_rollout.robot_side.operator_input import Kind, OperatorEvent, ScriptedOperator

    h = make_host(max_steps=30)
    h.operator = ScriptedOperator({1: OperatorEvent(Kind.COACH, "push the green block"),
                                   3: OperatorEvent(Kind.END_FAILURE)})
    r = h.run_episode(0)
    assert (r.meta.stop_reason, r.meta.success, r.meta.length) == ("operator_end", False, 4)
    assert h.channel.read().text == "push the green block"
    # the coached text is recorded with the episode (the steps' subtask_id cannot say it)
    assert r.meta.operator_events == "1:coach:push the green block\n3:end_failure"
    h.operator = ScriptedOperator({2: [OperatorEvent(Kind.TAKEOVER_ON), OperatorEvent(Kind.ESTOP)]})
    r = h.run_episode(1)
    assert (r.meta.stop_reason, r.error, r.meta.length) == ("safety", "operator e-stop", 2)
    assert "2:takeover ignored (no teleop source)" in h.events
    h.close()


def test_value_triggered_takeover_hands_control_to_the_expert_and_back():
    from capsule_rollout.rollout.value_takeover import ValueTakeover

    h = make_host(max_steps=20, n_exec=2)
    h.teleop = ScriptedExpert(h.env).act
    h.operator = ValueTakeover(threshold=0.5, steps=4, max_per_episode=1).bind(h)  # tiny critic: always below
    r = h.run_episode(0)
    flags = r.episode.steps["intervention"].tolist()
    assert flags == [False] + [True] * 4 + [False] * (len(flags) - 5)
    second = h.run_episode(1)  # the count starts again with the next episode
    assert second.episode.steps["intervention"].sum() == 4
    h.close()


def _branch_replays_the_rest(h, keeper, boundary: int, recorded) -> None:
    """A branch from the capsule at `boundary` with the episode's own noise plays the recorded episode's steps
    from there on: the same actions, the same takeovers (so the same operator events)."""
    branch = h.branch(keeper.capsules[boundary], seed=0).episode
    for key in ("action", "intervention", "value"):
        np.testing.assert_array_equal(branch.steps[key], recorded.steps[key][boundary:], err_msg=key)
    later = [e for e in recorded.meta.operator_events.split("\n") if int(e.split(":")[0]) > boundary]
    assert branch.meta.operator_events.split("\n") == later if later else branch.meta.operator_events == ""
    assert (branch.meta.success, branch.meta.stop_reason) == (recorded.meta.success, recorded.meta.stop_reason)


def test_a_branch_after_a_value_takeover_meets_the_operator_as_the_episode_did():
    """The simulated operator's counters are in the capsule: a branch from the chunk start right after the first
    takeover takes over again where the episode did, and one after the last takes over no more."""
    from capsule_rollout.rollout.branching import BoundaryCapsules
    from capsule_rollout.rollout.value_takeover import ValueTakeover

    keeper = BoundaryCapsules()
    h = make_host(max_steps=16, n_exec=2)
    h.observers.append(keeper)
    h.teleop = ScriptedExpert(h.env).act
    h.operator = ValueTakeover(threshold=0.5, steps=3, max_per_episode=2).bind(h)  # tiny critic: always below
    recorded = h.run_episode(0).episode
    keeper.enabled = False
    flags = recorded.steps["intervention"].tolist()
    assert flags[:9] == [False, True, True, True, False, True, True, True, False] and not any(flags[9:])
    assert recorded.meta.operator_events.split("\n") == ["1:takeover_on", "4:takeover_off", "5:takeover_on",
                                                          "8:takeover_off"]
    assert {4, 8} <= set(keeper.capsules)  # chunk starts right after each takeover
    for boundary in sorted(keeper.capsules):  # before, between and after the takeovers
        _branch_replays_the_rest(h, keeper, boundary, recorded)
    from capsule_rollout.capsules import restore

    for boundary, held in ((0, (-1, 0, 0)), (4, (-1, 1, 4)), (8, (-1, 2, 8))):  # no takeover under way, made, polled
        restore(h.arena, keeper.capsules[boundary])
        assert h.operator.capsule_state() == held
    h.close()


def test_a_branch_meets_a_scripted_operator_where_the_episode_left_it():
    from capsule_rollout.robot_side.operator_input import Kind, OperatorEvent, ScriptedOperator
    from capsule_rollout.rollout.branching import BoundaryCapsules

    keeper = BoundaryCapsules()
    h = make_host(max_steps=12, n_exec=2)
    h.observers.append(keeper)
    h.teleop = ScriptedExpert(h.env).act
    h.operator = ScriptedOperator({3: OperatorEvent(Kind.TAKEOVER_ON), 6: OperatorEvent(Kind.TAKEOVER_OFF)})
    recorded = h.run_episode(0).episode
    keeper.enabled = False
    assert recorded.steps["intervention"].tolist() == [False] * 3 + [True] * 3 + [False] * 6
    assert {0, 2, 6} <= set(keeper.capsules)
    for boundary in sorted(keeper.capsules):
        _branch_replays_the_rest(h, keeper, boundary, recorded)
    again = h.run_episode(0).episode  # a new episode plays the schedule again (its initial capsule: fresh)
    np.testing.assert_array_equal(again.steps["intervention"], recorded.steps["intervention"])
    h.close()


def test_operator_state_that_does_not_fit_or_match_is_refused():
    from capsule_rollout.robot_side.operator_input import ScriptedOperator
    from capsule_rollout.rollout.value_takeover import ValueTakeover

    h = make_host(max_steps=2)
    h.operator = ScriptedOperator({})
    h.run_episode(0)
    capsule = h.snapshot()  # holds the scripted operator's one integer
    h.operator = ValueTakeover(threshold=0.5).bind(h)
    from capsule_rollout.capsules import restore

    with pytest.raises(ValueError, match="taken with another operator"):
        restore(h.arena, capsule)

    class Chatty:
        def poll(self, step):
            return []

        def capsule_state(self):
            return tuple(range(9))

    h.operator = Chatty()
    with pytest.raises(ValueError, match="gave 9 integers; a capsule holds 8"):
        h.snapshot()
    h.close()


def test_a_capsule_of_the_earlier_host_layout_is_refused_by_name():
    """The host's counters are named buffers (layout 2 on), its operator's state in the capsule from layout 3; a
    capsule of an earlier layout is refused."""
    import dataclasses

    from capsule_rollout.capsules import Capsule, CapsuleMismatchError, restore

    h = make_host(max_steps=2)
    h.run_episode(1)
    capsule = h.snapshot()
    old = Capsule(dataclasses.replace(capsule.meta, fingerprint={**capsule.meta.fingerprint, "host/layout": "2"}),
                  capsule.slabs(), capsule.digests)
    with pytest.raises(CapsuleMismatchError, match="host/layout"):
        restore(h.arena, old)
    assert sorted(h.state.buffers) == ["chunks", "low_value_chunks", "operator", "operator_len", "operator_polled",
                                       "planner_subtask", "queue", "queue_len", "queue_pos", "subtask", "value"]
    h.close()
