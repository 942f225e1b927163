"""Env slots (`rollout.slots.host`): episodes side by side in one process, their policy and critic calls batched.

An episode is the same in any slot and whatever else shares the batch; a restore into one slot touches no other
slot; forks of one boundary into the slots give the values `branch_value` gives one at a time; slots out of
phase refill at once; one slot's error is that slot's episode alone."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
import torch

from capsule_rollout.capsules import Role
from capsule_rollout.rollout.branching import BoundaryCapsules, branch_episode, branch_value
from capsule_rollout.rollout.host_factory import RunSpec, build_host, build_slots
from capsule_rollout.rollout.rollout_host import HostConfig, RolloutHost
from capsule_rollout.rollout.slots.host import Feed, LoopRows, SlotHost, episode_job
from tests.policies.tiny import save_tiny_checkpoints
from tests.rollout.protocol_fakes import GreedyPolicy, ReachEnv
from tests.rollout.test_protocols import DistanceCritic


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    policy, critic = save_tiny_checkpoints(tmp_path_factory.mktemp("ckpt"))
    return RunSpec(env="tabletop:pick_place", policy=policy, critic=critic, slots=8,
                    host=HostConfig(n_exec=2, max_steps=14))


@pytest.fixture(scope="module")
def slots(spec):
    host = build_slots(spec)
    yield host
    host.close()


def same_episode(a, b, *, same_capsule: bool = True) -> None:
    """Every recorded step and the metadata equal (wall-clock timestamps aside; the initial capsule's id unless
    both played from the same capsule, not just equal ones made by two hosts)."""
    assert a.meta == (b.meta if same_capsule else dataclasses.replace(b.meta, initial_capsule_id=a.meta.initial_capsule_id))
    assert set(a.steps) == set(b.steps)
    for key in a.steps:
        if key != "timestamp":
            x, y = np.asarray(a.steps[key]), np.asarray(b.steps[key])
            assert x.dtype == y.dtype and x.shape == y.shape, key
            assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), key


def test_an_episode_in_slot_3_of_8_is_the_episode_played_alone(slots):
    seeds = list(range(10, 20))
    beside = slots.run_items([episode_job(s) for s in seeds])
    assert [r.error for r in beside] == [None] * len(seeds)
    in_slot = {r.slot for r in beside}
    assert in_slot == set(range(8))  # every slot played
    third = next(r for r in beside if r.slot == 3)
    alone = slots.run_items([episode_job(seeds[third.index])])[0]
    assert alone.slot == 0 and alone.value.reset_kind == "restore"
    same_episode(alone.value.episode, third.value.episode)
    # and in another order, so each lands in another slot beside other neighbours
    again = slots.run_items([episode_job(s) for s in reversed(seeds)])
    for result in again:
        first = beside[len(seeds) - 1 - result.index]
        assert result.slot != first.slot or len(seeds) % 2
        same_episode(result.value.episode, first.value.episode)
    images = [k for k in third.value.episode.steps if k.startswith("image_")]
    assert images  # the images were recorded, and compared


def test_a_slot_capsule_is_a_one_slot_capsule(spec, slots):
    """The initial capsule a slot makes is the one a host of one slot makes, byte for byte (state and fingerprint),
    and each restores into the other."""
    one = build_host(dataclasses.replace(spec, slots=1))
    try:
        one.run_episode(3)
        mine = one.initial_capsule
        slots.run_items([episode_job(3)])
        theirs = slots.store.get(mine.label)
        assert mine.meta.fingerprint == theirs.meta.fingerprint and mine.specs == theirs.specs
        for name, tensor in mine.tensors().items():
            assert tensor.numpy().tobytes() == theirs.tensors()[name].numpy().tobytes(), name
        one.store.remove(mine.label)
        one.store.put(mine.label, theirs)
        assert one.run_episode(3).reset_kind == "restore"
        slots.store.remove(mine.label)
        slots.store.put(mine.label, mine)
        assert slots.run_items([episode_job(3)])[0].value.reset_kind == "restore"
    finally:
        one.close()


def _state_bytes(host: RolloutHost) -> bytes:
    host.arena.before_snapshot()
    return b"".join(t.cpu().numpy().tobytes() for _, t in sorted(host.arena.buffers(Role.STATE).items()))


def test_a_restore_into_one_slot_leaves_every_other_slot_bit_identical(slots):
    seeds = list(range(30, 38))
    reference = {r.index: r.value.episode for r in slots.run_items([episode_job(s) for s in seeds])}
    capsule = slots.store.get(slots.store.keys()[0])
    rows = slots.policy_rows.runtime.buffers
    checked = []

    def restore_into_2(active) -> None:
        if slots.calls != 3:
            return
        others = [i for i in range(8) if i != 2]
        before = {i: _state_bytes(slots.hosts[i]) for i in others}
        row_before = {k: rows[k][others].clone() for k in ("rng", "lang", "advantage", "beta")}
        slots.fork_into(capsule, [2])
        assert {i: _state_bytes(slots.hosts[i]) for i in others} == before
        for k, v in row_before.items():
            assert torch.equal(rows[k][others], v), k
        checked.append(True)

    slots.calls, slots.on_call = 0, restore_into_2
    try:
        results = slots.run_items([episode_job(s) for s in seeds])
    finally:
        slots.on_call = None
    assert checked
    moved = next(r.index for r in results if r.slot == 2)
    for r in results:
        if r.index != moved:  # the other slots' episodes are as if nothing happened
            same_episode(r.value.episode, reference[r.index])


def test_forks_of_a_boundary_into_the_slots_give_the_values_one_at_a_time_gives(slots):
    _, values = branch_episode(slots, 41, steps=(2, 6), branches=3)
    # one at a time, in slot 0 of the same host (the others idle)
    keeper = BoundaryCapsules((2, 6))
    solo = slots.hosts[0]
    solo.observers.append(keeper)
    try:
        result = solo.run_episode(41)
    finally:
        solo.observers.remove(keeper)
    expect = (bool(result.episode.meta.success), result.episode.meta.length)
    one_by_one = [branch_value(solo, keeper.capsules[s], seed=41, step=s, branches=3, expect=expect)
                  for s in sorted(keeper.capsules)]
    assert values == one_by_one and len(values) == 2


def test_slots_out_of_phase_refill_at_once_and_every_call_is_full_while_work_is_left():
    slots = _reach_slots(8)
    seeds = list(range(50, 74))
    calls: list[list[int]] = []
    started: list[int] = []

    def job(seed):
        make = episode_job(seed)

        def start(host):
            started.append(len(calls))
            return make(host)
        return start

    slots.on_call = calls.append
    try:
        results = slots.run_items([job(s) for s in seeds])
    finally:
        slots.on_call = None
    lengths = {r.value.episode.meta.length for r in results}
    assert len(lengths) > 3  # episodes of several lengths: slots finish out of phase
    refills = started[8:]
    assert any(0 < k < len(calls) for k in refills)  # items began mid-run, joining calls under way
    for k in range(max(refills)):  # until the last item began, every slot asked in every call
        assert calls[k] == list(range(8)), k


class _Faulty(ReachEnv):
    """Raises at step 3 of seed 13; its reset raises for seed 14."""

    def reset(self, *, seed=None):
        if seed == 14:
            raise OSError("the reset of seed 14 failed")
        self._seed = seed
        return super().reset(seed=seed)

    def step(self, action):
        if self._seed == 13 and self.steps == 3:
            raise RuntimeError("the sim blew up")
        return super().step(action)


def _reach_slots(n: int, critic: bool = False) -> SlotHost:
    """`n` slots of the user's reaching env and greedy policy (and critic), each an instance of its own (`LoopRows`)."""
    rows = LoopRows([GreedyPolicy() for _ in range(n)])
    critics = LoopRows([DistanceCritic() for _ in range(n)]) if critic else None
    hosts = [RolloutHost(env=_Faulty(max_steps=40), policy=rows.slot(i), config=HostConfig(n_exec=3),
                         critic=critics.slot(i) if critic else None) for i in range(n)]
    return SlotHost(hosts, rows, critics)


def test_one_slots_error_is_that_episode_alone():
    """With a critic of the user's own, one instance per slot: the values are recorded as one slot alone records them."""
    seeds = list(range(8, 20))
    results = _reach_slots(4, critic=True).run_items([episode_job(s) for s in seeds])
    by_seed = dict(zip(seeds, results, strict=True))
    assert "RuntimeError: the sim blew up" in by_seed[13].value.error and by_seed[13].value.episode.meta.length == 3
    assert isinstance(by_seed[14].error, RuntimeError) and "the reset of seed 14 failed" in str(by_seed[14].error)
    assert np.isfinite(by_seed[8].value.episode.steps["value"][0])  # the critic's value, through its own row
    alone = _reach_slots(1, critic=True)
    for seed in seeds:
        if seed not in (13, 14):
            same_episode(by_seed[seed].value.episode, alone.run_episode(seed).episode, same_capsule=False)


def test_a_slot_host_needs_each_slot_on_its_own_row():
    rows = LoopRows([GreedyPolicy() for _ in range(2)])
    hosts = [RolloutHost(env=ReachEnv(), policy=rows.slot(0), config=HostConfig(n_exec=3)) for _ in range(2)]
    with pytest.raises(ValueError, match=r"slot 1's host must act through row 1"):
        SlotHost(hosts, rows)
    with pytest.raises(ValueError, match=r"slots and env_threads must be >= 1, got 0, 1"):
        RunSpec(slots=0)


def test_slots_stepped_on_threads_play_the_same_episodes(spec, slots):
    """`env_threads`: the slots step in parallel between batched calls; each item plays what it plays on one thread."""
    threaded = build_slots(dataclasses.replace(spec, env_threads=3))
    try:
        seeds = list(range(60, 72))
        mine = threaded.run_items([episode_job(s) for s in seeds])
        theirs = slots.run_items([episode_job(s) for s in seeds])
        assert threaded.env_threads == 3 and [r.error for r in mine] == [None] * len(seeds)
        for a, b in zip(mine, theirs, strict=True):
            same_episode(a.value.episode, b.value.episode, same_capsule=False)
    finally:
        threaded.close()


SHIPPED = "capsule_rollout/checkpoints"


def test_the_shipped_policy_and_critic_play_the_same_episodes_at_any_slot_count():
    """Noise on, the shipped flow policy and critic: the same seeds played by a host of one slot and by hosts of
    2, 4, 8 and 16 slots (two blocks of rows) record identical episodes: actions, states, values, rewards."""
    base = RunSpec(env="tabletop:pick_place", policy=f"{SHIPPED}/policy", critic=f"{SHIPPED}/critic",
                    host=HostConfig(n_exec=4, max_steps=20))
    seeds = [3, 4, 5, 6, 7]
    one = build_host(base)
    try:
        alone = [one.run_episode(s).episode for s in seeds]
    finally:
        one.close()
    assert len({float(np.asarray(e.steps["value"])[0]) for e in alone}) > 1  # the critic reads each state
    for n in (2, 4, 8, 16):
        host = build_slots(dataclasses.replace(base, slots=n))
        try:
            played = host.run_items([episode_job(s) for s in seeds])
        finally:
            host.close()
        assert [r.error for r in played] == [None] * len(seeds)
        for a, r in zip(alone, played):
            same_episode(a, r.value.episode, same_capsule=False)


def test_a_feed_given_work_while_it_plays_fills_the_free_slots_and_ends_when_empty():
    """`Feed`: what an actor holding two calls plays from; the second call's items take the slots the first call's
    last items leave free, and the play ends only when every slot is free and nothing is left."""
    slots = _reach_slots(4)
    feed = Feed()
    first = [(k, episode_job(50 + k)) for k in range(5)]
    assert feed.put(first)
    calls: list[list[int]] = []
    slots.on_call = calls.append
    results = []
    t0 = time.perf_counter()
    try:
        for result in slots.play(feed):
            results.append(result)
            if len(results) == 2:  # the second call arrives while the first's last items play
                assert feed.put([(k, episode_job(50 + k)) for k in range(5, 12)])
    finally:
        slots.on_call = None
    wall = time.perf_counter() - t0
    assert sorted(r.index for r in results) == list(range(12)) and all(r.error is None for r in results)
    assert not feed.put([(99, episode_job(1))])  # the play has ended: the caller starts another
    tallies = slots.rows_filled()
    assert tallies["rows_with_work_left"] == 4 * tallies["calls_with_work_left"]  # full while an item waited
    # each item's share of the rounds it played in: the shares add up to the play's wall time
    assert all(r.busy_s > 0 for r in results) and 0.9 * wall <= sum(r.busy_s for r in results) <= wall
    alone = _reach_slots(1)
    for result in results:  # each item plays what it plays alone
        same_episode(result.value.episode, alone.run_episode(50 + result.index).episode, same_capsule=False)


def test_a_slot_host_attaches_an_observer_to_chosen_slots_and_branches_in_a_slot():
    """`SlotHost.observe` and `SlotHost.branch`: what a user does with slots without reaching into their hosts."""
    import numpy as np

    from capsule_rollout.rollout import BoundaryCapsules, HostConfig, RunSpec, build_slots, episode_job

    slots = build_slots(RunSpec(env="examples.own_env_and_policy:make_env", policy="examples.stateful_policy:make_policy",
                                slots=2, host=HostConfig(n_exec=4)))
    try:
        keeper = BoundaryCapsules((4,))
        slots.observe(keeper, [1])
        played = {r.slot: r.value for r in slots.run_items([episode_job(s) for s in range(2)])}
        assert list(keeper.capsules) == [4]  # slot 1's alone: slot 0's episode was not watched
        episode = played[1].episode
        again = slots.branch(0, keeper.capsules[4], seed=episode.meta.seed)
        assert np.array_equal(again.episode.steps["action"], episode.steps["action"][4:])
        with pytest.raises(IndexError, match="slot 2: this host has slots 0..1"):
            slots.observe(keeper, [2])
    finally:
        slots.close()
