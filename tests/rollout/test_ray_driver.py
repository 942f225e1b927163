"""The Ray driver: work only for placed actors, a fatal CUDA error ends the actor and its episode is re-run; hangs
found per phase and told from slow resets; an episode that cannot be played is lost with its reason, and a run
that cannot go on gives up saying why (the envs and policy that misbehave: `tests.rollout.hang_factories`)."""

import dataclasses

import pytest
import ray

from capsule_rollout.commands.configs import SimRolloutConfig
from capsule_rollout.rollout.deadlines import FLOOR_S, DeadlineSettings
from capsule_rollout.rollout.host_factory import RunSpec
from capsule_rollout.rollout.ray_driver import place_actors
from capsule_rollout.rollout.ray_rollout import RayStart, run_rollouts
from capsule_rollout.rollout.rollout_actor import WorkItem
from capsule_rollout.rollout.rollout_host import HostConfig
from capsule_rollout.stores.zarr_reader import ZarrEpisodeReader
from capsule_rollout.stores.zarr_recorder import ZarrRecorder
from tests.policies.tiny import save_tiny_checkpoints
from tests.rollout import faults

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    policy, critic = save_tiny_checkpoints(tmp_path_factory.mktemp("ckpt"))
    return RunSpec(env="tabletop:pick_place", policy=policy, critic=critic, host=HostConfig(n_exec=2, max_steps=6))


def _items(n):
    return [WorkItem(f"pick_place-s{s:07d}", s) for s in range(1_000_000, 1_000_000 + n)]


def test_no_work_goes_to_an_actor_ray_cannot_place_and_the_run_gives_up_saying_why(spec):
    reports, stats = run_rollouts(spec, _items(2), actors=2, gpus_per_actor=1.0, placement_timeout_s=5, repeats=2)
    assert stats.gave_up.startswith("no rollout actor was placed within 5 s: each asks for 1.0 CPU and 1.0 GPU")
    assert stats.episodes == 0 and stats.lost == 4  # both items and the repeat each would lead to
    assert sorted(r.item.episode_id for r in reports) == ["pick_place-s1000000", "pick_place-s1000000-r1",
                                                          "pick_place-s1000001", "pick_place-s1000001-r1"]
    assert all(r.episode is None and r.error.startswith("not played: the run gave up (no rollout actor") for r in reports)


def test_the_actors_that_fit_do_all_the_work(spec, ray_session):
    cpus = ray_session.cluster_resources()["CPU"]
    reports, stats = run_rollouts(spec, _items(4), actors=2, cpus_per_actor=cpus * 0.6)  # only one fits
    assert stats.actors_placed == 1 and stats.episodes == 4
    assert len({r.actor_pid for r in reports}) == 1
    assert stats.episode_deadline_s >= FLOOR_S  # no timeout given: derived (the actor's later calls: the floor)
    assert all(r.steps == 6 and r.step_limit == 6 and r.busy_s > 0 for r in reports)  # what it is derived from


def test_ray_started_on_a_thread_of_its_own_joins_a_running_session_and_leaves_it_running(ray_session):
    starting = RayStart()
    assert starting.wait() == "existing"
    starting.stop()
    assert ray_session.is_initialized()


def test_a_fatal_cuda_error_restarts_the_actor_and_reruns_the_episode(spec, tmp_path):
    import dataclasses

    victim = "pick_place-s1000001"
    marker = tmp_path / "cuda"
    faulty = dataclasses.replace(spec, observers=(faults.observer_spec(victim, 3, marker, "cuda_error"),))
    with ZarrRecorder(tmp_path / "e.zarr") as recorder:
        reports, stats = run_rollouts(faulty, _items(3), actors=1, recorder=recorder)
    assert marker.exists() and stats.actor_failures == 1 and stats.resubmitted == 1
    by_id = {r.item.episode_id: r for r in reports}
    assert by_id[victim].error == "" and by_id[victim].episode.meta.length == 6  # re-run on a fresh process
    assert len({r.actor_pid for r in reports}) == 2  # the process that saw the error is gone
    assert sorted(ZarrEpisodeReader(tmp_path / "e.zarr").episode_ids) == sorted(it.episode_id for it in _items(3))


def test_a_hung_call_of_several_episodes_is_killed_at_its_deadline_and_all_of_them_rerun(spec, tmp_path):
    """Two episodes per call: the call's deadline is two episode deadlines; the actor hangs in the first episode
    of its call, is killed at that deadline, and both episodes of the call are handed out again."""
    import dataclasses

    victim = "pick_place-s1000000"
    marker = tmp_path / "hung"
    hanging = dataclasses.replace(spec, observers=(faults.observer_spec(victim, 3, marker, "hang"),))
    with ZarrRecorder(tmp_path / "e.zarr") as recorder:
        reports, stats = run_rollouts(hanging, _items(4), actors=1, recorder=recorder, episodes_per_call=2,
                                      episode_timeout_s=10)
    assert marker.read_text() == "hang\n" and stats.timeouts == 1 and stats.actor_failures == 1
    assert stats.episode_deadline_s == 10  # a number: that deadline per episode
    assert stats.resubmitted == 2 and stats.episodes == 4  # the victim and the other episode of its call
    assert sorted(r.item.episode_id for r in reports) == [it.episode_id for it in _items(4)]
    assert sorted(ZarrEpisodeReader(tmp_path / "e.zarr").episode_ids) == [it.episode_id for it in _items(4)]
    with pytest.raises(ValueError, match="episodes_per_call must be >= 1"):
        run_rollouts(spec, _items(1), actors=1, episodes_per_call=0)


def test_a_zero_timeout_turns_deadlines_off_with_a_one_line_warning(spec, capsys):
    reports, stats = run_rollouts(spec, _items(2), actors=1, episode_timeout_s=0)
    assert stats.episodes == 2 and stats.episode_deadline_s is None
    warnings = [line for line in capsys.readouterr().err.splitlines() if "deadlines are off" in line]
    assert warnings == ["warning: episode deadlines are off (episode_timeout_s 0): an actor that hangs stalls the run"]
    for bad in (-1, float("inf"), float("nan")):  # no deadline is 0, not infinity
        with pytest.raises(ValueError, match=r"episode_timeout_s must be a finite number >= 0 \(0: no deadline\)"):
            run_rollouts(spec, _items(1), actors=1, episode_timeout_s=bad)
    assert SimRolloutConfig(episode_timeout_s=0).episode_timeout_s == 0
    with pytest.raises(ValueError, match="--episode_timeout_s must be >= 0"):
        SimRolloutConfig(episode_timeout_s=-5)


def test_an_actor_of_slots_that_dies_in_slot_3_has_its_call_rerun_and_every_episode_lands_once(spec, tmp_path):
    """4 slots, two calls of 4 episodes in flight: the process exits in the episode playing in slot 3; every
    episode of the call that held it is handed out again once (and of the other call too when the process had
    taken it: Ray hands a call not yet delivered to the restarted process), each is recorded once, and each is the
    episode a run without the fault plays."""
    import dataclasses

    import numpy as np

    slotted = dataclasses.replace(spec, slots=4)
    reference, _ = run_rollouts(slotted, _items(8), actors=0)
    victim, marker = "pick_place-s1000003", tmp_path / "exit"  # the fourth item: slot 3 of the first round
    faulty = dataclasses.replace(slotted, observers=(faults.observer_spec(victim, 3, marker, "exit"),))
    with ZarrRecorder(tmp_path / "e.zarr") as recorder:
        reports, stats = run_rollouts(faulty, _items(8), actors=1, recorder=recorder)
    assert marker.exists() and stats.actor_failures == 1 and stats.resubmitted in (4, 8) and stats.episodes == 8
    assert sorted(ZarrEpisodeReader(tmp_path / "e.zarr").episode_ids) == sorted(it.episode_id for it in _items(8))
    want = {r.item.episode_id: r.episode for r in reference}
    for report in reports:
        for key in ("action", "value", "state"):
            np.testing.assert_array_equal(report.episode.steps[key], want[report.item.episode_id].steps[key])


def _factory_spec(env: str, policy: str = "tests.envs.user_factories:make_noise_policy", **host) -> RunSpec:
    """A host of one of `tests.rollout.hang_factories`' envs (a user's factory, captured with nothing declared)."""
    return RunSpec(env=f"tests.rollout.hang_factories:{env}", policy=policy, host=HostConfig(max_steps=12, **host))


def _seeds(env: str, n: int) -> list[WorkItem]:
    return [WorkItem(f"{env}-s{s:07d}", s) for s in range(1_000_000, 1_000_000 + n)]


QUICK = DeadlineSettings(floor_s=1.0, first_call_s=20.0)  # the defaults scaled down, so hangs are found in seconds


def test_an_episode_that_hangs_in_a_step_every_time_is_lost_at_its_second_hang_and_the_run_goes_on(tmp_path):
    """The call of three items hangs in the second (env step 3, every time): the first is recorded, the third
    handed out again without counting a try; the second hangs again at the same place and is lost, saying where;
    nothing is raised. The hang is found at the step's learned deadline (the floor), not the allowance."""
    items = _seeds("hangs_in_step", 3)
    with ZarrRecorder(tmp_path / "e.zarr") as recorder:
        reports, stats = run_rollouts(_factory_spec("hangs_in_step"), items, actors=1, recorder=recorder,
                                      episodes_per_call=3, deadlines=QUICK)
    victim = items[1].episode_id
    assert stats.hangs == 2 and stats.timeouts == 2 and stats.lost == 1 and not stats.gave_up
    assert stats.resubmitted == 3  # the victim once; the third item twice, unplayed behind it
    [lost] = [r for r in reports if r.episode is None]
    assert lost.item.episode_id == victim
    assert lost.error.startswith("hung: env step 3 ran ") and "past its 1.0 s deadline" in lost.error
    assert "it hung at the same place on an earlier try" in lost.error
    assert sorted(ZarrEpisodeReader(tmp_path / "e.zarr").episode_ids) == [items[0].episode_id, items[2].episode_id]
    assert stats.phase_deadlines["step"]["deadline_s"] == 1.0  # learned: 3 x well under a second, the floor


def test_an_actor_of_slots_watches_each_call_with_the_deadlines_the_call_brings():
    """The phase deadlines come with each call. They were sent as a call of their own before it, and an actor of
    slots takes two calls at once in no set order: a call that began before them was never watched, and its hang
    held the actor until the driver's deadline of the whole call (40 s here; one run in eight, on a loaded machine).
    Two calls at once on a fresh actor, the hanging item in the one without deadlines: both come back, the hang
    found at the step's deadline."""
    spec = dataclasses.replace(_factory_spec("hangs_in_step"), slots=2)
    [actor] = place_actors(spec, 1)
    try:
        assert isinstance(ray.get(actor.ready.remote(), timeout=120), int)
        plain, hanging = _seeds("hangs_in_step", 2)
        unwatched = actor.run_batch.remote([hanging])  # may begin before the other call's deadlines arrive
        watched = actor.run_batch.remote([plain], (QUICK, {}))
        [hung] = ray.get(unwatched, timeout=60)
        [other] = ray.get(watched, timeout=60)
    finally:
        ray.kill(actor)
    assert hung.hang is not None and hung.hang.place == ("step", 3)
    assert other.episode is not None or other.unplayed


def test_an_episode_that_hangs_in_the_policy_is_told_by_its_chunk(tmp_path):
    items = _seeds("marked", 2)
    spec = _factory_spec("marked", policy="tests.rollout.hang_factories:hangs_in_infer")
    reports, stats = run_rollouts(spec, items, actors=1, deadlines=QUICK)
    [lost] = [r for r in reports if r.episode is None]
    assert lost.item.episode_id == items[1].episode_id and stats.hangs == 2 and stats.episodes == 1
    assert lost.error.startswith("hung: the policy's chunk at step 8 ran ")


def test_slow_cold_resets_are_never_taken_for_hangs_after_restores(tmp_path):
    """Every cold reset takes 2 s (a generated scene's), a restore milliseconds; the floor is 1 s. Each seed's
    second rollout is a restore, so each later cold reset comes after a restore: its deadline is the cold
    reset's own, learned from the first (an actor's first call included), and none is killed."""
    from tests.rollout.hang_factories import COLD_RESET_S

    reports, stats = run_rollouts(_factory_spec("slow_cold_reset"), _seeds("slow_cold_reset", 3), actors=1,
                                  repeats=2, deadlines=QUICK)
    assert stats.timeouts == 0 and stats.hangs == 0 and stats.episodes == 6
    assert [r.reset_kind for r in reports] == ["cold", "restore"] * 3
    cold, restore = stats.phase_deadlines["cold_reset"], stats.phase_deadlines["restore"]
    assert cold["longest_first_s"] >= COLD_RESET_S and cold["deadline_s"] >= 3 * COLD_RESET_S
    assert restore["deadline_s"] == 1.0


def test_an_actor_that_keeps_crashing_ends_the_run_with_every_item_left_reported_lost(tmp_path):
    """The second episode's step 3 ends the process, every time; with --max_restarts 1 the one actor is gone
    after its second crash: the run gives up, saying why, and reports the rest lost (nothing raised)."""
    items = _seeds("exits_in_step", 3)
    reports, stats = run_rollouts(_factory_spec("exits_in_step"), items, actors=1, max_restarts=1, deadlines=QUICK,
                                  repeats=2)
    assert stats.gave_up.startswith("every rollout actor crashed more than 1 times (--max_restarts); the last: its "
                                    "actor died: ")
    assert stats.episodes == 2 and stats.actor_failures == 2  # the first seed and its repeat
    lost = sorted(r.item.episode_id for r in reports if r.episode is None)
    assert lost == sorted(it.episode_id + suffix for it in items[1:] for suffix in ("", "-r1"))
    assert all("the run gave up (every rollout actor crashed" in r.error for r in reports if r.episode is None)


def test_a_hang_in_one_slot_charges_that_slot_s_episode_and_re_runs_the_others(tmp_path):
    """2 slots, one call of 4 items: the slot playing the hanging episode stops the call; the other slot's episode
    (in progress, behind the same round) and the items not started are handed out again without counting."""
    items = _seeds("hangs_in_step", 4)
    spec = dataclasses.replace(_factory_spec("hangs_in_step"), slots=2)
    reports, stats = run_rollouts(spec, items, actors=1, deadlines=QUICK)
    [lost] = [r for r in reports if r.episode is None]
    assert lost.item.episode_id == items[1].episode_id and lost.error.startswith("hung: env step 3 ran ")
    assert stats.hangs == 2 and stats.lost == 1 and stats.episodes == 3
