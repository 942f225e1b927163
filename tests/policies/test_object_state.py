"""State a policy object keeps across calls (`policies.object_state`): captured with nothing declared (its object
graph, weights by reference) or through get_state / set_state, so a restore in the middle of its action queue, a
fork into another slot and a capsule read back from a file all play on bit for bit."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest
import torch

from capsule_rollout.capsules import load_capsule, save_capsule
from capsule_rollout.envs.suites import make_env
from capsule_rollout.rollout.branching import BoundaryCapsules
from capsule_rollout.rollout.host_factory import RunSpec, build_slots
from capsule_rollout.rollout.rollout_host import HostConfig, RolloutHost
from capsule_rollout.rollout.slots.host import LoopRows, episode_job
from capsule_rollout.rollout.sources import as_rollout_policy
from examples.stateful_policy import HistoryAndQueue

ENV = "examples.own_env_and_policy:make_env"
MID_QUEUE = 4  # the first chunk of a plan handed out, the second still queued


class Forgetful(HistoryAndQueue):
    stateless = True  # says so wrongly: nothing is captured


class WithHooks(HistoryAndQueue):
    """The same state, kept through its own hooks."""

    def get_state(self):
        return {"history": [h.copy() for h in self.history], "queue": [a.copy() for a in self.queue]}

    def set_state(self, state):
        self.history = deque(state["history"], maxlen=2)
        self.queue = deque(state["queue"])


class WithWeights(HistoryAndQueue):
    """A torch module (its weights by reference) and a 1 MB read-only table beside the state."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(512, 512)
        self.table = np.ones(1 << 17)
        self.table.flags.writeable = False


class Hoarder(HistoryAndQueue):
    capsule_bytes = 1 << 16

    def infer(self, obs, *, noise):
        self.scratch = np.zeros(1 << 14)  # 128 KB, rewritten every call: state by value
        return super().infer(obs, noise=noise)


def _host(obj) -> RolloutHost:
    env = make_env(ENV, cameras=())
    return RolloutHost(env=env, policy=as_rollout_policy(obj, env), config=HostConfig(n_exec=4))


def _mid_queue(host: RolloutHost, seed: int):
    keeper = BoundaryCapsules((MID_QUEUE,))
    host.observers.append(keeper)
    try:
        episode = host.run_episode(seed).episode
    finally:
        host.observers.remove(keeper)
    return keeper.capsules[MID_QUEUE], episode


@pytest.mark.parametrize("policy", [HistoryAndQueue, WithHooks, WithWeights])
def test_a_restore_in_the_middle_of_the_queue_plays_on_as_the_episode_did(policy):
    host = _host(policy())
    capsule, episode = _mid_queue(host, 7)
    assert episode.meta.length > MID_QUEUE + 4
    again = host.branch(capsule, seed=7)  # the episode's own noise from the boundary on: an exact replay
    assert np.array_equal(again.episode.steps["action"], episode.steps["action"][MID_QUEUE:])
    host.close()


def test_without_the_capture_the_same_restore_diverges():
    host = _host(Forgetful())
    capsule, episode = _mid_queue(host, 7)
    again = host.branch(capsule, seed=7)
    assert not np.array_equal(again.episode.steps["action"], episode.steps["action"][MID_QUEUE:])
    host.close()


def test_weights_are_taken_by_reference_and_a_file_restores_into_a_new_instance(tmp_path):
    first = _host(WithWeights())
    capsule, episode = _mid_queue(first, 3)
    used = int(capsule.buffer("policy/state_len")[0])
    assert used < 64 * 1024  # the 1 MB table and the 1 MB of weights are not in it
    path = save_capsule(capsule, tmp_path / "mid.capsule", key="k" * 16)
    first.close()
    second = _host(WithWeights())  # another instance, as another process builds it
    again = second.branch(load_capsule(path, key="k" * 16), seed=3)
    assert np.array_equal(again.episode.steps["action"], episode.steps["action"][MID_QUEUE:])
    second.close()


def test_state_past_its_buffer_is_refused_naming_the_array_and_the_fix():
    host = _host(Hoarder())
    host.observers.append(BoundaryCapsules((MID_QUEUE,)))  # a snapshot once the scratch array is there
    result = host.run_episode(1)
    assert "Hoarder's state is" in result.error and ".scratch 131,072 B" in result.error
    assert "capsule_bytes" in result.error and "read-only" in result.error
    host.close()


def test_in_four_slots_a_fork_into_another_slot_plays_on_bit_for_bit():
    slots = build_slots(RunSpec(env=ENV, policy="examples.stateful_policy:make_policy", slots=4,
                                 host=HostConfig(n_exec=4)))
    try:
        assert isinstance(slots.policy_rows, LoopRows)  # it keeps state and does not batch: one per slot
        keeper = BoundaryCapsules((MID_QUEUE,))
        slots.hosts[1].observers.append(keeper)
        played = {r.slot: r.value for r in slots.run_items([episode_job(s) for s in range(4)])}
        episode = played[1].episode
        for other in (3, 1):
            again = slots.hosts[other].branch(keeper.capsules[MID_QUEUE], seed=episode.meta.seed)
            assert np.array_equal(again.episode.steps["action"], episode.steps["action"][MID_QUEUE:]), other
    finally:
        slots.close()
