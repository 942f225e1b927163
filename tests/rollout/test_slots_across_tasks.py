"""Slots across tasks: one slot host plays every task of a `suite:*` run, any slot any task, over one policy and
critic (each row carries its own language); an episode is the one its task's own host plays alone, and the calls
stay full while work is left whatever the mix of tasks."""

from __future__ import annotations

import dataclasses

import pytest

from capsule_rollout.rollout.host_factory import RunSpec, build_host, build_slots
from capsule_rollout.rollout.ray_rollout import run_rollouts, summarize_run
from capsule_rollout.rollout.rollout_actor import WorkItem
from capsule_rollout.rollout.rollout_host import HostConfig
from capsule_rollout.rollout.slots.host import ROWS_REPORT, episode_job
from capsule_rollout.tabletop.tasks import FAMILY_NAMES
from tests.policies.tiny import save_tiny_checkpoints
from tests.rollout.test_slots import same_episode


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    policy, critic = save_tiny_checkpoints(tmp_path_factory.mktemp("ckpt"))
    return RunSpec(env="tabletop:*", policy=policy, critic=critic, slots=4, host=HostConfig(n_exec=2, max_steps=12))


def test_any_slot_plays_any_task_and_each_episode_is_its_tasks_own(spec):
    mixed = build_slots(spec, task=FAMILY_NAMES[0])
    jobs = [(family, seed) for seed in (3, 4, 5) for family in FAMILY_NAMES]
    calls: list[list[int]] = []
    mixed.on_call = calls.append
    try:
        results = mixed.run_items([episode_job(seed, task=family) for family, seed in jobs])
        assert [r.error for r in results] == [None] * len(jobs)
        assert [r.value.episode.meta.task for r in results] == [family for family, _ in jobs]
        assert mixed.tasks == sorted(FAMILY_NAMES)
        assert {r.slot for r in results} == set(range(4))
        record = results[-1].value.extra[ROWS_REPORT]
        assert (record["policy_instances"], record["critic_instances"]) == (1, 1)  # one model for every task
        # until the last item began, every call served every slot, whatever task each played
        tallies = mixed.rows_filled()
        assert tallies["calls_with_work_left"] > 0
        assert tallies["rows_with_work_left"] == 4 * tallies["calls_with_work_left"]
        assert all(call == [0, 1, 2, 3] for call in calls[: tallies["calls_with_work_left"]])
        for family in (FAMILY_NAMES[1], FAMILY_NAMES[3]):
            alone = build_host(dataclasses.replace(spec, env=f"tabletop:{family}", slots=1))
            try:
                for result, (task, seed) in zip(results, jobs, strict=True):
                    if task == family:
                        same_episode(result.value.episode, alone.run_episode(seed).episode, same_capsule=False)
            finally:
                alone.close()
        # a second pass restores each seed's initial capsule into whichever slot is free
        again = mixed.run_items([episode_job(seed, task=family) for family, seed in reversed(jobs)])
        assert {r.value.reset_kind for r in again} == {"restore"}
        for result in again:
            same_episode(result.value.episode, results[len(jobs) - 1 - result.index].value.episode)
    finally:
        mixed.close()


def test_an_item_of_a_task_that_cannot_be_made_fails_alone(spec):
    mixed = build_slots(spec, task=FAMILY_NAMES[0])
    try:
        results = mixed.run_items([episode_job(1, task=FAMILY_NAMES[0]), episode_job(1, task="no_such_family"),
                                   episode_job(1, task=FAMILY_NAMES[2])])
        assert results[0].error is None and results[2].error is None
        assert results[1].error is not None and "no_such_family" in str(results[1].error)
    finally:
        mixed.close()
    with pytest.raises(ValueError, match=r"give the task its slots start on"):
        build_slots(spec)


def test_an_actor_keeps_one_slot_host_for_every_task_and_reports_full_rows(spec, tmp_path):
    items = [WorkItem(f"{family}-s{seed}", seed, task=family) for seed in range(6) for family in FAMILY_NAMES]
    reports, stats = run_rollouts(dataclasses.replace(spec, capsule_dir=str(tmp_path / "capsules")), items,
                                  actors=0)
    summary = summarize_run(reports, stats)
    assert summary["episodes"] == len(items) and summary["lost"] == 0
    assert {task: v["episodes"] for task, v in summary["by_task"].items()} == {f: 6 for f in FAMILY_NAMES}
    rows = summary["rows"]
    assert rows["hosts"] == 1 and rows["rows_filled_with_work_left"] == 1.0
    assert 0 < rows["rows_filled"] <= 1
    for family in FAMILY_NAMES:  # every task's initial capsules saved under its own name
        assert len(list((tmp_path / "capsules" / family).glob("*.capsule"))) == 6
